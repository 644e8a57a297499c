#!/usr/bin/env bash
# The project's one test command: install everything, then run lint, types and the whole suite, with a real
# local Slurm cluster started (and stopped, by PID) around pytest. Works on a fresh Debian 12 machine as root.
#
#   bash tests/run_all.sh [PYTEST ARGS...]
#
# Knobs: AFFRUN_VENV (default .venv), AFFRUN_NO_SLURM=1 (do not start Slurm; its tests then skip, or fail
# under CI=true).
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf '[run_all %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

# ---------------------------------------------------------------- system packages
need=()
command -v gcc >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v numactl >/dev/null 2>&1 || need+=(numactl)
# LLVM's OpenMP runtime (conda-forge's llvm-openmp is the same library): the binding tests run against it too.
compgen -G '/usr/lib/*-linux-gnu/libomp.so.5' >/dev/null || compgen -G '/usr/lib/llvm-*/lib/libomp.so.5' >/dev/null ||
  need+=(libomp5-14)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  if [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null 2>&1; DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"; }
  else
    log "not root: install ${need[*]} yourself"
  fi
fi

# ---------------------------------------------------------------- Python environment
VENV=${AFFRUN_VENV:-.venv}
case "$VENV" in /*) ;; *) VENV="$PWD/$VENV" ;; esac  # absolute from here on (PATH, the libomp 16 folder)
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  python3 -m venv "$VENV"
fi
log "installing affrun and its test, benchmarks and docs extras into $VENV"
# benchmarks: matplotlib, for the GPU-feed benchmark's chart, which its smoke test draws. docs: mkdocs.
"$VENV/bin/python" -m pip install -q -e '.[test,benchmarks,docs]'
# An editable install has no .pyc files, and with PYTHONDONTWRITEBYTECODE=1 none would be written: write them
# now, as pip does for a regular install, or every affrun process the tests start compiles its modules again.
"$VENV/bin/python" -m compileall -q launcher >/dev/null
export PATH="$VENV/bin:$PATH"
# LLVM libomp 16 changed how a fork()ed child binds (llvm-project #91098): test it next to 14. Debian's
# libomp5-16 conflicts with libomp5-14, so its package is unpacked into the environment (tests/launch.py finds it).
LIBOMP16="$VENV/opt/libomp5-16"
if [ ! -e "$LIBOMP16/usr/lib/llvm-16/lib/libomp.so.5" ] && [ ! -e /usr/lib/llvm-16/lib/libomp.so.5 ]; then
  log "unpacking libomp5-16 into $LIBOMP16"
  debdir=$(mktemp -d)
  if (cd "$debdir" && apt-get download -q libomp5-16 >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null 2>&1 && apt-get download -q libomp5-16 >/dev/null 2>&1; }); then
    mkdir -p "$LIBOMP16" && dpkg-deb -x "$debdir"/libomp5-16_*.deb "$LIBOMP16"
  else
    log "could not download libomp5-16: its tests will fail under CI=true and skip elsewhere"
  fi
  rm -rf "$debdir"
fi

# ---------------------------------------------------------------- lint and types
log "ruff"
ruff check launcher tests benchmarks examples build_backend
log "mypy"
mypy
# ---------------------------------------------------------------- the manual: no broken link or reference
log "mkdocs build --strict"
site_dir=$(mktemp -d)
mkdocs build --strict --quiet -d "$site_dir"
rm -rf "$site_dir"

# ---------------------------------------------------------------- Slurm (real, local, 2 virtual nodes)
slurm_started=0
# Stop whatever start recorded, also after a start that failed half-way (it kills only the PIDs it started).
stop_slurm() { [ "$slurm_started" != 0 ] && bash tests/slurm/stop-slurm.sh >/dev/null 2>&1 || true; }
trap stop_slurm EXIT
if [ "${AFFRUN_NO_SLURM:-0}" != 1 ] && [ -f tests/slurm/start-slurm.sh ]; then
  log "starting the local Slurm cluster"
  slurm_started=attempted
  if SLURM_LOCAL_NODES=2 SLURM_LOCAL_GPUS=2 bash tests/slurm/start-slurm.sh; then
    slurm_started=1
    export AFFRUN_SLURM=1
  else
    log "Slurm did not start: its tests will fail under CI=true and skip elsewhere"
  fi
fi

# ---------------------------------------------------------------- tests
log "pytest"
status=0
python -m pytest "$@" || status=$?
exit $status
