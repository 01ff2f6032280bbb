# The two commands a newcomer needs: `make demo` and `make test`.
# `make test` is what CI runs: lint, types and every test (the docs build strict among
# them, tests/test_docs.py) on three xdist workers (two cores: many tests wait on a broker,
# a database or a daemon rather than the CPU), the longest first (tests/conftest.py).
# `make check` is the fast tier for the edit-test loop: lint, types, and the unit and
# property tests that need no service (no Mosquitto, InfluxDB, VictoriaMetrics, Chromium,
# Modbus server or daemon process; tests/conftest.py marks those `services`) and are not
# whole commands over golden cases (`integration`), with a fifth of the property examples.
.PHONY: demo test check docs lint bench clean types suite

# Some machines (this one) set PYTHONDONTWRITEBYTECODE. The recipes below run without it:
# with it, each of the few hundred `monitor` processes the suite starts would compile its
# ~110 modules again (0.25 s of CPU for `monitor run`), and pytest could not cache its
# rewritten test modules (~6 s of CPU per xdist worker). Without it, the first process to
# import a module writes its bytecode and the rest load it.
unexport PYTHONDONTWRITEBYTECODE

demo:
	@scripts/bootstrap.sh python
	.venv/bin/monitor demo

test:
	@scripts/bootstrap.sh services
	.venv/bin/ruff check monitor simulators tests bench scripts
	.venv/bin/ruff format --check monitor simulators tests bench scripts
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
	MONITOR_TEST_TIER=check .venv/bin/python -m pytest -q -n 2 -m "not services and not integration"

docs:
	@scripts/bootstrap.sh python
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict

lint:
	.venv/bin/ruff check monitor simulators tests bench scripts
	.venv/bin/mypy

bench:
	@scripts/bootstrap.sh services
	for b in cli engine modbus_poll mqtt_ingest outbox alarms meters incidents durability hostile daemon fleet pipeline mqtt_acked station billing_historian replay startup meter_cap; do .venv/bin/python -m bench.$$b || exit 1; done

clean:
	rm -rf .venv .pytest_cache .mypy_cache .ruff_cache state site
