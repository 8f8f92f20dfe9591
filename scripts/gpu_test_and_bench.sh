#!/usr/bin/env bash
# On a Hopper GPU machine, from the repository root: build (unless BUILD already
# holds one), the GPU tests, compute-sanitizer memcheck + racecheck on a small
# varlen case, and the benchmark tables (printed last). Logs and JSON go to
# RESULTS_DIR (default ./gpu-results).
#   BUILD=build-dev scripts/gpu_test_and_bench.sh [--no-bench] [--bench-args "..."] [--profile]
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
BUILD=${BUILD:-build-dev}
OUT=${RESULTS_DIR:-$root/gpu-results}
mkdir -p "$OUT"
bench=1
bench_args=""
profile=0
while [ $# -gt 0 ]; do
  case "$1" in
    --no-bench) bench=0 ;;
    --bench-args) bench_args="$2"; shift ;;
    --profile) profile=1 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
if [ ! -x "$BUILD/tests/flashkda_gpu_tests" ]; then
  echo "== building in $BUILD"
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >"$OUT/build.log" 2>&1 &&
    cmake --build "$BUILD" -j16 >>"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi

status=0
echo "== GPU tests"
# `timeout 420` bounds a hang. The suite takes ~250 s on an H200 (every decode
# kernel variant, with and without PDL, on every case).
timeout 420 "$BUILD/tests/flashkda_gpu_tests" --gtest_color=no >"$OUT/gpu_tests.log" 2>&1 || status=1
grep -E "^\[ errors \]|FAILED|PASSED|SKIPPED|Failure|error:" "$OUT/gpu_tests.log" | head -80

echo "== compute-sanitizer (memcheck, racecheck) on a small varlen case"
filter='GpuForward.VarlenSpecCase'
for tool in memcheck racecheck; do
  timeout 240 compute-sanitizer --tool "$tool" --error-exitcode 3 "$BUILD/tests/flashkda_gpu_tests" \
    --gtest_filter="$filter" --gtest_color=no >"$OUT/sanitizer_$tool.log" 2>&1
  rc=$?
  echo "$tool: exit $rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.log" | tail -1)"
  [ $rc -eq 0 ] || status=1
done

if [ $profile -eq 1 ]; then
  echo "== ncu: per-kernel time and throughput, H=96, the three cases, fp32 state"
  ncu --clock-control none -k regex:kda_ --launch-skip 0 --launch-count 6 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    "$BUILD/flashkda-bench" --heads 96 --states fp32 --iters 1 --warmup 0 >"$OUT/ncu.txt" 2>&1
  grep -E "kda_|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Stall" "$OUT/ncu.txt" | head -60
fi

if [ $bench -eq 1 ]; then
  echo "== benchmark"
  "$BUILD/flashkda-bench" --json "$OUT/bench.json" $bench_args 2>"$OUT/bench_progress.log" | tee "$OUT/bench.md"
  [ ${PIPESTATUS[0]} -eq 0 ] || status=1
  echo "== decode benchmark (CUDA graph, H=32)"
  "$BUILD/flashkda-bench-decode" --json "$OUT/bench_decode.json" | tee "$OUT/bench_decode.md"
  [ ${PIPESTATUS[0]} -eq 0 ] || status=1
fi
echo "== gpu_test_and_bench exit status $status"
exit $status
