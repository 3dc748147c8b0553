#!/usr/bin/env bash
# A small cluster of real hosts on this machine: each host is a Linux network
# namespace with its own hostname (UTS), System V IPC and /dev/shm (a mount
# namespace with a private tmpfs), joined to the others by a veth pair on one
# bridge. Ranks of one host share memory; ranks of different hosts talk over
# TCP through the kernel's network stack. `tc` shapes each host's link (rate
# with tbf, delay and loss with netem where the kernel has it), `cut` takes a
# link down and `heal` brings it back. MPICH's hydra launches across the hosts
# exactly as on a cluster: a host file, and a launcher that enters a host's
# namespaces where it would ssh to it.
#
#   scripts/cluster.sh up N [--rate 1gbit] [--delay 1ms] [--loss 0.1%] [--cpus]
#                                    # N hosts px0..pxN-1 at 198.18.0.1..N; again: rebuilt;
#                                    # --cpus: each host's processes on CPUs of its own
#                                    # (nproc / N each, at least one; taskset)
#   scripts/cluster.sh shape HOST [--rate R|none] [--delay D] [--loss L]   # while a job runs
#   scripts/cluster.sh cut HOST | heal HOST   # HOST: px1 or 1
#   scripts/cluster.sh run [--ppn K] -- <mpiexec arguments>   # hydra across the hosts
#   scripts/cluster.sh mpiexec-line   # the mpiexec line to use by hand
#   scripts/cluster.sh exec HOST -- <command>   # a command inside a host
#   scripts/cluster.sh pids HOST      # the processes running inside a host (holder excluded)
#   scripts/cluster.sh status
#   scripts/cluster.sh down           # removes every namespace, link and mount it made
#   scripts/cluster.sh check          # exit 0 if namespaces can be made here, else say why (exit 2)
#
# Needs root (CI runs as root). Addresses are taken from 198.18.0.0/24 (the
# benchmarking range, RFC 2544) on a bridge of this machine's own: no traffic
# leaves the machine. State lives in $PARALLAX_CLUSTER_DIR (default
# /run/parallax-cluster); `down` also finds what a killed run left behind
# without it (holders by their process name, links by their prefix).
set -euo pipefail

state="${PARALLAX_CLUSTER_DIR:-/run/parallax-cluster}"
bridge=pxbr0
net=198.18.0
holder_name=parallax-cluster-host
no_netem="this kernel has no netem qdisc (tc qdisc add ... netem: unknown qdisc): --delay and --loss cannot be shaped here; --rate can (tbf)"

die() {
  echo "cluster.sh: $*" >&2
  exit 2
}

# Why namespaces cannot be made here, or nothing.
why_not() {
  [ "$(id -u)" -eq 0 ] || {
    echo "needs root (network namespaces, veth links and tc need CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    return
  }
  local t
  for t in unshare nsenter ip tc mpiexec; do
    command -v "$t" >/dev/null || {
      echo "needs $t on PATH"
      return
    }
  done
  local err
  if ! err=$(unshare --net --uts --ipc --mount --fork --propagation private \
    sh -c 'mount -t tmpfs tmpfs /dev/shm && ip link add pxprobe0 type veth peer name pxprobe1' 2>&1); then
    echo "network namespaces are not permitted here (unshare --net --uts --ipc --mount: ${err:-failed}); in a container, run it with --privileged or CAP_SYS_ADMIN + CAP_NET_ADMIN"
    return
  fi
  if ! err=$(ip link add pxprobe type bridge 2>&1); then
    echo "cannot create a bridge in this namespace (ip link add type bridge: $err)"
    return
  fi
  ip link del pxprobe 2>/dev/null || true
}

have_netem() {
  unshare --net sh -c 'ip link set lo up && tc qdisc add dev lo root netem delay 1ms' >/dev/null 2>&1
}

host_index() {
  local h="${1#px}"
  [[ "$h" =~ ^[0-9]+$ ]] || die "no host '$1': hosts are px0, px1, ... (or 0, 1, ...)"
  [ -f "$state/host$h.pid" ] || die "no host px$h (is the cluster up? scripts/cluster.sh status)"
  echo "$h"
}

holder_pid() { cat "$state/host$1.pid"; }

in_host() {
  local i="$1"
  shift
  nsenter -t "$(holder_pid "$i")" --net --uts --ipc --mount -- "$@"
}

# tbf needs a bucket of at least one packet (veth passes GSO packets of up to
# 64 KiB) and of about a millisecond of the rate, or it drops and the rate
# falls short of what was asked.
tbf_args() {
  local rate="$1"
  echo "tbf rate $rate burst 256kb latency 100ms"
}

# Shape one host's link both ways: its eth0 (host -> bridge, egress) and the
# bridge side of the pair (bridge -> host). A rate of "none" removes the limit.
apply_shape() {
  local i="$1" rate="$2" delay="$3" loss="$4"
  local dev qdisc
  if [ -n "$delay$loss" ]; then
    have_netem || die "$no_netem"
  fi
  for side in host bridge; do
    if [ "$side" = host ]; then
      run_tc() { in_host "$i" tc "$@"; }
      dev=eth0
    else
      run_tc() { tc "$@"; }
      dev="pxv$i"
    fi
    run_tc qdisc del dev "$dev" root 2>/dev/null || true
    if [ -n "$delay$loss" ]; then
      qdisc="netem${delay:+ delay $delay}${loss:+ loss $loss}"
      run_tc qdisc add dev "$dev" root handle 1: $qdisc
      if [ -n "$rate" ] && [ "$rate" != none ]; then run_tc qdisc add dev "$dev" parent 1: handle 2: $(tbf_args "$rate"); fi
    elif [ -n "$rate" ] && [ "$rate" != none ]; then
      run_tc qdisc add dev "$dev" root $(tbf_args "$rate")
    fi
  done
  printf '%s %s %s\n' "${rate:-none}" "${delay:-0}" "${loss:-0}" >"$state/host$i.shape"
}

parse_shape() {
  rate="" delay="" loss=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --rate) rate="${2:?--rate needs a value, e.g. 1gbit}"; shift 2 ;;
      --delay) delay="${2:?--delay needs a value, e.g. 1ms}"; shift 2 ;;
      --loss) loss="${2:?--loss needs a value, e.g. 0.1%}"; shift 2 ;;
      *) die "unknown option '$1' (expected --rate, --delay, --loss)" ;;
    esac
  done
}

cmd_down() {
  # Everything running inside a host dies with it: ranks, proxies, holders.
  local pid
  for pid in $(pgrep -f "^$holder_name" || true); do
    local ns
    ns=$(readlink "/proc/$pid/ns/net" 2>/dev/null) || continue
    for p in /proc/[0-9]*; do
      [ "$(readlink "$p/ns/net" 2>/dev/null)" = "$ns" ] && kill -9 "${p#/proc/}" 2>/dev/null || true
    done
  done
  # hydra's mpiexec runs outside the hosts: end those launched by `run`.
  if [ -f "$state/mpiexec.pids" ]; then
    while read -r pid; do kill -9 "$pid" 2>/dev/null || true; done <"$state/mpiexec.pids"
  fi
  local link
  for link in $(ip -o link show 2>/dev/null | sed -n 's/^[0-9]*: \(pxv[0-9]*\)[@:].*/\1/p'); do
    ip link del "$link" 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
  rm -rf "$state"
  # A namespace goes when its last process has gone; wait until they have.
  local tries=0
  while pgrep -f "^$holder_name" >/dev/null && [ $tries -lt 50 ]; do
    sleep 0.1
    tries=$((tries + 1))
  done
}

cmd_up() {
  local n="${1:-}"
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 250 ] || die "up needs a host count from 1 to 250, e.g. 'up 2'"
  shift
  local pin="" shape=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --cpus) pin=1; shift ;;
      *) shape+=("$1"); shift ;;
    esac
  done
  parse_shape ${shape[@]+"${shape[@]}"}
  local why
  why=$(why_not)
  [ -z "$why" ] || die "cannot make hosts here: $why"
  if [ -n "$delay$loss" ]; then have_netem || die "$no_netem"; fi
  cmd_down
  mkdir -p "$state"
  ip link add "$bridge" type bridge
  ip addr add "$net.254/24" dev "$bridge"
  ip link set "$bridge" up
  local i
  for i in $(seq 0 $((n - 1))); do
    # The holder keeps the namespaces alive and is what `run` enters; its
    # process name lets `down` find it even when the state folder is gone.
    unshare --net --uts --ipc --mount --fork --propagation private \
      bash -c "hostname px$i && mount -t tmpfs -o mode=1777 tmpfs /dev/shm && exec -a $holder_name-$i sleep infinity" \
      </dev/null >/dev/null 2>&1 &
    local parent=$! pid="" tries=0
    while [ -z "$pid" ] && [ $tries -lt 100 ]; do
      pid=$(pgrep -P "$parent" -f "^$holder_name-$i( |$)" || true)
      [ -n "$pid" ] || sleep 0.05
      tries=$((tries + 1))
    done
    [ -n "$pid" ] || die "host px$i did not start"
    echo "$pid" >"$state/host$i.pid"
    ip link add "pxv$i" type veth peer name "pxv${i}h"
    ip link set "pxv${i}h" netns "$pid"
    ip link set "pxv$i" master "$bridge" up
    in_host "$i" sh -c "ip link set lo up && ip link set pxv${i}h name eth0 && ip addr add $net.$((i + 1))/24 dev eth0 && ip link set eth0 up"
    echo "px$i $net.$((i + 1))" >>"$state/hosts.txt"
    apply_shape "$i" "$rate" "$delay" "$loss"
    if [ -n "$pin" ]; then
      # Hosts of their own cores, as real machines have: host i gets CPUs
      # [i x per, (i + 1) x per) with per = nproc / N (one each, shared
      # round the CPUs, when there are more hosts than CPUs).
      local ncpu per first
      ncpu=$(nproc)
      per=$((ncpu / n))
      [ "$per" -ge 1 ] || per=1
      first=$(((i * per) % ncpu))
      echo "$first-$((first + per - 1))" >"$state/host$i.cpus"
    fi
  done
  # The launcher hydra calls where it would call ssh: `enter -x HOST CMD`.
  cat >"$state/enter" <<EOF
#!/bin/sh
# hydra's ssh stand-in: $state/enter [ssh options] HOST COMMAND...
while [ \$# -gt 0 ]; do case "\$1" in -*) shift ;; *) break ;; esac; done
host="\$1"; shift
i="\${host#px}"
[ -f "$state/host\$i.pid" ] || { echo "cluster: no host \$host" >&2; exit 255; }
pin=""
[ -f "$state/host\$i.cpus" ] && pin="taskset -c \$(cat "$state/host\$i.cpus")"
exec nsenter -t "\$(cat "$state/host\$i.pid")" --net --uts --ipc --mount -- \$pin sh -c "\$*"
EOF
  chmod +x "$state/enter"
  echo "$n" >"$state/size"
  echo "cluster: $n hosts up (px0..px$((n - 1)), $net.1..$net.$n, bridge $bridge at $net.254), link ${rate:-unshaped}${delay:+, delay $delay}${loss:+, loss $loss}${pin:+, CPUs $(cat "$state"/host*.cpus | tr '\n' ' ' | sed 's/ $//')}"
}

require_up() { [ -f "$state/size" ] || die "the cluster is not up: scripts/cluster.sh up N"; }

# The host file for `ppn` slots per host.
hostfile() {
  local ppn="$1" f="$state/hosts.$1"
  local i
  : >"$f"
  for i in $(seq 0 $(($(cat "$state/size") - 1))); do echo "px$i:$ppn" >>"$f"; done
  echo "$f"
}

mpiexec_args() {
  local ppn="$1"
  echo -f "$(hostfile "$ppn")" -launcher ssh -launcher-exec "$state/enter" -iface "$bridge"
}

cmd_run() {
  require_up
  local ppn=1
  while [ $# -gt 0 ]; do
    case "$1" in
      --ppn) ppn="${2:?--ppn needs a count}"; shift 2 ;;
      --) shift; break ;;
      *) die "run: unknown option '$1' (run [--ppn K] -- <mpiexec arguments>)" ;;
    esac
  done
  # -ppn places consecutive ranks on a host, as on a cluster; hydra takes the
  # last -ppn given, so the caller's wins over this default.
  # shellcheck disable=SC2046
  mpiexec $(mpiexec_args "$ppn") -ppn "$ppn" "$@" &
  local pid=$!
  echo "$pid" >>"$state/mpiexec.pids"
  local rc=0
  wait "$pid" || rc=$?
  return "$rc"
}

cmd_status() {
  if [ ! -f "$state/size" ]; then
    echo "cluster: down"
    return
  fi
  echo "cluster: $(cat "$state/size") hosts, bridge $bridge ($net.254)"
  local i
  while read -r name addr; do
    i="${name#px}"
    local link=up
    ip -o link show "pxv$i" | grep -Eq '[<,]UP[,>]' || link=down
    echo "  $name $addr link $link shape(rate delay loss) $(cat "$state/host$i.shape") processes $(cmd_pids "$i" | wc -w)"
  done <"$state/hosts.txt"
}

cmd_pids() {
  local i
  i=$(host_index "$1")
  local holder parent ns p out=()
  holder=$(holder_pid "$i")
  parent=$(ps -o ppid= -p "$holder" | tr -d ' ')  # unshare, which entered the namespaces before forking
  ns=$(readlink "/proc/$holder/ns/net")
  for p in /proc/[0-9]*; do
    [ "${p#/proc/}" = "$holder" ] || [ "${p#/proc/}" = "$parent" ] && continue
    [ "$(readlink "$p/ns/net" 2>/dev/null)" = "$ns" ] && out+=("${p#/proc/}")
  done
  echo "${out[@]:-}"
}

main() {
  local cmd="${1:-}"
  [ $# -gt 0 ] && shift
  case "$cmd" in
    check)
      local why
      why=$(why_not)
      if [ -n "$why" ]; then
        echo "cluster.sh: cannot make hosts here: $why"
        exit 2
      fi
      have_netem && echo "cluster.sh: namespaces available; netem available" ||
        echo "cluster.sh: namespaces available; no netem in this kernel (rate only: tbf)"
      ;;
    up) cmd_up "$@" ;;
    down) cmd_down ;;
    shape)
      require_up
      local i
      i=$(host_index "${1:?shape needs a host}")
      shift
      parse_shape "$@"
      apply_shape "$i" "$rate" "$delay" "$loss"
      ;;
    cut | heal)
      require_up
      local i
      i=$(host_index "${1:?$cmd needs a host}")
      ip link set "pxv$i" "$([ "$cmd" = cut ] && echo down || echo up)"
      ;;
    run) cmd_run "$@" ;;
    mpiexec-line)
      require_up
      echo "mpiexec $(mpiexec_args "${1:-1}") -ppn ${1:-1}"
      ;;
    exec)
      require_up
      local i
      i=$(host_index "${1:?exec needs a host}")
      shift
      [ "${1:-}" = -- ] && shift
      in_host "$i" "$@"
      ;;
    pids) require_up; cmd_pids "${1:?pids needs a host}" ;;
    status) cmd_status ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
  esac
}

main "$@"
