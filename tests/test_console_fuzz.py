"""Fuzz the console API from its own OpenAPI document: no input may cause a 500."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from pydantic import SecretStr
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok

from monitor.config import Console
from monitor.model import ManualClock, Sample
from monitor.web import create_app
from tests.console import T0, TOKEN, TableView, fill_day
from tests.examples import examples

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_api_never_answers_500(tmp_path: Path) -> None:
    # schemathesis' pytest plugin does not run under pytest 9 yet, so each operation's
    # hypothesis strategy is driven here directly; the checks are schemathesis' own.
    view = TableView(tmp_path / "journal.sqlite", ManualClock(T0))
    fill_day(view, T0 - 86400)
    view.inject(Sample("outfall.ph", T0, 9.4), limit=9.0, citation="§139-15 C(3)")
    # schemathesis' ASGI client sends `Host: testserver`; the console's Host allow-list must name it.
    app = create_app(view, Console(token=SecretStr(TOKEN), allowed_hosts=["testserver"]))
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), f"OpenAPI document is invalid: {result.err()}"
        operations.append(result.ok())
    assert len(operations) >= 10
    tried: dict[str, int] = {}
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=examples(30), deadline=None, suppress_health_check=list(HealthCheck), database=None
        )
        def fuzz(case: Any) -> None:
            # With the token, so generated bodies reach the alarm manager, not just the auth check.
            case.call_and_validate(headers=AUTH, checks=[not_a_server_error])
            tried[case.operation.label] = tried.get(case.operation.label, 0) + 1

        fuzz()
    assert all(n >= 1 for n in tried.values()) and len(tried) == len(operations)
    view.alarms.close()
