# The two commands a newcomer needs: `make demo` and `make test`.
# `make check` is the fast tier for the edit-test loop: lint, types, and the tests that
# need no service (no Mosquitto, InfluxDB, VictoriaMetrics, Chromium, Modbus server or
# daemon process; tests/conftest.py marks those `services`). `make test` is what CI runs.
.PHONY: demo test check lint bench clean

demo:
	@scripts/bootstrap.sh python
	.venv/bin/monitor demo

test:
	@scripts/bootstrap.sh services
	.venv/bin/ruff check monitor simulators tests bench
	.venv/bin/ruff format --check monitor simulators tests bench
	.venv/bin/mypy
	.venv/bin/python -m pytest -q

check:
	@scripts/bootstrap.sh python
	.venv/bin/ruff check monitor simulators tests bench
	.venv/bin/ruff format --check monitor simulators tests bench
	.venv/bin/mypy
	.venv/bin/python -m pytest -q -m "not services"

lint:
	.venv/bin/ruff check monitor simulators tests bench
	.venv/bin/mypy

bench:
	@scripts/bootstrap.sh services
	for b in cli engine modbus_poll mqtt_ingest outbox alarms meters daemon fleet; do .venv/bin/python -m bench.$$b || exit 1; done

clean:
	rm -rf .venv .pytest_cache .mypy_cache .ruff_cache state
