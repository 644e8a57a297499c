# Sourced by start-slurm.sh and stop-slurm.sh: the PID records of the daemons start-slurm.sh started.
# Needs $PIDS (the folder of NAME.pid files).

# alive NAME: true if $PIDS/NAME.pid names a live (non-zombie) process with the expected name.
alive() {
  local f="$PIDS/$1.pid" pid st
  [ -s "$f" ] || return 1
  pid=$(cat "$f")
  [ -r "/proc/$pid/stat" ] || return 1
  st=$(sed 's/^.*) //' "/proc/$pid/stat" | cut -d' ' -f1)
  [ "$st" != Z ] && [ "$st" != X ] || return 1
  case "$(cat "/proc/$pid/comm" 2>/dev/null)" in   # guard against PID reuse
    "${1%%-*}"|setsid|setpriv) return 0 ;; *) return 1 ;;
  esac
}
