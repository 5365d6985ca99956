#!/usr/bin/env bash
# Multi-host MPI on one machine. Each simulated host is a Linux network namespace (tessera-h0,
# tessera-h1, ...) with its own hostname (UTS namespace) and address 10.213.7.(i+1)/24 on a veth
# plugged into a bridge in a switch namespace (tessera-sw); the root namespace is not touched.
# mpirun starts in tessera-h0 and launches one orted per other host through this script as its
# rsh agent (`ip netns exec`), so OpenMPI sees N nodes and ranks on different hosts can only
# talk over TCP (btl self,tcp on the namespaces' subnet; no shared memory between hosts).
# Why: `mpirun -np N` on one machine never exercises Tessera's MPI backend across nodes
# (host topology from MPI_Comm_split_type/processor names, TCP-only transport, remote daemons).
#
#   scripts/multihost.sh check       can it run here? Prints why not and exits 1, else exits 0
#   scripts/multihost.sh run [--hosts N] [--ranks-per-host M] [--timeout S] -- PROGRAM [ARGS...]
#                                    N hosts (2) x M ranks (2); exits with the program's status
#
# Needs root, iproute2 (`ip`), util-linux (unshare, flock), hostname and OpenMPI's mpirun.
# Setup is idempotent (leftover tessera-* namespaces from a killed run are removed first) and
# everything (namespaces, veths, bridge, temp files) is removed on exit, failure or Ctrl-C.
# Runs are serialised by a machine-wide lock (/run/lock/tessera-multihost.lock). TESSERA_* and GTEST_* variables reach every rank
# (mpirun -x).
set -euo pipefail

readonly HOST_PREFIX=tessera-h
readonly SWITCH_NS=tessera-sw
readonly NET=10.213.7            # hosts are $NET.1, $NET.2, ...
readonly CIDR=$NET.0/24
SELF=$(readlink -f "${BASH_SOURCE[0]}")
readonly SELF

die() { echo "multihost: $*" >&2; exit 2; }

# Runs argv inside host i: its network namespace, a fresh UTS namespace named after it and a
# TMPDIR of its own (OpenMPI's session directories), so hosts share nothing but the filesystem.
in_host() {
  local i=$1
  shift
  # shellcheck disable=SC2016  # $0 and $@ belong to the inner shell
  ip netns exec "$HOST_PREFIX$i" env TMPDIR="$MULTIHOST_DIR/$HOST_PREFIX$i" \
    unshare --uts -- /bin/sh -c 'hostname "$0" && exec "$@"' "$HOST_PREFIX$i" "$@"
}

# Why multi-host cannot run here (empty when it can).
why_not() {
  [[ $(id -u) -eq 0 ]] || { echo "not root (network namespaces need root)"; return; }
  local tool
  for tool in ip unshare hostname flock mpirun; do
    command -v "$tool" >/dev/null 2>&1 || { echo "'$tool' not found"; return; }
  done
  local probe=tessera-probe-$$ err
  if ! err=$(ip netns add "$probe" 2>&1); then
    echo "'ip netns add' fails: ${err:-no message}"
    return
  fi
  if ! err=$( { ip netns exec "$probe" ip link set lo up &&
                ip -n "$probe" link add p0 type veth peer name p1 &&
                ip -n "$probe" link add b0 type bridge; } 2>&1); then
    echo "cannot create veth/bridge links in a namespace: ${err:-no message}"
  elif ! err=$(ip netns exec "$probe" unshare --uts -- hostname "$probe" 2>&1); then
    echo "cannot give a namespace its own hostname (unshare --uts): ${err:-no message}"
  fi
  ip netns del "$probe" 2>/dev/null || true
}

our_namespaces() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^(${HOST_PREFIX}[0-9]+|$SWITCH_NS)\$" || true
}

# Removes every tessera-h*/tessera-sw namespace; ends processes still inside them first (only
# ever ours: orteds or ranks left by a killed job). Deleting a namespace deletes its links.
teardown() {
  local ns pids
  for ns in $(our_namespaces); do
    pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
    if [[ -n "${pids// /}" ]]; then
      # shellcheck disable=SC2086
      kill -TERM $pids 2>/dev/null || true
      sleep 1
      pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
      # shellcheck disable=SC2086
      [[ -z "${pids// /}" ]] || kill -KILL $pids 2>/dev/null || true
    fi
    ip netns del "$ns" 2>/dev/null || true
  done
}

setup() {
  local hosts=$1 i ns
  teardown
  ip netns add "$SWITCH_NS"
  ip -n "$SWITCH_NS" link set lo up
  ip -n "$SWITCH_NS" link add br0 type bridge
  ip -n "$SWITCH_NS" link set br0 up
  for ((i = 0; i < hosts; i++)); do
    ns=$HOST_PREFIX$i
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    # veth pair created across namespaces: port h$i on the switch, eth0 in the host.
    ip -n "$SWITCH_NS" link add "h$i" type veth peer name eth0 netns "$ns"
    ip -n "$SWITCH_NS" link set "h$i" master br0 up
    ip -n "$ns" addr add "$NET.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    mkdir -p "$MULTIHOST_DIR/$ns"
  done
  for ((i = 0; i < hosts; i++)); do  # veths come up at once; wait a little if they do not
    local tries=50
    until [[ $(ip netns exec "$HOST_PREFIX$i" cat /sys/class/net/eth0/operstate) == up ]]; do
      ((--tries > 0)) || die "eth0 of $HOST_PREFIX$i does not come up"
      sleep 0.1
    done
  done
}

# Bytes each host's eth0 sent and received: shows the job's traffic really crossed hosts.
traffic() {
  local hosts=$1 i line=""
  for ((i = 0; i < hosts; i++)); do
    local tx rx
    tx=$(ip netns exec "$HOST_PREFIX$i" cat /sys/class/net/eth0/statistics/tx_bytes 2>/dev/null) || return 0
    rx=$(ip netns exec "$HOST_PREFIX$i" cat /sys/class/net/eth0/statistics/rx_bytes 2>/dev/null) || return 0
    line+=" $HOST_PREFIX$i tx $((tx / 1024)) KiB rx $((rx / 1024)) KiB;"
  done
  echo "multihost: TCP traffic between hosts:${line%;}"
}

cmd_run() {
  local hosts=2 per_host=2 timeout=
  while [[ $# -gt 0 ]]; do
    case $1 in
      --hosts) hosts=${2:?--hosts needs a value}; shift 2 ;;
      --ranks-per-host) per_host=${2:?--ranks-per-host needs a value}; shift 2 ;;
      --timeout) timeout=${2:?--timeout needs a value}; shift 2 ;;
      --) shift; break ;;
      *) die "unknown option '$1' (usage: $0 run [--hosts N] [--ranks-per-host M] [--timeout S] -- PROGRAM [ARGS...])" ;;
    esac
  done
  [[ $# -gt 0 ]] || die "run: no program given (usage: $0 run [options] -- PROGRAM [ARGS...])"
  [[ $hosts =~ ^[1-9][0-9]?$ && $hosts -le 200 ]] || die "--hosts must be 1..200, not '$hosts'"
  [[ $per_host =~ ^[1-9][0-9]*$ ]] || die "--ranks-per-host must be a positive integer, not '$per_host'"
  [[ -z $timeout || $timeout =~ ^[1-9][0-9]*$ ]] || die "--timeout must be a positive integer, not '$timeout'"
  local reason
  reason=$(why_not)
  [[ -z $reason ]] || die "cannot run: $reason"

  # One run at a time on this machine (namespace names are fixed), whichever checkout it comes
  # from: a machine-wide lock file; the lock goes with the process.
  local lock=/run/lock
  [[ -d $lock && -w $lock ]] || lock=/tmp
  exec 9>>"$lock/tessera-multihost.lock"
  flock -n 9 || { echo "multihost: waiting for another run to finish" >&2; flock 9; }

  MULTIHOST_DIR=$(mktemp -d "${TMPDIR:-/tmp}/tessera-multihost.XXXXXX")
  export MULTIHOST_DIR
  local job=""
  # shellcheck disable=SC2317  # invoked by the traps
  cleanup() {
    trap - EXIT INT TERM HUP
    if [[ -n $job ]] && kill -0 "$job" 2>/dev/null; then
      kill -TERM "$job" 2>/dev/null || true
      wait "$job" 2>/dev/null || true
    fi
    teardown
    rm -rf "$MULTIHOST_DIR"
  }
  trap cleanup EXIT
  trap 'echo "multihost: interrupted" >&2; cleanup; exit 130' INT
  trap 'cleanup; exit 143' TERM HUP

  setup "$hosts"
  local i hostfile=$MULTIHOST_DIR/hostfile
  for ((i = 0; i < hosts; i++)); do echo "$NET.$((i + 1)) slots=$per_host"; done >"$hostfile"

  local forward=() name
  for name in $(compgen -e | grep -E '^(TESSERA|GTEST)_' || true); do forward+=(-x "$name"); done
  # shellcheck disable=SC2054  # the commas belong to MCA values
  local mpirun_args=(
    -np $((hosts * per_host)) --hostfile "$hostfile" --map-by slot --bind-to none --oversubscribe
    --mca plm_rsh_agent "$SELF rsh-agent" --mca plm_rsh_no_tree_spawn 1
    --mca pml ob1 --mca btl self,tcp --mca osc ^ucx
    --mca btl_tcp_if_include "$CIDR" --mca oob_tcp_if_include "$CIDR"
    --mca mpi_yield_when_idle 1
    ${timeout:+--timeout "$timeout"} "${forward[@]}"
  )
  echo "multihost: $hosts hosts x $per_host ranks ($CIDR, TCP only): mpirun ${mpirun_args[*]} $*" >&2
  local status=0 started=$SECONDS
  # In the background so that a signal to this script runs the cleanup at once.
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 in_host 0 mpirun "${mpirun_args[@]}" "$@" </dev/null &
  job=$!
  wait "$job" || status=$?
  job=""
  echo "multihost: exit status $status after $((SECONDS - started))s" >&2
  traffic "$hosts" >&2
  exit "$status"
}

# OpenMPI's rsh agent: `rsh-agent HOST COMMAND...` runs the orted command line (a shell string,
# as ssh would hand it to the remote shell) inside HOST's namespace. HOST is $NET.k or tessera-hI.
cmd_rsh_agent() {
  local host=${1:?rsh-agent: no host}
  shift
  local i
  if [[ $host =~ ^${NET//./\\.}\.([0-9]+)$ ]]; then
    i=$((BASH_REMATCH[1] - 1))
  elif [[ $host =~ ^$HOST_PREFIX([0-9]+)$ ]]; then
    i=${BASH_REMATCH[1]}
  else
    die "rsh-agent: unknown host '$host'"
  fi
  [[ -n ${MULTIHOST_DIR:-} ]] || die "rsh-agent: only mpirun under '$0 run' calls it"
  in_host "$i" /bin/sh -c "$*"
}

case ${1:-} in
  check)
    reason=$(why_not)
    if [[ -n $reason ]]; then
      echo "multihost: cannot run: $reason"
      exit 1
    fi
    echo "multihost: ok (root, ip netns, veth, bridge, unshare --uts, mpirun)"
    ;;
  run) shift; cmd_run "$@" ;;
  rsh-agent) shift; cmd_rsh_agent "$@" ;;
  *) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$SELF" >&2; exit 2 ;;
esac
