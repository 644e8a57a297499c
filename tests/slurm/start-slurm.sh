#!/usr/bin/env bash
# start-slurm.sh - install (if missing), configure and start a real single-host
# Slurm cluster (munge + slurmctld + slurmd [+ MariaDB + slurmdbd]) on Debian,
# without systemd. Idempotent: running it again while the cluster is up only
# re-checks it. Waits until every node is idle. Must run as root.
#
# Adapted from a generic one-host Slurm setup script (see README.md here). Project changes: the
# defaults are the cluster the tests need (2 virtual nodes x 2 fake GPUs), the state lives under
# /tmp/affrun-slurm, and every node has the feature "affrun" (so `--constraint` can be tested).
#
# Stop with stop-slurm.sh (kills exactly the PIDs recorded in $BASE/pids/).
#
# Knobs (environment variables):
#   SLURM_LOCAL_DIR         state/log/pid directory        (default /tmp/affrun-slurm)
#   SLURM_LOCAL_NODES       number of virtual nodes; 1 = one node named after
#                           `hostname -s`, N>1 = nodes n1..nN, one slurmd each
#                                                          (default 2)
#   SLURM_LOCAL_GPUS        fake GPUs per node (gres gpu:fake:N), 0 = none (default 2)
#   SLURM_LOCAL_FEATURES    node features (Features=...)   (default affrun)
#   SLURM_LOCAL_ACCOUNTING  1 = MariaDB + slurmdbd so `sacct` works (needed by
#                           submitit to see FAILED/CANCELLED/TIMEOUT), 0 = none (default 1)
#   SLURM_LOCAL_CGROUP      auto | yes | no  (cgroup v1 proctrack/task plugins) (default auto)
#   SLURM_LOCAL_PARTITION   partition name                 (default debug)
#   SLURM_LOCAL_MIN_JOB_AGE MinJobAge; <=5 keeps `sbatch --wait` polling every 2 s
#                           (default 5 with accounting, 300 without)
#   SLURM_LOCAL_DB_PORT     MariaDB TCP port on 127.0.0.1  (default 3307)
#   SLURM_LOCAL_TIMEOUT     seconds to wait for each daemon / idle nodes (default 60)
#   SLURM_LOCAL_NO_INSTALL  1 = never call apt-get          (default 0)
#   SLURM_LOCAL_WARMUP      wait | async | none (default wait). Slurm 22.05 parses
#                           SchedulerParameters lazily, so for ~3 s after slurmctld
#                           starts batch_sched_delay is still its default 3 s; a
#                           throw-away batch job ("slurm-local-warmup") gets the
#                           scheduler past that. "wait" blocks until it is done.
set -euo pipefail

BASE=${SLURM_LOCAL_DIR:-/tmp/affrun-slurm}
NODES=${SLURM_LOCAL_NODES:-2}
GPUS=${SLURM_LOCAL_GPUS:-2}
FEATURES=${SLURM_LOCAL_FEATURES:-affrun}
ACCOUNTING=${SLURM_LOCAL_ACCOUNTING:-1}
CGROUP=${SLURM_LOCAL_CGROUP:-auto}
PARTITION=${SLURM_LOCAL_PARTITION:-debug}
DB_PORT=${SLURM_LOCAL_DB_PORT:-3307}
TIMEOUT=${SLURM_LOCAL_TIMEOUT:-60}
NO_INSTALL=${SLURM_LOCAL_NO_INSTALL:-0}
WARMUP=${SLURM_LOCAL_WARMUP:-wait}
if [ "$ACCOUNTING" = 1 ]; then MIN_JOB_AGE=${SLURM_LOCAL_MIN_JOB_AGE:-5}; else MIN_JOB_AGE=${SLURM_LOCAL_MIN_JOB_AGE:-300}; fi
CLUSTER=local
CTLD_PORT=6817
SLURMD_PORT=6818
DBD_PORT=6819
ETC=/etc/slurm          # default location: every client (sbatch, srun, submitit) finds it
PIDS=$BASE/pids         # PIDs of the daemons *this script* started
T_START=$(date +%s%N)

log() { LC_ALL=C printf '[start-slurm %5.1fs] %s\n' "$(( ($(date +%s%N) - T_START) / 1000000 ))e-3" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root"

# ---------------------------------------------------------------- install --
need_pkgs=()
for c in munged:munge slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client; do
  command -v "${c%%:*}" >/dev/null 2>&1 || need_pkgs+=("${c#*:}")
done
if [ "$ACCOUNTING" = 1 ]; then
  command -v slurmdbd >/dev/null 2>&1 || need_pkgs+=(slurmdbd)
  command -v mariadbd >/dev/null 2>&1 || need_pkgs+=(mariadb-server)
fi
if [ ${#need_pkgs[@]} -gt 0 ]; then
  [ "$NO_INSTALL" = 1 ] && die "missing packages: ${need_pkgs[*]} (SLURM_LOCAL_NO_INSTALL=1)"
  log "installing ${need_pkgs[*]}"
  # Keep postinst scripts from starting services (no init system here).
  added_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; added_policy=1
  fi
  apt_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need_pkgs[@]}" >"$1" 2>&1; }
  mkdir -p "$BASE/log"
  if ! apt_install "$BASE/log/apt.log"; then
    log "apt-get install failed; running apt-get update and retrying"
    apt-get update -q >"$BASE/log/apt-update.log" 2>&1 || true
    apt_install "$BASE/log/apt.log" || { [ $added_policy = 1 ] && rm -f /usr/sbin/policy-rc.d; tail -20 "$BASE/log/apt.log" >&2; die "apt-get install failed"; }
  fi
  [ $added_policy = 1 ] && rm -f /usr/sbin/policy-rc.d
  log "installed $(dpkg-query -W -f='${Version}' slurmctld)"
fi

mkdir -p "$BASE"/{state,spool,log,run,pids,dev} "$ETC"

# ------------------------------------------------------------- pid helpers --
# shellcheck source=pids.sh
. "$(dirname "$0")/pids.sh"
# launch NAME CMD...: start CMD in the foreground mode of the daemon, detached
# in its own session; `setsid` execs directly (we are not a group leader), so $!
# is the daemon's own PID.
launch() {
  local name=$1; shift
  if alive "$name"; then log "$name already running (pid $(cat "$PIDS/$name.pid"))"; return 0; fi
  setsid "$@" </dev/null >>"$BASE/log/$name.stdout" 2>&1 &
  echo $! > "$PIDS/$name.pid"
  log "started $name (pid $!)"
}
wait_for() { # wait_for WHAT NAME CMD...: poll CMD every 0.1 s
  local what=$1 name=$2; shift 2
  local deadline=$(( $(date +%s) + TIMEOUT ))
  until "$@" >/dev/null 2>&1; do
    if [ -n "$name" ] && ! alive "$name"; then
      tail -20 "$BASE/log/$name.stdout" "$BASE/log/$name.log" 2>/dev/null >&2 || true
      die "$name died while waiting for $what"
    fi
    [ "$(date +%s)" -lt "$deadline" ] || die "timed out waiting for $what"
    sleep 0.1
  done
}

# ---------------------------------------------------------------- hardware --
HOST=$(hostname -s)
# slurmd -C prints the topology exactly as slurmd will detect it.
read -r CPUS BOARDS SOCKETS CORES THREADS REALMEM < <(slurmd -C | head -1 |
  sed -E 's/.*CPUs=([0-9]+) Boards=([0-9]+) SocketsPerBoard=([0-9]+) CoresPerSocket=([0-9]+) ThreadsPerCore=([0-9]+) RealMemory=([0-9]+).*/\1 \2 \3 \4 \5 \6/')
[[ "$CPUS" =~ ^[0-9]+$ ]] || die "could not parse 'slurmd -C'"
MEM=$(( REALMEM * 90 / 100 ))            # leave slack so the node never drains for Low RealMemory
DEFMEM=$(( MEM / CPUS ))                  # so that CPUS one-CPU jobs fit side by side
if [ "$NODES" -gt 1 ]; then NODELIST="n[1-$NODES]"; NODENAMES=$(seq -f 'n%g' 1 "$NODES"); else NODELIST=$HOST; NODENAMES=$HOST; fi

# ------------------------------------------------------------------ cgroup --
use_cgroup=no
if [ "$CGROUP" != no ]; then
  # Slurm 22.05 cgroup/v1 needs writable freezer, cpuset, memory, devices hierarchies.
  probe=ok
  for c in freezer cpuset memory devices; do
    d=/sys/fs/cgroup/$c/slurm_local_probe.$$
    if mkdir "$d" 2>/dev/null; then rmdir "$d"; else probe=no; fi
  done
  if [ $probe = ok ]; then use_cgroup=yes
  elif [ "$CGROUP" = yes ]; then die "SLURM_LOCAL_CGROUP=yes but cgroup v1 hierarchies are not writable"
  else log "cgroup v1 not usable here: falling back to proctrack/linuxproc + task/affinity"; fi
fi

# ---------------------------------------------------------------- fake GPUs --
constrain_devices=no
gres_lines=""
if [ "$GPUS" -gt 0 ]; then
  mknod_ok=yes
  k=0
  for n in $NODENAMES; do
    mkdir -p "$BASE/dev/$n"
    for ((i = 0; i < GPUS; i++)); do
      f=$BASE/dev/$n/nvidia$i
      # char device, major 195 (nvidia), unique minor: Slurm can build device cgroups from it
      if [ ! -c "$f" ]; then rm -f "$f"; mknod "$f" c 195 $(( k * GPUS + i )) 2>/dev/null || mknod_ok=no; fi
    done
    k=$((k + 1))
  done
  if [ $mknod_ok = no ]; then
    # No CAP_MKNOD: symlinks to /dev/null still give CUDA_VISIBLE_DEVICES, but no device isolation.
    for n in $NODENAMES; do for ((i = 0; i < GPUS; i++)); do ln -sfn /dev/null "$BASE/dev/$n/nvidia$i"; done; done
  else
    constrain_devices=$use_cgroup
  fi
  for n in $NODENAMES; do
    gres_lines+="NodeName=$n Name=gpu Type=fake File=$BASE/dev/$n/nvidia[0-$((GPUS - 1))]"$'\n'
  done
fi

# ------------------------------------------------------------------ config --
if [ $use_cgroup = yes ]; then
  PROCTRACK=proctrack/cgroup; TASK=task/cgroup,task/affinity; GATHER=jobacct_gather/cgroup
else
  PROCTRACK=proctrack/linuxproc; TASK=task/affinity; GATHER=jobacct_gather/linux
fi
if [ "$ACCOUNTING" = 1 ]; then
  ACCT="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
AccountingStorageTRES=gres/gpu"
else
  ACCT="AccountingStorageType=accounting_storage/none"
fi
NODE_HW="CPUs=$CPUS Boards=$BOARDS SocketsPerBoard=$SOCKETS CoresPerSocket=$CORES ThreadsPerCore=$THREADS RealMemory=$MEM"
[ "$GPUS" -gt 0 ] && NODE_HW+=" Gres=gpu:fake:$GPUS"
[ -n "$FEATURES" ] && NODE_HW+=" Features=$FEATURES"
if [ "$NODES" -gt 1 ]; then
  # Debian's slurmd is built with --enable-multiple-slurmd: one slurmd per node, own port.
  NODE_LINE="NodeName=n[1-$NODES] NodeHostname=$HOST NodeAddr=127.0.0.1 Port=[$((SLURMD_PORT + 12))-$((SLURMD_PORT + 11 + NODES))] $NODE_HW State=UNKNOWN"
  # Virtual node names resolve to loopback, as real node names resolve to their hosts, so a job can
  # reach "the first node of the allocation" by name (for example a torchrun rendezvous endpoint).
  for i in $(seq 1 "$NODES"); do
    grep -qE "^[0-9.]+[[:space:]]+(.*[[:space:]])?n$i([[:space:]]|\$)" /etc/hosts 2>/dev/null || echo "127.0.0.1 n$i" >> /etc/hosts
  done
else
  NODE_LINE="NodeName=$HOST NodeHostname=$HOST NodeAddr=127.0.0.1 $NODE_HW State=UNKNOWN"
fi

new_conf=$(cat <<EOF
# Generated by start-slurm.sh - single-host test cluster. Do not edit by hand.
ClusterName=$CLUSTER
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$BASE/state
SlurmdSpoolDir=$BASE/spool/%n
SlurmctldPidFile=$BASE/run/slurmctld.pid
SlurmdPidFile=$BASE/run/slurmd-%n.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=$PROCTRACK
TaskPlugin=$TASK
JobAcctGatherType=$GATHER
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$DEFMEM
GresTypes=gpu
MpiDefault=none
ReturnToService=2
# Fast turnaround: batch jobs are scheduled on the next 1-s tick of slurmctld's
# background loop instead of after batch_sched_delay (default 3 s).
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_interval=5
# MinJobAge<=5 keeps 'sbatch --wait' polling every 2 s (else 2, 8, 32, 32 ... s).
MinJobAge=$MIN_JOB_AGE
KillWait=5
InactiveLimit=0
$ACCT
JobCompType=jobcomp/filetxt
JobCompLoc=$BASE/log/jobcomp.log
$NODE_LINE
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
)
new_cgroup=$(cat <<EOF
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
ConstrainCores=yes
ConstrainRAMSpace=yes
ConstrainDevices=$constrain_devices
EOF
)
new_gres="AutoDetect=off"$'\n'"$gres_lines"

conf_changed=no
write_if_changed() { # file content [mode]
  if [ ! -f "$1" ] || [ "$(cat "$1")" != "$(printf '%s\n' "$2")" ]; then printf '%s\n' "$2" > "$1"; conf_changed=yes; fi
  chmod "${3:-644}" "$1"
}
write_if_changed "$ETC/slurm.conf" "$new_conf"
write_if_changed "$ETC/cgroup.conf" "$new_cgroup"
write_if_changed "$ETC/gres.conf" "$new_gres"
if [ "$ACCOUNTING" = 1 ]; then
  write_if_changed "$ETC/slurmdbd.conf" "AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$BASE/run/slurmdbd.pid
LogFile=$BASE/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db" 600
fi

# If the config changed under running daemons of ours, restart the Slurm ones.
if [ $conf_changed = yes ]; then
  running=()
  for f in "$PIDS"/slurmctld.pid "$PIDS"/slurmd-*.pid; do
    [ -e "$f" ] || continue; n=$(basename "$f" .pid); alive "$n" && running+=("$n")
  done
  if [ ${#running[@]} -gt 0 ]; then
    log "configuration changed: restarting ${running[*]}"
    for n in "${running[@]}"; do kill "$(cat "$PIDS/$n.pid")" 2>/dev/null || true; done
    for n in "${running[@]}"; do for _ in $(seq 100); do alive "$n" || break; sleep 0.1; done; done
  fi
fi

# ------------------------------------------------------------------- munge --
if munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && ! alive munged; then
  log "using the munged that is already running (not ours, stop-slurm.sh leaves it alone)"
else
  if [ ! -s /etc/munge/munge.key ]; then
    log "creating /etc/munge/munge.key"
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
  fi
  chown munge:munge /etc/munge /etc/munge/munge.key; chmod 700 /etc/munge; chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown munge:munge /run/munge /var/lib/munge /var/log/munge; chmod 755 /run/munge
  launch munged setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged -F --force
  wait_for "munge" munged bash -c 'munge -n | unmunge'
fi

# ------------------------------------------------------- MariaDB + slurmdbd --
if [ "$ACCOUNTING" = 1 ]; then
  DB=$BASE/db
  if [ ! -d "$DB/data/mysql" ]; then
    log "initialising MariaDB datadir $DB/data"
    mkdir -p "$DB"
    mariadb-install-db --no-defaults --datadir="$DB/data" --user=root \
      --auth-root-authentication-method=normal --skip-test-db >"$BASE/log/mariadb-install.log" 2>&1 ||
      { tail -20 "$BASE/log/mariadb-install.log" >&2; die "mariadb-install-db failed"; }
  fi
  launch mariadbd "$(command -v mariadbd)" --no-defaults --datadir="$DB/data" --user=root \
    --bind-address=127.0.0.1 --port="$DB_PORT" --socket="$DB/mysqld.sock" --pid-file="$DB/mysqld.pid" \
    --log-error="$BASE/log/mariadbd.log" --skip-log-bin --innodb-buffer-pool-size=128M \
    --innodb-lock-wait-timeout=900 --skip-name-resolve
  wait_for "MariaDB" mariadbd mariadb-admin --no-defaults -S "$DB/mysqld.sock" -uroot ping
  mariadb --no-defaults -S "$DB/mysqld.sock" -uroot -e "
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
  launch slurmdbd slurmdbd -D
  wait_for "slurmdbd" slurmdbd bash -c "exec 3<>/dev/tcp/127.0.0.1/$DBD_PORT"
fi

# -------------------------------------------------------- slurmctld/slurmd --
ctld_started=no
alive slurmctld || ctld_started=yes
launch slurmctld slurmctld -D
wait_for "slurmctld" slurmctld scontrol ping
for n in $NODENAMES; do
  launch "slurmd-$n" slurmd -D -N "$n"
done

# Wait until every node is idle (or busy with jobs); resume nodes left drained/down by an earlier run.
deadline=$(( $(date +%s) + TIMEOUT ))
while :; do
  states=$(sinfo -h -N -o '%N %T' 2>/dev/null | sort -u || true)
  if [ -n "$states" ] && ! grep -qvE ' (idle|mixed|allocated|completing|planned)$' <<<"$states"; then break; fi
  for n in $NODENAMES; do alive "slurmd-$n" || { tail -20 "$BASE/log/slurmd-$n.log" "$BASE/log/slurmd-$n.stdout" >&2 2>/dev/null; die "slurmd-$n died"; }; done
  for n in $(awk '$2 ~ /drain|down|fail/ && $2 !~ /\*/ {print $1}' <<<"$states"); do
    scontrol update NodeName="$n" State=RESUME 2>/dev/null || true
  done
  [ "$(date +%s)" -lt "$deadline" ] || { echo "$states" >&2; die "timed out waiting for idle nodes"; }
  sleep 0.1
done
if [ $ctld_started = yes ] && [ "$WARMUP" != none ]; then
  # End-to-end check of step launch (munge credentials, slurmstepd, cgroups, binding).
  timeout 30 srun -n1 -J slurm-local-check true || die "test 'srun true' failed"
  wid=$(sbatch --parsable -J slurm-local-warmup -o /dev/null --wrap true) || die "test sbatch failed"
  if [ "$WARMUP" = wait ]; then
    wait_for "warm-up batch job $wid" "" bash -c "scontrol show job -o $wid 2>/dev/null | grep -q 'JobState=COMPLETED' || { ! squeue -h -j $wid 2>/dev/null | grep -q .; }"
    log "scheduler warmed up (job $wid)"
  fi
fi
log "cluster '$CLUSTER' ready: nodes $NODELIST, $CPUS CPUs/node, gpus/node=$GPUS, cgroup=$use_cgroup, accounting=$ACCOUNTING"
sinfo -N -o '%N %P %T %c %m %G' >&2
