#!/usr/bin/env bash
# stop-slurm.sh - stop exactly the daemons that start-slurm.sh started, by the
# PIDs it recorded in $SLURM_LOCAL_DIR/pids/ (never by name). Cancels the
# cluster's jobs first so no job steps outlive slurmd. State, logs and
# configuration are kept; pass --purge to also delete $SLURM_LOCAL_DIR.
# Adapted from a generic one-host Slurm setup script; the project owns it (see README.md here).
set -uo pipefail
BASE=${SLURM_LOCAL_DIR:-/tmp/affrun-slurm}
PIDS=$BASE/pids
log() { echo "[stop-slurm] $*" >&2; }

# shellcheck source=pids.sh
. "$(dirname "$0")/pids.sh"

stop() { # stop NAME: SIGTERM, wait up to 15 s, then SIGKILL
  local name=$1 pid
  if ! alive "$name"; then rm -f "$PIDS/$name.pid"; return 0; fi
  pid=$(cat "$PIDS/$name.pid")
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 150); do alive "$name" || break; sleep 0.1; done
  if alive "$name"; then log "$name (pid $pid) ignored SIGTERM, sending SIGKILL"; kill -KILL "$pid" 2>/dev/null; sleep 0.2; fi
  log "stopped $name (pid $pid)"
  rm -f "$PIDS/$name.pid"
}

[ -d "$PIDS" ] || { log "nothing to stop ($PIDS does not exist)"; exit 0; }

# Cancel every job of this cluster while slurmctld and slurmd are still up.
if alive slurmctld; then
  jobs=$(squeue -h -o %A 2>/dev/null | tr '\n' ' ')
  if [ -n "${jobs// /}" ]; then
    log "cancelling jobs: $jobs"
    scancel $jobs 2>/dev/null || true
    for _ in $(seq 150); do [ -z "$(squeue -h -o %A 2>/dev/null)" ] && break; sleep 0.1; done
  fi
fi

for f in "$PIDS"/slurmd-*.pid; do [ -e "$f" ] && stop "$(basename "$f" .pid)"; done
for name in slurmctld slurmdbd mariadbd munged; do stop "$name"; done

if [ "${1:-}" = --purge ]; then rm -rf "$BASE"; log "removed $BASE"; fi
exit 0
