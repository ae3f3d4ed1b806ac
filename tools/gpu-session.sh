#!/usr/bin/env bash
# One device session in one call: environment, build, verify, GPU tests, bench. Logs land in $OUT
# (or ./gpu-out). Usage: tools/gpu-session.sh [KERNEL ...]   (default: all)
#   KDT_STEPS="env build verify tests bench"  choose steps (also: graph, emu);  KDT_BENCH_ARGS="--quick"  extra
#   bench options. emu: verify (eager and graph) and bench the sm_120 configuration (--arch sm_120-emu) against sm_90a.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
kernels=${*:-all}
steps=${KDT_STEPS:-env build verify tests bench}
export PYTHONUNBUFFERED=1 COLUMNS=160
status=0
run() {  # name, command...
  local name=$1; shift
  echo "=== $name: $*"
  "$@" 2>&1 | tee "$out/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name exit $rc"
  [ "$rc" -eq 0 ] || status=1
}
for step in $steps; do
  case $step in
    env) run env python3 -m kdt env-check --arch sm_90 --require-gpu ;;
    build) run build python3 -m kdt build $kernels --arch sm_90a --arch sm_120 --arch sm_120-emu ;;
    verify) run verify python3 -m kdt verify $kernels --json "$out/verify.json" --junit "$out/verify.xml" ;;
    graph) run graph python3 -m kdt verify $kernels --graph ;;
    tests) run tests python3 -m pytest -q -m gpu -x --no-header -p no:cacheprovider ;;
    bench) run bench python3 -m kdt bench $kernels ${KDT_BENCH_ARGS:-} --json "$out/bench.json" ;;
    emu) run emu-verify python3 -m kdt verify $kernels --arch sm_120-emu --sms 70
         run emu-graph python3 -m kdt verify $kernels --arch sm_120-emu --sms 188 --graph
         run emu-bench python3 -m kdt bench $kernels --no-baselines --arch sm_90a --arch sm_120-emu ${KDT_BENCH_ARGS:-} \
             --json "$out/bench-emu.json" ;;
  esac
done
exit $status
