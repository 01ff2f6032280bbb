"""A station for console tests: the real AlarmManager and journal, an in-memory sensor
table standing in for the engine (which lives on another branch), and the real
uvicorn server on a free loopback port in a background thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
from pydantic import SecretStr

from monitor.alarms import AlarmManager, Journal
from monitor.config import Alarms, Console
from monitor.model import Condition, ConditionState, ManualClock, Quality, Rule, Sample, iso
from monitor.web import ConsoleServer, SensorReading, StationView, create_app
from tests.services import free_port

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

T = TypeVar("T")
T0 = 1_780_000_000.0
TOKEN = "s3cret-console-token"
UNITS = {
    "outfall.ph": ("ph", "pH"),
    "outfall.flow": ("flow", "gpm"),
    "outfall.oil": ("concentration", "mg/L"),
}


class TableView:
    """StationView over a dict of readings; `inject` plays the engine's part."""

    station_id = "ps-1"
    station_name = "Barton PS 1"

    def __init__(self, journal: Path, clock: ManualClock, alarms: Alarms | None = None) -> None:
        self.clock = clock
        self._alarms = AlarmManager(alarms or Alarms(), Journal(journal), clock)
        self.readings: dict[str, list[Sample]] = {sensor: [] for sensor in UNITS}
        self.last_poll: float | None = None

    @property
    def alarms(self) -> AlarmManager:
        return self._alarms

    def sensors(self) -> Sequence[SensorReading]:
        out = []
        for sensor, samples in self.readings.items():
            kind, unit = UNITS[sensor]
            last = samples[-1] if samples else None
            good = [s.value for s in samples if s.quality is Quality.GOOD]
            out.append(
                SensorReading(
                    id=sensor,
                    kind=kind,
                    unit=unit,
                    value=None if last is None else last.value,
                    quality="good" if last is None else last.quality.name.lower(),
                    time=None if last is None else last.time,
                    baseline=sum(good) / len(good) if good else None,
                    name={
                        "outfall.ph": "Outfall pH",
                        "outfall.flow": "Outfall flow",
                        "outfall.oil": "Outfall oil",
                    }[sensor],
                )
            )
        return out

    def series(self, sensor: str, since: float, until: float) -> Sequence[tuple[float, float]]:
        return [(s.time, s.value) for s in self.readings[sensor] if since <= s.time < until]

    def health(self) -> Mapping[str, object]:
        return {
            "sources": [
                {"name": "modbus outfall-plc", "state": "polling", "last_poll": _iso(self.last_poll)}
            ],
            "outbox_depth": 0,
            "uptime_s": float("nan"),  # the console must cope with NaN from a sensor-ish figure
        }

    def now(self) -> float:
        return self.clock.now()

    def inject(self, sample: Sample, limit: float | None = None, citation: str = "") -> None:
        """Record a sample; if it breaks `limit`, raise the HIGH condition as the engine would."""
        self.readings[sample.sensor].append(sample)
        self.last_poll = sample.time
        self.clock.set(max(self.clock.now(), sample.time))
        if limit is not None:
            state = ConditionState.ACTIVE if sample.value > limit else ConditionState.CLEARED
            self._alarms.apply(
                Condition(sample.time, sample.sensor, Rule.HIGH, state, sample.value, limit, citation)
            )


def fill_day(view: TableView, start: float) -> None:
    """24 h of readings, one every 10 minutes, with a daily shape for the sparklines."""
    import math

    for i in range(144):
        t = start + i * 600
        day = math.sin(i / 144 * 2 * math.pi)
        view.readings["outfall.flow"].append(Sample("outfall.flow", t, 400 + 120 * day))
        view.readings["outfall.ph"].append(Sample("outfall.ph", t, 7.2 + 0.3 * day))
        view.readings["outfall.oil"].append(Sample("outfall.oil", t, 12 + 4 * math.cos(i / 10)))


def _iso(t: float | None) -> str | None:
    return None if t is None else iso(t)


class LiveConsole:
    """uvicorn serving the console app in a thread with its own event loop."""

    def __init__(
        self, view: TableView, token: str | None = TOKEN, refresh: float = 0.5, port: int | None = None
    ) -> None:
        """`port`: the port of a console stopped before (a gateway restarted), else a free one."""
        self.view = view
        self.console = Console(
            port=free_port() if port is None else port, token=None if token is None else SecretStr(token)
        )
        self.app = create_app(view, self.console, refresh=refresh)
        self.server = ConsoleServer(self.app, self.console)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.url = f"http://127.0.0.1:{self.console.port}"

    def _run(self) -> None:
        self.loop.run_until_complete(self.server.serve())

    def __enter__(self) -> LiveConsole:
        self.thread.start()
        ready = asyncio.run_coroutine_threadsafe(self.server.wait_started(), self.loop)
        ready.result(timeout=15)
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.server.stop)
        self.thread.join(timeout=15)
        self.loop.close()

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the server's loop (the manager is not thread-safe, as in the daemon)."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except Exception as exc:
                future.set_exception(exc)

        self.loop.call_soon_threadsafe(run)
        return future.result(timeout=10)


def call(view: StationView, method: str, url: str, token: str | None = TOKEN, **kw: Any) -> httpx.Response:
    """One request through the ASGI app (no socket needed for pure API behaviour)."""
    app = create_app(view, Console(token=None if token is None else SecretStr(token)))

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            return await client.request(method, url, **kw)

    return asyncio.run(go())


def operator_page(
    browser: Browser, live: LiveConsole, name: str = "R. Alvarez", token: str | None = TOKEN
) -> Page:
    """The console open, with the operator's name (and token) typed under Operator, as a
    person does before an action."""
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.goto(live.url)
    page.fill("#op-name", name)
    if token is not None:
        page.fill("#op-token", token)
    return page
