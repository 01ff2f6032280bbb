"""Console writes done once: the `Idempotency-Key` header (Stripe's, the IETF draft's).

The page sends a request id with every write and, when the answer is lost (Wi-Fi drops
after the gateway committed a notice of violation), sends the same write again with the
same id. `request_key` reads the header (and the body, for its digest); `once` answers a
repeat with the first answer and writes nothing, refuses the id with another request (422,
in words), and otherwise does the write with the id kept in the write's own transaction
(`monitor/writeonce.py`). Without the header a write is done as before (scripts, the CLI).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import Response
from pydantic import BaseModel

from monitor.errors import StateError
from monitor.web.guard import bearer
from monitor.writeonce import KEY_CHARS, KeyRefusedError, KeyStore, WriteKey, write_key

log = logging.getLogger(__name__)
HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"  # on a repeat's answer: "true"
KEY_REUSED = (
    "this Idempotency-Key was first used for another request (another action, incident or text);"
    " nothing was written: a new write needs a new key"
)
Answer = dict[str, object]
# The 400 in a write route's `responses`, for the OpenAPI page.
KEY_REFUSED = {"description": f"an {HEADER} that is not 8 to 64 of {KEY_CHARS}"}


async def request_key(request: Request) -> WriteKey | None:
    """The write's key, None without the header; 400 for a header that is not a key. The
    bearer token is the one the guard has checked already: it makes the key's owner."""
    values = request.headers.getlist(HEADER)
    if not values:
        return None
    if len(values) > 1:
        raise HTTPException(400, f"one {HEADER} header per request, not {len(values)}")
    token = bearer(request.headers.get("authorization", "").encode("latin-1")) or b""
    body = await request.body()  # read once by Starlette and kept: the route's body is these bytes
    try:
        return write_key(values[0], token, request.method, request.url.path, body)
    except KeyRefusedError as exc:
        raise HTTPException(400, str(exc)) from None


WriteKeyed = Annotated[WriteKey | None, Depends(request_key)]


def once(
    keys: KeyStore,
    key: WriteKey | None,
    write: Callable[[WriteKey | None], Answer],
    recorded: Callable[[], Answer],
    model: type[BaseModel] | None = None,
) -> Answer | Response:
    """`write(key)` once per key. A repeat gets the first answer (`recorded()`, what is on
    record now, when the daemon died before keeping it), marked `Idempotent-Replayed`.
    `model`: the route's response model, so the first answer and a repeat are the bytes
    FastAPI would send."""
    if key is None:
        return write(None)
    prior = keys.prior_write(key)
    if prior is not None:
        if prior.request != key.request:
            raise HTTPException(422, KEY_REUSED)
        text = prior.answer if prior.answer is not None else _keep(keys, key, _json(recorded(), model))
        return Response(text, media_type="application/json", headers={REPLAYED: "true"})
    text = _keep(keys, key, _json(write(key), model))
    return Response(text, media_type="application/json")


def _json(answer: Answer, model: type[BaseModel] | None) -> str:
    content = jsonable_encoder(answer if model is None else model.model_validate(answer))
    return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _keep(keys: KeyStore, key: WriteKey, text: str) -> str:
    """The write is on record already: a store that cannot keep its answer costs a repeat
    the first answer's exact words (it gets what is recorded then), never the write's 200."""
    try:
        keys.keep_answer(key, text)
    except StateError as exc:
        log.warning("console write done, its answer not kept for a repeat: %s", exc)
    return text
