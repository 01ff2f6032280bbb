"""A scripted HTTP server for the faults real servers cannot produce on demand.

Neither VictoriaMetrics nor InfluxDB 1.6 can be made to answer 413 or 429 (or a
5xx) when a test wants it, so these tests use this stand-in; everything else
is tested against the real servers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Answer = tuple[int, dict[str, str], str]
Script = Callable[[list[str]], Answer]


class FakeInflux:
    """Answers each POST with `script(lines)`; keeps the lines of every 2xx answer."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.stored: list[str] = []
        self.requests = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length", "0"))
                lines = self.rfile.read(n).decode().split("\n")
                owner.requests += 1
                status, headers, text = owner.script(lines)
                if 200 <= status < 300:
                    owner.stored.extend(lines)
                body = text.encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"

    @contextmanager
    def running(self) -> Iterator[FakeInflux]:
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.server.shutdown()
            self.server.server_close()
            thread.join()
