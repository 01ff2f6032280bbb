"""A real SMTP server for callout tests: aiosmtpd on a free loopback port, in its own thread,
with STARTTLS (a throwaway CA's certificate) and AUTH required when `certs` and `users` are
given, collecting what it accepted."""

from __future__ import annotations

import email
import ssl
import threading
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from tests.services import free_port, wait_until


@dataclass(frozen=True)
class Mail:
    sender: str
    to: tuple[str, ...]
    message: Message

    @property
    def subject(self) -> str:
        return str(self.message["Subject"])

    @property
    def body(self) -> str:
        payload = self.message.get_payload(decode=True)
        assert isinstance(payload, bytes)
        return payload.decode("utf-8")


class _Handler:
    def __init__(self, server: MailServer) -> None:
        self.server = server

    async def handle_DATA(self, smtp: Any, session: Any, envelope: Any) -> str:  # noqa: N802 (aiosmtpd's name)
        if self.server.refuse:
            return "451 try again later"
        msg = email.message_from_bytes(envelope.original_content)
        with self.server.lock:
            self.server.mails.append(Mail(envelope.mail_from, tuple(envelope.rcpt_tos), msg))
        return "250 OK"


class MailServer:
    """`mails` holds every accepted message; `refuse` makes it answer 451 (a failing provider)."""

    def __init__(self, users: dict[str, str] | None = None, certs: dict[str, Path] | None = None) -> None:
        self.port = free_port()
        self.mails: list[Mail] = []
        self.lock = threading.Lock()
        self.refuse = False
        self.users = users
        kwargs: dict[str, Any] = {}
        if certs is not None:
            tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            tls.load_cert_chain(certs["cert"], certs["key"])
            kwargs = {"tls_context": tls, "require_starttls": True}
        if users is not None:
            assert certs is not None, "AUTH without TLS: aiosmtpd (rightly) warns"
            kwargs |= {"authenticator": self._auth, "auth_require_tls": True, "auth_required": True}
        self.controller = Controller(_Handler(self), hostname="127.0.0.1", port=self.port, **kwargs)

    def _auth(self, server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
        ok = (
            isinstance(data, LoginPassword)
            and self.users is not None
            and self.users.get(data.login.decode()) == data.password.decode()
        )
        return AuthResult(success=ok, handled=False)

    def to(self, address: str) -> list[Mail]:
        with self.lock:
            return [m for m in self.mails if address in m.to]

    def wait_for(self, address: str, count: int = 1, timeout: float = 20.0) -> list[Mail]:
        wait_until(
            lambda: len(self.to(address)) >= count, timeout=timeout, what=f"{count} mail(s) to {address}"
        )
        return self.to(address)

    def __enter__(self) -> MailServer:
        self.controller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.controller.stop()
