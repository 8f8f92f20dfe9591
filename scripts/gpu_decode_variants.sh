#!/usr/bin/env bash
# Decode kernel variants side by side on a Hopper GPU machine (docs/perf-log.md, decode):
#   1. the GPU decode tests for every kernel variant, each with and without
#      programmatic dependent launch (PDL), summarised per variant;
#   2. the A/B benchmark: every variant side by side in one process on the same
#      buffers, graph replays interleaved, with memcpy / in-place RMW / empty-kernel
#      reference columns and the machine's measured copy bandwidth
#      (N ∈ {1, 8, 64, 256, 1024}, H = 32, fp32 and bf16 pools);
#   3. with --ncu: Nsight Compute on one N = 1 step (fp32 pool, H = 32) of each
#      variant in NCU_VARIANTS (default lat): duration and active cycles;
#   4. compute-sanitizer memcheck + racecheck on small decode cases, every variant.
# TIME_LIMIT_S (optional; unset: no limit) bounds the whole run in seconds: each
# step then gets a share of the time left, and a step with too little left is
# skipped. Logs, JSON and the tables go to RESULTS_DIR (default ./gpu-results).
#
#   [VARIANTS=lat,fuse-ef-occ,...] [NCU_VARIANTS="lat fuse-ef-occ"] \
#     scripts/gpu_decode_variants.sh BUILD_DIR [--no-sanitizer] [--ncu] [--bench-args "..."]
#
# BUILD_DIR should hold a built flashkda_gpu_tests and flashkda-bench-decode;
# when they are missing, only those two targets are built (configuring a fresh
# Release build there if BUILD_DIR has no CMakeCache.txt), within TIME_LIMIT_S.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR [--no-sanitizer] [--bench-args \"...\"]" >&2; exit 2; }
BUILD="$1"
shift
OUT=${RESULTS_DIR:-$root/gpu-results}
mkdir -p "$OUT"
sanitizer=1
ncu_n1=0
bench_args=""
while [ $# -gt 0 ]; do
  case "$1" in
    --no-sanitizer) sanitizer=0 ;;
    --ncu) ncu_n1=1 ;;
    --bench-args) bench_args="$2"; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
# Without TIME_LIMIT_S every step runs to its end, except the ncu runs (60 s each),
# which bound a hang.
limited=0
[ -n "${TIME_LIMIT_S:-}" ] && limited=1
deadline=$((SECONDS + ${TIME_LIMIT_S:-0}))
left() { echo $((deadline - SECONDS)); }
# `timeout T cmd` when limited, plain `cmd` otherwise.
bounded() {
  local t="$1"
  shift
  if [ $limited -eq 1 ]; then timeout "$t" "$@"; else "$@"; fi
}
time_left() { [ $limited -eq 1 ] && echo " (time left $(left) s)"; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
tests="$BUILD/tests/flashkda_gpu_tests"
bench="$BUILD/flashkda-bench-decode"
if [ ! -x "$tests" ] || [ ! -x "$bench" ]; then
  echo "== building flashkda_gpu_tests and flashkda-bench-decode in $BUILD"
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    gen=""
    command -v ninja >/dev/null && gen="-G Ninja"
    cmake -S . -B "$BUILD" $gen -DCMAKE_BUILD_TYPE=Release >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  fi
  bounded "$(left)" cmake --build "$BUILD" --target flashkda_gpu_tests flashkda-bench-decode -j"$(nproc)" \
    >>"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi

status=0
echo "== GPU decode tests, every variant$(time_left)"
bounded $(( $(left) > 380 ? $(left) - 330 : 50 )) "$tests" --gtest_filter='*Decode*' --gtest_color=no \
  --gtest_output="json:$OUT/decode_tests.json" >"$OUT/decode_tests.log" 2>&1
rc=$?
[ $rc -eq 0 ] || { status=1; echo "decode tests: exit $rc (124 = timed out)"; }
# Per kernel choice (the test name's suffix after the case: lat, lat_pdl, fuse_ef_occ, ...): passed / failed.
awk '
  /^\[       OK \]|^\[  FAILED  \]/ {
    name = $4; sub(/,$/, "", name);
    if (name !~ /\./ || done[name]++) next;  # the failure list at the end repeats names
    n = split(name, parts, "/"); leaf = parts[n];
    sub(/^N[0-9]+_H[0-9]+_t[0-9]+_(fp32|bf16)_/, "", leaf);
    if (n < 3) leaf = "(not per variant)";
    seen[leaf] = 1; if ($2 == "OK") pass[leaf]++; else fail[leaf]++;
  }
  END { for (k in seen) printf "  %-20s passed %3d  failed %3d\n", k, pass[k], fail[k] }' "$OUT/decode_tests.log" | sort |
  tee "$OUT/decode_tests_summary.txt"
grep -E "^\[  FAILED  \]|Failure|error:" "$OUT/decode_tests.log" | head -40
grep -E "^\[ errors \]" "$OUT/decode_tests.log" | grep -E "N=256 H=32 t=1|N=1 H=32" | head -24

echo "== decode A/B benchmark$(time_left)"
bounded $(( $(left) > 150 ? $(left) - 120 : 30 )) "$bench" --variants "${VARIANTS:-all}" --json "$OUT/bench_decode_ab.json" $bench_args \
  2>"$OUT/bench_decode_ab_progress.log" | tee "$OUT/bench_decode_ab.md"
rc=${PIPESTATUS[0]}
[ $rc -eq 0 ] || { status=1; echo "benchmark: exit $rc (124 = timed out; per-row medians so far are in bench_decode_ab_progress.log)"; tail -12 "$OUT/bench_decode_ab_progress.log"; }

if [ $ncu_n1 -eq 1 ] && [ $limited -eq 1 ] && [ "$(left)" -le 120 ]; then
  echo "== ncu: skipped: TIME_LIMIT_S reached"
elif [ $ncu_n1 -eq 1 ]; then
  echo "== ncu: one N = 1 step, fp32 pool, H = 32$(time_left)"
  # Caches left warm (--cache-control none), as in the graph of steps, where the
  # 2 MB state stays in L2 from one step to the next.
  for v in ${NCU_VARIANTS:-lat}; do
    timeout 60 ncu --clock-control none --cache-control none -k "regex:kda_decode" --launch-skip 30 --launch-count 1 \
      --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
      "$bench" --variants "$v" --seqs 1 --dtypes fp32 --iters 4 --rounds 1 --no-refs >"$OUT/ncu_n1_$v.txt" 2>&1
    echo "-- $v: exit $?"
    grep -E "Duration|Elapsed Cycles|SM Active Cycles|SM Frequency|Registers Per|Warp Cycles Per Issued" "$OUT/ncu_n1_$v.txt" | head -12
  done
fi

if [ $sanitizer -eq 1 ]; then
  echo "== compute-sanitizer (memcheck, racecheck), small decode cases, every variant$(time_left)"
  filter='Shapes/GpuDecodeCases.*/N7_H1_t1_fp32_*:Shapes/GpuDecodeCases.*/N5_H4_t3_bf16_*:Variants/GpuDecodeKernels.VariableTokensPerSequence/*:Variants/GpuDecodeKernels.ChainedStepsMatchFloat64Steps/*'
  for tool in memcheck racecheck; do
    t=$(( $(left) / 2 - 5 ))
    [ "$tool" = racecheck ] && t=$(( $(left) - 10 ))
    if [ $limited -eq 1 ] && [ $t -lt 20 ]; then echo "$tool: skipped: TIME_LIMIT_S reached"; continue; fi
    bounded "$t" compute-sanitizer --tool "$tool" --error-exitcode 3 "$tests" --gtest_filter="$filter" --gtest_color=no \
      >"$OUT/sanitizer_decode_$tool.log" 2>&1
    rc=$?
    echo "$tool: exit $rc (124 = timed out); $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_decode_$tool.log" | tail -1)"
    [ $rc -eq 0 ] || [ $rc -eq 124 ] || status=1
  done
fi
echo "== gpu_decode_variants exit status $status ($((SECONDS)) s)"
exit $status
