"""Console: the pumping station view (`/station`, `/api/wet-well`), read-only.

Mounted by `create_app` when the daemon tracks a station (`view.live_station.tracker`).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import FileResponse

from monitor.config import Config
from monitor.station.tracker import StationTracker
from monitor.station.view import snapshot
from monitor.web.view import StationView


def add_station_routes(
    app: FastAPI, view: StationView, config: Config, tracker: StationTracker, static: Any
) -> None:
    @app.get("/station", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(static / "station.html", headers={"Cache-Control": "no-cache"})

    @app.get("/api/wet-well", response_model=dict[str, Any])
    async def wet_well() -> dict[str, object]:
        """Level against setpoints, each pump running/stopped/failed with today's run hours and
        starts (station local day), the inflow, and an overflow in progress with its due time."""
        return snapshot(config, tracker, view.now())
