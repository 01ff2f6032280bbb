"""A TCP proxy in front of the console that loses answers: the request reaches the real
server, which commits it and answers, and the proxy closes the browser's connection
without passing the answer on. This is the fault behind double records (Wi-Fi gone after
the gateway committed); a browser cannot be made to suffer it on cue otherwise, so this is
the one fake part, and it sits on the wire: the page and the server are real.

One request per connection (the proxy asks the server to close after each answer), so
every request is seen; anything else, such as the live-update stream, is piped through."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.services import free_port


@dataclass(frozen=True)
class Seen:
    """A request the proxy passed on: method, path, its Idempotency-Key, and whether its
    answer was dropped."""

    method: str
    path: str
    key: str | None
    dropped: bool


@dataclass
class DroppingProxy:
    """Forwards 127.0.0.1:`port` to `upstream`; `drop(method, path)` says which answers to
    lose (the first `drops` that match)."""

    upstream: int
    drop: Callable[[str, str], bool]
    drops: int = 1
    port: int = field(default_factory=free_port)
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> DroppingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        # the browser may close its end (a page closed, a live stream dropped), as at any proxy;
        # a connection the browser opens after the test stopped the console finds no upstream
        # (refused): closed unanswered, as a proxy does, not an exception in this thread
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, ConnectionRefusedError):
            self._pass(client)

    def _pass(self, client: socket.socket) -> None:
        with client, socket.create_connection(("127.0.0.1", self.upstream)) as server:
            head, body = _read_request(client)
            if not head:
                return
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = [ln for ln in lines[1:] if ln and not ln.lower().startswith("connection:")]
            key = next(
                (ln.split(":", 1)[1].strip() for ln in headers if ln.lower().startswith("idempotency-key:")),
                None,
            )
            with self._lock:
                dropped = self.drops > 0 and self.drop(method, path)
                if dropped:
                    self.drops -= 1
                self.seen.append(Seen(method, path, key, dropped))
            request = "\r\n".join([lines[0], *headers, "Connection: close", "", ""]).encode("latin-1")
            server.sendall(request + body)
            if dropped:
                while server.recv(65536):  # the whole answer, after the server's commit ...
                    pass
                client.shutdown(socket.SHUT_RDWR)  # ... and none of it to the browser
                return
            while chunk := server.recv(65536):
                client.sendall(chunk)


def _read_request(sock: socket.socket) -> tuple[bytes, bytes]:
    """(head without its blank line, body by Content-Length); (b"", b"") on a closed socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return b"", b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head, body
