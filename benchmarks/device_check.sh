#!/usr/bin/env bash
# The GPU validation, one command: bash benchmarks/device_check.sh [--rehearse] [--out DIR] [device_check.py options]
#
# Runs benchmarks/device_check.py with the interpreter in $PYTHON (else .venv/bin/python, else python3), bounded:
# every step ends with its share of the time plan, none starts past the deadline, and this script kills the driver
# at $DEVICE_CHECK_LIMIT seconds (default 360 on the device, 720 with --rehearse). Reports: device_check.json and
# device_check.md in --out, $OUT, or .out/device-check.
# --rehearse: on a machine without a GPU (docs/performance.md, "GPU validation").
set -u
cd "$(dirname "$0")/.." || exit 2
py=${PYTHON:-}
if [ -z "$py" ]; then
  if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
fi
limit=${DEVICE_CHECK_LIMIT:-360}
for arg in "$@"; do
  if [ "$arg" = "--rehearse" ] && [ -z "${DEVICE_CHECK_LIMIT:-}" ]; then limit=720; fi
done
export PYTHONUNBUFFERED=1
timeout --kill-after=10 "$((limit + 5))" "$py" benchmarks/device_check.py --limit "$limit" "$@"
rc=$?
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "device_check: killed at the ${limit} s limit; the reports hold the steps that finished"
fi
exit "$rc"
