"""The operator console: HTTP API, live updates (server-sent events) and the page.

The daemon implements `StationView` and serves `create_app(view, config.console)`
with `ConsoleServer`. The page is plain HTML/CSS/JS in `static/` (no build step,
no CDN: the gateway has no internet).
"""

from monitor.web.app import create_app
from monitor.web.server import ConsoleServer
from monitor.web.view import SensorReading, StationView

__all__ = ["ConsoleServer", "SensorReading", "StationView", "create_app"]
