"""Console API for water meters: the ledger's state and recording a meter replacement.

Mounted by `create_app` when the station view offers a `meter_book` (the daemon's
`MeterBook`); the meter alarm transitions a replacement causes (a `backwards` alarm
clearing) go through the daemon's pipeline (`submit`) like any other condition. A
replacement takes an `Idempotency-Key` as every console write (`monitor/web/once.py`), kept
in the ledger in the swap's own transaction: a clerk's retry of a lost answer is answered
from the first, never recorded again (a swap voided meanwhile was recorded again).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from monitor.errors import MeterError
from monitor.meters.book import MeterBook
from monitor.model import Condition, iso
from monitor.web.once import KEY_REFUSED, WriteKeyed, once
from monitor.writeonce import WriteKey

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: KEY_REFUSED,
    401: {"description": "missing or wrong bearer token"},
    403: {"description": "no console.token configured: writes are disabled"},
    404: {"description": "no such meter"},
    409: {"description": "the figures contradict the ledger (the reason says how)"},
    503: {"description": "the meter ledger could not record the swap (the state disk): `not done: ...`"},
}


class ReplacementRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    by: str = Field(min_length=1, max_length=100, description="the operator's name, kept in the ledger")
    time: AwareDatetime = Field(description="when the meter was swapped")
    old_final: Decimal = Field(ge=0, description="the old meter's final register reading (counts)")
    new_initial: Decimal = Field(ge=0, description="the new meter's initial register reading (counts)")
    note: str = Field("", max_length=500)


class ReplacementOut(BaseModel):
    meter: str
    time: str
    old_final: str
    new_initial: str
    alarm_cleared: bool


class MeterOut(BaseModel):
    meter: str
    account: str
    unit: str
    last_reading: str | None = Field(description="last accepted register reading (counts)")
    last_reading_at: str | None
    alarm: bool = Field(description="the latest reading was rejected (meter alarm active)")
    message: str


def add_meter_routes(
    app: FastAPI,
    book: MeterBook,
    submit: Callable[[Sequence[Condition]], object],
    token_required: Any,
) -> None:
    """`token_required` is the app's `Depends(...)` guard for writes; `submit` hands the
    alarm transitions a replacement causes to the daemon's pipeline."""
    ledger = book.ledger

    def known(meter: str) -> None:
        if meter not in ledger.specs:
            raise HTTPException(404, f"no meter {meter!r} on this station")

    @app.get("/api/meters", response_model=list[MeterOut])
    async def meters() -> list[MeterOut]:
        out = []
        for meter, spec in ledger.specs.items():
            last, base = ledger.last(meter), ledger.baseline(meter)
            out.append(
                MeterOut(
                    meter=meter,
                    account=spec.account or "",
                    unit=spec.unit,
                    last_reading=None if base is None else f"{base.reading}",
                    last_reading_at=None if base is None else iso(base.time),
                    alarm=last is not None and not last.accepted,
                    message="" if last is None or last.accepted else last.message,
                )
            )
        return out

    @app.post("/api/meters/{meter}/replacements", response_model=ReplacementOut, responses=_ERRORS)
    async def replace(meter: str, body: ReplacementRequest, key: WriteKeyed, _: None = token_required) -> Any:
        known(meter)
        when = body.time.timestamp()

        def write(k: WriteKey | None) -> dict[str, object]:
            try:
                conditions = book.record_replacement(
                    meter, when, body.old_final, body.new_initial, recorded_by=body.by, note=body.note, key=k
                )
            except MeterError as exc:
                raise HTTPException(409, str(exc)) from None
            submit(conditions)
            return answer(any(c.state == "cleared" for c in conditions))

        def answer(cleared: bool) -> dict[str, object]:
            return ReplacementOut(
                meter=meter,
                time=iso(when),
                old_final=f"{body.old_final}",
                new_initial=f"{body.new_initial}",
                alarm_cleared=cleared,
            ).model_dump()

        # a repeat whose first answer was not kept (the daemon died before it): the swap
        # asked, as recorded; whether it cleared the alarm then is not known now
        return once(ledger.keys, key, write, lambda: answer(False), ReplacementOut)
