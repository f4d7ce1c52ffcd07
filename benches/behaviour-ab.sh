#!/usr/bin/env bash
# Routing behaviour of two builds side by side, for a change to the router that should change
# no decision's outcome: each routing benchmark below with the headroom policy alone, before
# then after, RUNS times, so that both builds see the same machine hour by hour. Every run
# offers the same arrivals (each script's seed 1): runs differ by timing only, and their spread
# is the spread a difference between the builds must exceed to mean anything.
#   goodput    the default fleet, 1 s / 25 tok/s, at 4, 8, 12 req/s, 30 s each
#   noisy      the noisy fleet at its marginal SLO (1 s / 35 tok/s), at 2, 4, 6 req/s
#   shared     a batching and a serial engine on one device (1 s / 35 tok/s), at 1, 2, 3 req/s
#   bend       the H200's two engines copied into the simulator (1 s / 30 tok/s), 2, 4, 6 req/s
#   overload   the default fleet past its capacity, at 16 and 20 req/s
#   traces     the Mooncake and Azure replays on the conversations fleet
#   convo      conversations on shared system prompts, the hot workload, at 4 and 8 req/s
#   coldstart  a fresh gateway at 16 req/s from its first second (the slow start)
#   replicas   eight replicas sharing state through a local Redis, uneven split, at 20 req/s
#   tenants    a noisy neighbour: tenant A at three times its share, fair lines, one gateway
# Each log goes to target/behaviour-ab/NAME-ARM-RUN.log; benches/behaviour_table.py reads them.
#
# Usage: benches/behaviour-ab.sh BEFORE_BIN AFTER_BIN [RUNS=3] [NAMES...]
# Needs the ports of the scripts it runs free. About 20 minutes per build per run.
set -euo pipefail
cd "$(dirname "$0")/.."
before=$1
after=$2
runs=${3:-3}
shift $(( $# < 3 ? $# : 3 ))
names=${*:-goodput noisy shared bend overload traces convo coldstart replicas tenants}
out=target/behaviour-ab
mkdir -p "$out"
one() { # name binary
  local bin=$1
  case $name in
    goodput) SPLICE=0 BIN=$bin benches/goodput.sh 1 4,8,12 30 headroom ;;
    noisy) FLEET=noisy SLO_TPS=35 SPLICE=0 BIN=$bin benches/goodput.sh 1 2,4,6 30 headroom ;;
    shared) FLEET=shared SLO_TPS=35 WARMUP_RATE=2 SPLICE=0 BIN=$bin \
      benches/goodput.sh 1 1,2,3 30 headroom ;;
    bend) FLEET=bend SLO_TPS=30 WARMUP_RATE=2 SPLICE=0 BIN=$bin \
      benches/goodput.sh 1 2,4,6 30 headroom ;;
    overload) SPLICE=0 BIN=$bin benches/goodput.sh 1 16,20 30 headroom ;;
    traces) BIN=$bin benches/traces.sh 1 headroom ;;
    convo) WORKLOADS=hot SPLICE=0 BIN=$bin benches/conversations.sh 1 4,8 20 index ;;
    coldstart) BIN=$bin SPLICE=0 benches/coldstart.sh 1 ramp ;;
    replicas) SPLICE=0 BIN=$bin benches/replicas.sh 1 20 30 eight-cluster ;;
    tenants) SPLICE=0 BIN=$bin benches/tenants.sh 1 60 fair ;;
    *) echo "unknown benchmark $name" >&2; exit 2 ;;
  esac
}
for run in $(seq "$runs"); do
  for arm in before after; do
    bin=$before; [ "$arm" = after ] && bin=$after
    for name in $names; do
      echo "$(date -u +%H:%M:%S) $name $arm $run" >&2
      one "$bin" >"$out/$name-$arm-$run.log" 2>&1 || echo "  failed: see $out/$name-$arm-$run.log" >&2
    done
  done
done
