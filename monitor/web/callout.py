"""Callout routes: the acknowledge link a page carries, and the escalation state for the console.

The link is its own credential (signed, single use, expiring; see
`monitor.callout.message`), so it needs no console token. Opening it (GET) only shows
what it would acknowledge: mail scanners and chat previews fetch links by themselves,
and must not acknowledge an alarm nobody has seen. The button on that page (POST) does it.
"""

from __future__ import annotations

import html
from typing import Annotated, Any

from fastapi import FastAPI
from fastapi import Path as PathParam
from fastapi.responses import HTMLResponse

from monitor.callout import Callout, Heartbeat, LinkError
from monitor.errors import AlarmError, StateError

_HEADERS = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer", "X-Robots-Tag": "noindex"}
Token = Annotated[str, PathParam(min_length=1, max_length=200)]


def _page(title: str, body: str, status: int = 200) -> HTMLResponse:
    text = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{html.escape(title)}</title></head><body style='font-family:sans-serif;max-width:36em'>"
        f"<h1>{html.escape(title)}</h1>{body}</body></html>"
    )
    return HTMLResponse(text, status_code=status, headers=_HEADERS)


def add_callout_routes(app: FastAPI, callout: Callout | None, heartbeat: Heartbeat | None) -> None:
    @app.get("/api/callout", response_model=dict[str, Any])
    async def callout_state() -> object:
        """Escalations (who was told when, who is next), who is on call now, the heartbeat."""
        out: dict[str, object] = {"enabled": callout is not None}
        if callout is not None:
            out.update(callout.status())
        out["heartbeat"] = None if heartbeat is None else heartbeat.stats()
        return out

    if callout is None:
        return

    @app.get("/callout/ack/{token}", include_in_schema=False)
    async def ack_page(token: Token) -> HTMLResponse:
        try:
            esc, person = callout.check_link(token)
        except LinkError as exc:
            return _page("Link not usable", f"<p>{html.escape(str(exc))}</p>", 410)
        what = "every alarm of the flood" if esc.kind == "flood" else f"{esc.sensor} {esc.rule}"
        name = callout.notify.people[person].name if person in callout.notify.people else person
        body = (
            f"<p>Station {html.escape(callout.station)}: acknowledge <b>{html.escape(what)}</b> "
            f"as {html.escape(name)}?</p>"
            f"<form method='post'><button type='submit' style='font-size:1.5em'>Acknowledge</button></form>"
        )
        return _page("Acknowledge alarm", body)

    @app.post("/callout/ack/{token}", include_in_schema=False)
    async def ack(token: Token) -> HTMLResponse:
        try:
            done = callout.acknowledge_link(token)
        except LinkError as exc:
            return _page("Link not usable", f"<p>{html.escape(str(exc))}</p>", 410)
        except (AlarmError, StateError) as exc:
            return _page("Not acknowledged", f"<p>{html.escape(str(exc))}</p>", 409)
        if not done:
            return _page("Nothing to acknowledge", "<p>The alarm was acknowledged or cleared already.</p>")
        items = "".join(f"<li>{html.escape(a.sensor)} {html.escape(str(a.rule))}</li>" for a in done)
        who = html.escape(done[0].acked_by or "")
        return _page(
            "Acknowledged", f"<p>Acknowledged by {who}; the callout has stopped.</p><ul>{items}</ul>"
        )
