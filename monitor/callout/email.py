"""E-mail over SMTP: the one module that imports aiosmtplib; its errors become `WriteError`.

aiosmtplib because it is asyncio-native (a slow mail server never blocks the
pipeline), does STARTTLS and implicit TLS, and AUTH, in one call.
"""

from __future__ import annotations

import ssl
from email.message import EmailMessage
from email.utils import formatdate, make_msgid

import aiosmtplib

from monitor.config.notify import EmailChannel
from monitor.errors import WriteError


class EmailSender:
    """Sends one message per call over a fresh connection (pages are rare; a pooled
    connection would only go stale between them)."""

    def __init__(self, name: str, config: EmailChannel) -> None:
        self.name = name
        self.config = config
        self._tls: ssl.SSLContext | None = None
        if config.security != "none":
            self._tls = ssl.create_default_context(cafile=str(config.ca_file) if config.ca_file else None)

    async def send(
        self, address: str, subject: str, text: str, link: str | None = None, priority: str = ""
    ) -> None:
        c = self.config
        msg = EmailMessage()
        try:  # the library refuses a line break in a header (ValueError): this channel fails
            msg["From"] = c.sender
            msg["To"] = address
            msg["Subject"] = subject
            msg["Date"] = formatdate(localtime=False)
            msg["Message-ID"] = make_msgid(domain=c.sender.rsplit("@", 1)[-1])
            msg.set_content(text)
        except ValueError as exc:
            raise WriteError(f"e-mail channel {self.name}: cannot make the message: {exc}") from None
        try:
            await aiosmtplib.send(
                msg,
                hostname=c.host,
                port=c.effective_port,
                username=c.username,
                password=None if c.password is None else c.password.get_secret_value(),
                use_tls=c.security == "tls",
                start_tls=c.security == "starttls",
                tls_context=self._tls,
                timeout=c.timeout,
            )
        except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
            detail = str(exc) or type(exc).__name__
            raise WriteError(f"e-mail channel {self.name} via {c.host}:{c.effective_port}: {detail}") from exc

    async def aclose(self) -> None:
        return None
