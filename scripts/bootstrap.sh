#!/usr/bin/env bash
# Make this checkout runnable on a fresh machine: Debian services the tests talk to
# (installed with apt-get when running as root and missing) and a .venv with the
# package and its dev tools. Safe to run again; does nothing that is already done.
set -euo pipefail
cd "$(dirname "$0")/.."

want_services="${1:-services}"   # "services" (tests) or "python" (demo only)
APT_PACKAGES=(mosquitto influxdb victoria-metrics chromium socat e2fsprogs)

missing=()
if [ "$want_services" = services ]; then
  command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ] || missing+=(mosquitto)
  command -v influxd >/dev/null || missing+=(influxdb)
  command -v victoria-metrics >/dev/null || missing+=(victoria-metrics)
  command -v chromium >/dev/null || missing+=(chromium)
  command -v socat >/dev/null || missing+=(socat)   # linked ptys for the Modbus RTU test, the WAN relay
  command -v mkfs.ext4 >/dev/null || [ -x /sbin/mkfs.ext4 ] || missing+=(e2fsprogs)  # the read-only disk test
fi
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "bootstrap: installing ${missing[*]} with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q "${missing[@]}" >/dev/null
  else
    echo "bootstrap: missing ${missing[*]}; run as root or: sudo apt-get install ${APT_PACKAGES[*]}" >&2
    exit 1
  fi
fi

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -e '.[dev]'
  touch "$stamp"
fi
