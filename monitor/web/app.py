"""The operator console: HTTP API, server-sent events and the page, on FastAPI.

FastAPI because the routes are typed (pydantic models, the same library as the
config) and it serves the OpenAPI document from them, which schemathesis fuzzes
in the tests. Reads are open to whoever can reach the port (127.0.0.1 by
default); writes need `Authorization: Bearer <console.token>`.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from pydantic import SecretStr

from monitor import __version__
from monitor.config import Console
from monitor.errors import AlarmError, StateError
from monitor.health import attention
from monitor.model import Alarm, Rule, iso
from monitor.web.events import ConsoleFeed
from monitor.web.guard import WRITES_DISABLED, Guard
from monitor.web.meters import add_meter_routes
from monitor.web.models import (
    AckRequest,
    AlarmOut,
    EntryOut,
    Problem,
    RemoveRequest,
    ReturnRequest,
    SensorOut,
    SeriesOut,
    ShelveRequest,
    StationOut,
    finite,
    jsonable,
)
from monitor.web.once import KEY_REFUSED, WriteKeyed, once
from monitor.web.view import SensorReading, StationView
from monitor.writeonce import WriteKey

log = logging.getLogger(__name__)
STATIC = Path(__file__).resolve().parent / "static"
_bearer = HTTPBearer(auto_error=False, description="console.token from the station config")
_WRITE_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "missing or wrong bearer token"},
    403: {"model": Problem, "description": "no console.token configured: writes are disabled"},
    400: {"model": Problem, **KEY_REFUSED},
    404: {"model": Problem, "description": "no such alarm"},
    409: {"model": Problem, "description": "the alarm's state does not allow this action"},
    503: {"model": Problem, "description": "the alarm journal could not record the action"},
}


def create_app(view: StationView, console: Console, refresh: float = 2.0) -> FastAPI:
    """The console app for one station; `refresh` is how often live sensor values are pushed."""
    app = FastAPI(
        title=f"station-monitor console: {view.station_id}",
        version=__version__,
        description="Alarms (ISA-18.2), sensors, journal and health of one pumping station.",
        docs_url=None,  # Swagger UI and ReDoc load from a CDN; the gateway has no internet
        redoc_url=None,
    )
    feed = ConsoleFeed(limit=console.max_live_clients)
    app.state.feed = feed
    # Host, token and body size before any route; the callout's acknowledge link is its own
    # credential and arrives with the host of `notify.link_base`.
    link_base = getattr(getattr(getattr(view, "config", None), "notify", None), "link_base", None)
    app.add_middleware(
        Guard,
        console=console,
        extra_hosts=(urlsplit(link_base).netloc,) if link_base else (),
        open_writes=("/callout/ack/",),
    )
    view.alarms.listen(feed.on_transition)
    token = console.token

    def authorised(creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
        check_token(token, creds)

    token_required = Depends(authorised)

    @app.exception_handler(RequestValidationError)
    async def _refused_body(request: Request, exc: RequestValidationError) -> Response:
        # FastAPI's own 422, but with ASCII escapes and strict numbers: it echoes the input,
        # and a JSON string holding an unpaired surrogate ("\ud800", refused as
        # string_unicode) cannot be written as UTF-8, nor NaN (Python's reader takes it) as
        # strict JSON: the refusal itself was a 500
        detail = jsonable(jsonable_encoder(exc.errors()))
        body = json.dumps({"detail": detail}, ensure_ascii=True, allow_nan=False)
        return Response(body, status_code=422, media_type="application/json")

    @app.exception_handler(AlarmError)
    async def _alarm_error(request: Request, exc: AlarmError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    @app.exception_handler(StateError)
    async def _journal_error(request: Request, exc: StateError) -> JSONResponse:
        # The journal could not record the action, so it did not happen; say so plainly.
        log.error("console action refused: %s", exc)
        return JSONResponse({"detail": f"not done: {exc}"}, status_code=503)

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/api/station", response_model=StationOut)
    async def station() -> StationOut:
        return StationOut(
            id=view.station_id,
            name=view.station_name,
            time=iso(view.now()),
            writes_enabled=token is not None,
            wet_well=getattr(getattr(view, "live_station", None), "tracker", None) is not None,
        )

    @app.get("/api/alarms", response_model=list[AlarmOut])
    async def alarms(
        all: Annotated[bool, Query(description="include alarms in the normal state")] = False,
    ) -> list[dict[str, object]]:
        found = view.alarms.alarms() if all else view.alarms.active()
        return [a.to_json() for a in found]

    def known(sensor: str, rule: Rule) -> None:
        if view.alarms.get(sensor, rule) is None:
            raise HTTPException(404, f"no alarm {sensor}/{rule} on this station")

    def alarm_once(
        sensor: str, rule: Rule, key: WriteKey | None, write: Callable[[WriteKey | None], Alarm]
    ) -> Any:
        """`write` once per request id (`once`); a repeat is answered, not done again."""
        known(sensor, rule)

        def recorded() -> dict[str, object]:
            alarm = view.alarms.get(sensor, rule)
            assert alarm is not None  # `known`: alarms are never forgotten while the daemon runs
            return alarm.to_json()

        return once(view.alarms.keys, key, lambda k: write(k).to_json(), recorded, AlarmOut)

    @app.post("/api/alarms/{sensor}/{rule}/ack", response_model=AlarmOut, responses=_WRITE_ERRORS)
    async def acknowledge(
        sensor: str, rule: Rule, body: AckRequest, key: WriteKeyed, _: None = token_required
    ) -> Any:
        return alarm_once(
            sensor, rule, key, lambda k: view.alarms.acknowledge(sensor, rule, body.by, body.note, key=k)
        )

    @app.post("/api/alarms/{sensor}/{rule}/shelve", response_model=AlarmOut, responses=_WRITE_ERRORS)
    async def shelve(
        sensor: str, rule: Rule, body: ShelveRequest, key: WriteKeyed, _: None = token_required
    ) -> Any:
        until = None if body.until is None else body.until.timestamp()
        duration = None if body.minutes is None else body.minutes * 60
        return alarm_once(
            sensor,
            rule,
            key,
            lambda k: view.alarms.shelve(
                sensor, rule, body.by, body.reason, until=until, duration=duration, key=k
            ),
        )

    @app.post("/api/alarms/{sensor}/{rule}/unshelve", response_model=AlarmOut, responses=_WRITE_ERRORS)
    async def unshelve(
        sensor: str, rule: Rule, body: ReturnRequest, key: WriteKeyed, _: None = token_required
    ) -> Any:
        return alarm_once(sensor, rule, key, lambda k: view.alarms.unshelve(sensor, rule, body.by, key=k))

    @app.post("/api/alarms/{sensor}/{rule}/remove", response_model=AlarmOut, responses=_WRITE_ERRORS)
    async def remove(
        sensor: str, rule: Rule, body: RemoveRequest, key: WriteKeyed, _: None = token_required
    ) -> Any:
        return alarm_once(
            sensor,
            rule,
            key,
            lambda k: view.alarms.remove_from_service(sensor, rule, body.by, body.reason, key=k),
        )

    @app.post("/api/alarms/{sensor}/{rule}/return", response_model=AlarmOut, responses=_WRITE_ERRORS)
    async def return_(
        sensor: str, rule: Rule, body: ReturnRequest, key: WriteKeyed, _: None = token_required
    ) -> Any:
        return alarm_once(
            sensor, rule, key, lambda k: view.alarms.return_to_service(sensor, rule, body.by, key=k)
        )

    tracker = getattr(view, "incidents", None)  # the daemon's IncidentTracker (issue 16)
    if tracker is not None:
        from monitor.web.incidents import add_incident_routes

        add_incident_routes(app, view, tracker, token_required)

    live_station = getattr(view, "live_station", None)  # the daemon's LiveStation (pumps, wet well)
    station_tracker = getattr(live_station, "tracker", None)
    if station_tracker is not None:
        from monitor.web.wetwell import add_station_routes

        add_station_routes(app, view, live_station.config, station_tracker, STATIC)  # type: ignore[union-attr]

    meter_book = getattr(view, "meter_book", None)  # the daemon's MeterBook, when it has meters
    if meter_book is not None:
        # Transitions a replacement causes go through the daemon's pipeline (`submit`);
        # a view without one (tests of the console alone) applies them directly.
        submit = getattr(view, "submit", None) or (lambda cs: [view.alarms.apply(c) for c in cs])
        add_meter_routes(app, meter_book, submit, token_required)

    @app.get("/api/journal", response_model=list[EntryOut])
    async def journal(
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        sensor: Annotated[str | None, Query(max_length=200)] = None,
    ) -> list[dict[str, object]]:
        entries = view.alarms.journal.entries(sensor=sensor, limit=limit, newest_first=True)
        return [e.to_json() for e in entries]

    @app.get("/api/sensors", response_model=list[SensorOut])
    async def sensors() -> list[dict[str, object]]:
        return [_reading(r) for r in view.sensors()]

    @app.get(
        "/api/sensors/{sensor}/series",
        response_model=SeriesOut,
        responses={404: {"model": Problem, "description": "no such sensor"}},
    )
    async def series(
        sensor: str,
        hours: Annotated[float, Query(gt=0, le=24 * 31)] = 24.0,
        points: Annotated[int, Query(ge=2, le=2000)] = 144,
    ) -> dict[str, object]:
        units = {r.id: r.unit for r in view.sensors()}
        if sensor not in units:
            raise HTTPException(404, f"no sensor {sensor} on this station")
        until = view.now()
        since = until - hours * 3600
        buckets = downsample(view.series(sensor, since, until), since, until, points)
        return {
            "sensor": sensor,
            "unit": units[sensor],
            "since": iso(since),
            "until": iso(until),
            "points": [(iso(t), v) for t, v in buckets],
        }

    @app.get("/api/health", response_model=dict[str, Any])
    async def health() -> object:
        return _health(view, feed)

    def snapshot() -> dict[str, Any]:
        return {
            "time": iso(view.now()),
            "sensors": [_reading(r) for r in view.sensors()],
            "health": _health(view, feed),
        }

    @app.get("/api/events", include_in_schema=False, response_model=None)
    async def events() -> StreamingResponse | JSONResponse:
        """text/event-stream: `alarm` on each transition, `sensors` once, then `changes`."""
        queue = feed.open()
        if queue is None:
            return JSONResponse(
                {"detail": f"too many live-update clients (limit {feed.limit}); try again later"},
                status_code=503,
                headers={"Retry-After": "30"},
            )
        return StreamingResponse(
            feed.stream(queue, snapshot, refresh),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    return app


def check_token(token: SecretStr | None, creds: HTTPAuthorizationCredentials | None) -> None:
    """403 when writes are not configured at all, 401 for a missing or wrong token."""
    if token is None:
        raise HTTPException(403, WRITES_DISABLED)
    given = b"" if creds is None else creds.credentials.encode("utf-8", "replace")
    if creds is None or not hmac.compare_digest(given, token.get_secret_value().encode("utf-8")):
        raise HTTPException(
            401, "a valid bearer token is required for this action", headers={"WWW-Authenticate": "Bearer"}
        )


def downsample(
    readings: Iterable[tuple[float, float]], since: float, until: float, points: int
) -> list[tuple[float, float]]:
    """Bucket means over [since, until): a 24 h sparkline needs ~150 points, not 86,400."""
    step = (until - since) / points
    sums = [0.0] * points
    counts = [0] * points
    for t, v in readings:
        if not (since <= t < until) or finite(v) is None:
            continue
        i = min(int((t - since) / step), points - 1)
        sums[i] += v
        counts[i] += 1
    return [(since + (i + 0.5) * step, sums[i] / counts[i]) for i in range(points) if counts[i]]


def _reading(r: SensorReading) -> dict[str, object]:
    return {
        "id": r.id,
        "name": r.name,
        "kind": r.kind,
        "unit": r.unit,
        "value": finite(r.value),
        "quality": r.quality,
        "time": None if r.time is None else iso(r.time),
        "baseline": finite(r.baseline),
        "slug": r.slug,
    }


def _health(view: StationView, feed: ConsoleFeed) -> object:
    active = view.alarms.active()
    counts: dict[str, int] = {}
    for a in active:
        counts[a.state.value] = counts.get(a.state.value, 0) + 1
    health = view.health()
    return jsonable(
        {**health, "alarms": counts, "console_clients": feed.clients, "attention": attention(health)}
    )
