# The two commands a newcomer needs: `make demo` and `make test`.
# `make test` is what CI runs: lint, types and every test (the docs build strict among
# them, tests/test_docs.py) on three xdist workers (two cores: many tests wait on a broker,
# a database or a daemon rather than the CPU), the longest first (tests/conftest.py).
# `make check` is the fast tier for the edit-test loop: lint, types, and the unit and
# property tests that need no service (no Mosquitto, InfluxDB, VictoriaMetrics, Chromium,
# Modbus server or daemon process; tests/conftest.py marks those `services`) and are not
# whole commands over golden cases (`integration`), with a fifth of the property examples.
# Each target byte-compiles the package first: the test suite starts `monitor` a few
# hundred times, and with PYTHONDONTWRITEBYTECODE set (or a read-only tree) every start
# would compile its ~110 modules again (0.25 s of CPU for `monitor run` on this machine).
.PHONY: demo test check docs lint bench clean bytecode types suite

# Some machines (this one) set PYTHONDONTWRITEBYTECODE: then pytest cannot cache its
# rewritten test modules either, and every xdist worker spends ~6 s of CPU rewriting the
# asserts of all 100 test modules again. The recipes below run without it.
unexport PYTHONDONTWRITEBYTECODE

bytecode:
	.venv/bin/python -m compileall -q monitor simulators

demo:
	@scripts/bootstrap.sh python
	.venv/bin/monitor demo

test:
	@scripts/bootstrap.sh services
	.venv/bin/ruff check monitor simulators tests bench scripts
	.venv/bin/ruff format --check monitor simulators tests bench scripts
	$(MAKE) --no-print-directory bytecode
	$(MAKE) --no-print-directory -j2 types suite

# `make test`'s two long steps side by side: the suite leaves a sixth of the two cores idle
# (its tests wait on daemons and brokers), which covers mypy's first, uncached run (~30 s).
types:
	.venv/bin/mypy

suite:
	.venv/bin/python -m pytest -q -n 3 --dist loadfile

check:
	@scripts/bootstrap.sh python
	.venv/bin/ruff check monitor simulators tests bench scripts
	.venv/bin/ruff format --check monitor simulators tests bench scripts
	.venv/bin/mypy
	$(MAKE) --no-print-directory bytecode
	MONITOR_TEST_TIER=check .venv/bin/python -m pytest -q -n 2 -m "not services and not integration"

docs:
	@scripts/bootstrap.sh python
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict

lint:
	.venv/bin/ruff check monitor simulators tests bench scripts
	.venv/bin/mypy

bench:
	@scripts/bootstrap.sh services
	$(MAKE) --no-print-directory bytecode
	for b in cli engine modbus_poll mqtt_ingest outbox alarms meters incidents durability hostile daemon fleet pipeline mqtt_acked station billing_historian replay; do .venv/bin/python -m bench.$$b || exit 1; done

clean:
	rm -rf .venv .pytest_cache .mypy_cache .ruff_cache state site
