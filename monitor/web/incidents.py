"""Console API for incidents (issue 16): read with no token, notes and close with it.

Mounted by `create_app` when the station view offers an `incident_tracker` (the
daemon's). Notes and closes go to their own tables of the incident store, so they
never race the tracker's updates of the figures.
"""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo

from fastapi import FastAPI, HTTPException, Query
from pydantic import AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field

from monitor.incidents.due import check_time_limit, local_midnight, overdue
from monitor.incidents.model import Note, NoteKind, Status
from monitor.incidents.report import incident_json
from monitor.incidents.tracker import IncidentTracker
from monitor.web.once import KEY_REFUSED, WriteKeyed, once
from monitor.web.view import StationView
from monitor.writeonce import WriteKey

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: KEY_REFUSED,
    401: {"description": "missing or wrong bearer token"},
    403: {"description": "no console.token configured: writes are disabled"},
    404: {"description": "no such incident"},
    409: {"description": "the incident's case is closed already"},
}


def _date_only(value: object) -> object:
    """A text is a date only as YYYY-MM-DD: `2026-06-19T00:00:00` without its zone is no date."""
    if isinstance(value, str) and not re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
        raise ValueError("a date is YYYY-MM-DD; a time needs its zone (Z or +hh:mm)")
    return value


# `monitor incidents note --due DATE`'s date: due by the end of that day on the station's clock
LocalDate = Annotated[date, BeforeValidator(_date_only)]


class NoteRequest(BaseModel):
    # stripped, then at least a character, as `monitor incidents note` takes them: a name of
    # spaces was a note by nobody on the Superintendent's record
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    by: str = Field(min_length=1, max_length=100, description="who writes the note (kept with the time)")
    text: str = Field(min_length=1, max_length=4000)
    kind: Literal["note", "statement", "notice"] = Field(
        "note", description="statement: the §139-15 written statement was received; notice: a §139-21 notice"
    )
    due: AwareDatetime | LocalDate | None = Field(
        None,
        description="notice only: its time limit for correction, a time with its zone or a date"
        " (YYYY-MM-DD: the end of that day on the station's clock)",
    )


class CloseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    by: str = Field(min_length=1, max_length=100)
    reason: str = Field(min_length=1, max_length=2000)


def add_incident_routes(
    app: FastAPI, view: StationView, tracker: IncidentTracker, token_required: Any
) -> None:
    """`token_required` is the app's `Depends(...)` guard for writes."""
    store, zone = tracker.store, tracker.zone

    def get(iid: str) -> Any:
        inc = store.get(iid)
        if inc is None:
            raise HTTPException(404, f"no incident {iid} on this station")
        return inc

    @app.get("/api/incidents", response_model=list[dict[str, Any]])
    async def incidents(
        status: Annotated[Literal["open", "ended", "closed", "overdue"] | None, Query()] = None,
    ) -> list[dict[str, object]]:
        now = view.now()
        found = store.incidents()
        if status == "overdue":
            keys = {d.incident for d in overdue(found, now)}
            found = [i for i in found if i.id in keys]
        elif status is not None:
            found = [i for i in found if i.status is Status(status)]
        return [incident_json(i, zone, now) for i in found]

    @app.get("/api/incidents/overdue", response_model=list[dict[str, Any]])
    async def overdue_items() -> list[dict[str, object]]:
        """What is overdue, oldest first (the console's banner), each with its incident's
        "evidence incomplete from T: reason" mark (null when whole): the console shows it
        there, so nobody writes a report from evidence that is not all there unawares."""
        found = store.incidents()
        notes = {i.id: i.evidence_note for i in found}
        return [
            {**d.to_json(zone), "evidence_incomplete": notes.get(d.incident)}
            for d in overdue(found, view.now())
        ]

    def answer(iid: str) -> dict[str, object]:
        """The incident as it stands: GET's answer, and a write's (kept for its repeat)."""
        return incident_json(get(iid), zone, view.now())

    @app.get("/api/incidents/{iid}", response_model=dict[str, Any], responses={404: _ERRORS[404]})
    async def incident(iid: str) -> dict[str, object]:
        return answer(iid)

    @app.post("/api/incidents/{iid}/notes", response_model=dict[str, Any], responses=_ERRORS)
    async def note(iid: str, body: NoteRequest, key: WriteKeyed, _: None = token_required) -> Any:
        inc = get(iid)
        kind = NoteKind(body.kind)
        if body.due is not None and kind is not NoteKind.NOTICE:
            raise HTTPException(422, "due goes with kind notice (its time limit for correction)")
        due = None
        if body.due is not None:
            try:
                due = check_time_limit(_ts(body.due, zone), inc.start, zone)
            except ValueError as exc:
                raise HTTPException(422, str(exc)) from None
        note = Note(time=view.now(), by=body.by, text=body.text, kind=kind, due=due)

        def write(k: WriteKey | None) -> dict[str, object]:
            store.add_note(iid, note, key=k)
            return answer(iid)

        return once(store.keys, key, write, lambda: answer(iid))

    @app.post("/api/incidents/{iid}/close", response_model=dict[str, Any], responses=_ERRORS)
    async def close(iid: str, body: CloseRequest, key: WriteKeyed, _: None = token_required) -> Any:
        get(iid)

        def write(k: WriteKey | None) -> dict[str, object]:
            if not store.close_case(iid, view.now(), body.by, body.reason, key=k):
                raise HTTPException(409, f"incident {iid} is closed already")
            return answer(iid)

        return once(store.keys, key, write, lambda: answer(iid))


def _ts(when: datetime | date, zone: ZoneInfo) -> float:
    """An instant; a date is the end of that day in `zone` (as the CLI's `parse_due`)."""
    if isinstance(when, datetime):
        return when.timestamp()
    try:
        return local_midnight(when + timedelta(days=1), zone)
    except OverflowError:
        raise HTTPException(422, f"due: {when} is the last day of the calendar") from None
