# The two commands a newcomer needs: `make demo` and `make test`.
.PHONY: demo test lint bench clean

demo:
	@scripts/bootstrap.sh python
	.venv/bin/monitor demo

test:
	@scripts/bootstrap.sh services
	.venv/bin/ruff check monitor simulators tests bench
	.venv/bin/ruff format --check monitor simulators tests bench
	.venv/bin/mypy
	.venv/bin/python -m pytest -q

lint:
	.venv/bin/ruff check monitor simulators tests bench
	.venv/bin/mypy

bench:
	@scripts/bootstrap.sh services
	for b in engine modbus_poll mqtt_ingest outbox alarms meters incidents durability hostile daemon fleet pipeline mqtt_acked; do .venv/bin/python -m bench.$$b || exit 1; done

clean:
	rm -rf .venv .pytest_cache .mypy_cache .ruff_cache state
