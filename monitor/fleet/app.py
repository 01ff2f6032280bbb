"""The fleet page and its JSON API (FastAPI).

    GET  /                 the fleet page (self-contained HTML, refreshes itself)
    GET  /api/stations     the fleet as JSON (`FleetView.snapshot`)
    POST /api/ack          {"station", "sensor", "rule", "user", "password", "note"?}

Reads need nothing: the page shows what every broker user may read anyway. An
acknowledgement carries the person's own broker credentials and goes out under
their name, so the broker's ACL decides who may command which station and the
station journals who did it; this process keeps no password and logs none.
Bodies over `MAX_BODY` are refused before they are read.
"""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from monitor.fleet.page import PAGE
from monitor.fleet.service import FleetService
from monitor.model import Rule

MAX_BODY = 4096
_STATUS = {"applied": 200, "refused": 409, "not_authorized": 403, "no_reply": 504, "unreachable": 502}
_HEADERS = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline';"
    " frame-ancestors 'none'",
    "Cache-Control": "no-cache",
}


def create_fleet_app(service: FleetService) -> FastAPI:
    app = FastAPI(title="station-monitor fleet", docs_url=None, redoc_url=None, openapi_url=None)
    fleet = service.config.fleet
    hosts = {"localhost", "127.0.0.1", "[::1]", fleet.host.lower(), *(h.lower() for h in fleet.allowed_hosts)}

    @app.middleware("http")
    async def headers(request: Request, call_next: Any) -> Response:
        # A Host this view is not served as is a DNS-rebinding page reading it from a
        # browser on the operator's machine: refuse it before any route runs.
        host = request.headers.get("host", "").lower()
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if name not in hosts:
            response: Response = JSONResponse({"ok": False, "error": "unknown Host"}, status_code=421)
        else:
            response = await call_next(request)
        response.headers.update(_HEADERS)
        return response

    @app.get("/", response_class=HTMLResponse)
    async def page() -> HTMLResponse:
        return HTMLResponse(PAGE)

    @app.get("/api/stations")
    async def stations() -> JSONResponse:
        return JSONResponse(service.snapshot(time.time()))

    @app.post("/api/ack")
    async def ack(request: Request) -> JSONResponse:
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return JSONResponse({"ok": False, "error": "send application/json"}, status_code=415)
        body = await _read_body(request)
        if isinstance(body, JSONResponse):
            return body
        fields = _ack_fields(body)
        if isinstance(fields, str):
            return JSONResponse({"ok": False, "error": fields}, status_code=422)
        station, sensor, rule, user, password, note = fields
        outcome = await service.acknowledge(station, sensor, rule, user, password, note)
        return JSONResponse(
            {"ok": outcome.status == "applied", "status": outcome.status, "detail": outcome.detail},
            status_code=_STATUS.get(outcome.status, 500),
        )

    return app


async def _read_body(request: Request) -> Any:
    """The JSON body, or a 413/422 response; never more than `MAX_BODY` bytes read."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY):
        return JSONResponse({"ok": False, "error": f"body over {MAX_BODY} bytes"}, status_code=413)
    data = b""
    async for chunk in request.stream():
        data += chunk
        if len(data) > MAX_BODY:
            return JSONResponse({"ok": False, "error": f"body over {MAX_BODY} bytes"}, status_code=413)
    try:
        return json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return JSONResponse({"ok": False, "error": "body is not JSON"}, status_code=422)


def _ack_fields(body: Any) -> tuple[str, str, Rule, str, str, str | None] | str:
    if not isinstance(body, dict):
        return "body must be a JSON object"
    text: dict[str, str] = {}
    for key in ("station", "sensor", "rule", "user", "password"):
        value = body.get(key)
        if not isinstance(value, str) or not value or len(value) > 200:
            return f"{key} is required (text)"
        text[key] = value
    for key in ("station", "user"):
        if any(c in text[key] for c in "/+#"):
            return f"{key} may not contain / + #"
    if text["rule"] not in {r.value for r in Rule}:
        return f"rule must be one of {', '.join(r.value for r in Rule)}"
    note = body.get("note")
    if note is not None and (not isinstance(note, str) or len(note) > 500):
        return "note must be text of at most 500 characters"
    return text["station"], text["sensor"], Rule(text["rule"]), text["user"], text["password"], note
