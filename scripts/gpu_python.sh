#!/usr/bin/env bash
# The Python package on a Hopper GPU machine without network access, from the
# repository root:
#   bash scripts/gpu_python.sh [STEP...]     STEP: tests overhead forward decode engine history cp
#                                            (default: the first four)
# Expects prebuilt wheels: WHEELS_DIR/flash_kda-*.whl (default .devbuild/wheels;
# build it with CUDA on: python3.12 -m pip wheel . -w .devbuild/wheels --no-deps)
# and EXTRA_WHEELS_DIR (default .whl: fla-core, plus pytest / matplotlib pieces
# installed only when the machine lacks them). Installs them into /tmp/site
# (nothing else on the machine changes), then runs the chosen steps, each bounded
# by `timeout` (a benchmark stopped by it still prints and writes the rows it
# finished):
#   tests     pytest tests/python, GPU tests included, skips listed with their reasons
#             (270 s with fla's kernels already compiled; with an empty Triton cache it
#             needed more than 300 s: the default limit is 540 s)
#             -> $OUT/pytest.txt, $OUT/pytest.xml
#   overhead  bench/host_overhead.py: host time per fwd / decode call, GPU idle (45 s)
#             -> $OUT/host_overhead.md
#   forward   bench/compare_fla.py: the spec's standard forward table against fla (150 s;
#             fla autotunes once per shape) -> $OUT/compare_fla.md, $OUT/compare_fla.png
#   decode    bench/compare_fla.py --no-forward: decode steps against fla's
#             fused_recurrent_kda under CUDA graphs (90 s) -> $OUT/compare_fla_decode.md
#   engine    bench/engine_calls.py: each engine call with its glue against the native
#             arguments (60 s) -> $OUT/engine_calls.md
#   history   bench/history_probe.py: one forward row's time first in a process and after
#             the other rows (HISTORY_ARGS, e.g. --fla) -> $OUT/history_probe.md
#   cp        two GPUs: tests/python/test_distributed_gpu.py (NCCL), then
#             torchrun --nproc-per-node 2 bench/cp_bench.py --fla (H = 8, 12 at T = 1M,
#             fla's context-parallel chunk_kda beside it; 300 s) -> $OUT/cp_bench.md
# and the log of the benchmarks in $OUT/bench.txt; $OUT is RESULTS_DIR (default
# ./gpu-results). All four take under 10 minutes with a warm Triton cache.
# FORWARD_ARGS="--heads 64 --cases varlen6,8x1024" narrows the forward step;
# TESTS_TIMEOUT / FORWARD_TIMEOUT (seconds) replace the tests' and forward's limits; fla's
# compiled kernels are packed as $OUT/triton-cache.tgz (unpack it into
# TRITON_CACHE_DIR before the next run to skip their compilation).
# Exits non-zero when the install, a test or a benchmark fails.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${RESULTS_DIR:-$PWD/gpu-results}"
mkdir -p "$OUT"
site=/tmp/site
start=$(date +%s)
step() { echo; echo "==== gpu_python [$(( $(date +%s) - start ))s]: $*"; }

step "install (python3: $(python3 --version 2>&1), torch $(python3 -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>/dev/null))"
shopt -s nullglob
wheels="${WHEELS_DIR:-.devbuild/wheels}"
extra_wheels="${EXTRA_WHEELS_DIR:-.whl}"
ours=("$wheels"/flash_kda-*.whl)
fla=("$extra_wheels"/fla_core-*.whl)
[ ${#ours[@]} -eq 1 ] || { echo "gpu_python: expected one $wheels/flash_kda-*.whl, found ${#ours[@]}" >&2; exit 2; }
rm -rf "$site"
python3 -m pip install -q --no-index --no-deps --target "$site" "${fla[@]}" "${ours[@]}" || exit 2

# Test/plot helpers: only the ones this machine cannot import (never shadow its own).
extra=()
for pair in pytest:pytest iniconfig:iniconfig pluggy:pluggy pygments:pygments packaging:packaging \
            matplotlib:matplotlib contourpy:contourpy cycler:cycler fonttools:fontTools \
            kiwisolver:kiwisolver pillow:PIL pyparsing:pyparsing python_dateutil:dateutil six:six tzdata:tzdata; do
  dist=${pair%%:*} mod=${pair##*:}
  if ! python3 -c "import $mod" 2>/dev/null; then
    w=("$extra_wheels"/${dist}-*.whl)
    [ ${#w[@]} -gt 0 ] && extra+=("${w[0]}")
  fi
done
if [ ${#extra[@]} -gt 0 ]; then
  echo "gpu_python: adding ${extra[*]}"
  python3 -m pip install -q --no-index --no-deps --target "$site" "${extra[@]}" || exit 2
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import flash_kda, fla; print('flash_kda', flash_kda.__version__, flash_kda.__file__, flash_kda.cuda_status()); print('fla', fla.__version__, fla.__file__)" || exit 2
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1

steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(tests overhead forward decode)
for s in "${steps[@]}"; do
  case "$s" in tests|overhead|forward|decode|engine|history|cp) ;; *) echo "gpu_python: unknown step $s" >&2; exit 2 ;; esac
done
export PYTHONUNBUFFERED=1
# fla's Triton kernels compile and autotune on first use, for minutes per forward
# shape. Their compiled kernels are cached in TRITON_CACHE_DIR (default
# .devbuild/triton-cache), and the cache is packed as $OUT/triton-cache.tgz.
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$PWD/.devbuild/triton-cache}"
mkdir -p "$TRITON_CACHE_DIR"
# FORWARD_ARGS narrows the forward comparison, e.g. "--heads 64 --cases varlen6,8x1024".
FORWARD_ARGS="${FORWARD_ARGS:-}"
rc_all=0
summary=""
: > "$OUT/bench.txt"
for s in "${steps[@]}"; do
  case "$s" in
    tests)
      step "pytest tests/python (GPU tests included)"
      timeout "${TESTS_TIMEOUT:-540}" python3 -m pytest tests/python -q -rs -p no:cacheprovider --junitxml="$OUT/pytest.xml" 2>&1 | tee "$OUT/pytest.txt"
      rc=${PIPESTATUS[0]} ;;
    overhead)
      step "bench/host_overhead.py (host time per call, GPU idle)"
      timeout 45 python3 bench/host_overhead.py --md "$OUT/host_overhead.md" 2>&1 | tee -a "$OUT/bench.txt"
      rc=${PIPESTATUS[0]} ;;
    forward)
      step "bench/compare_fla.py (standard forward table, fp32 state)"
      # shellcheck disable=SC2086  # FORWARD_ARGS is a list of options
      timeout "${FORWARD_TIMEOUT:-150}" python3 bench/compare_fla.py $FORWARD_ARGS --png "$OUT/compare_fla.png" --md "$OUT/compare_fla.md" 2>&1 |
        tee -a "$OUT/bench.txt"
      rc=${PIPESTATUS[0]} ;;
    decode)
      step "bench/compare_fla.py --no-forward (decode against fla, CUDA graphs)"
      timeout 90 python3 bench/compare_fla.py --no-forward --md "$OUT/compare_fla_decode.md" 2>&1 | tee -a "$OUT/bench.txt"
      rc=${PIPESTATUS[0]} ;;
    engine)
      step "bench/engine_calls.py (engine calls: glue against native arguments)"
      timeout 60 python3 bench/engine_calls.py --md "$OUT/engine_calls.md" 2>&1 | tee -a "$OUT/bench.txt"
      rc=${PIPESTATUS[0]} ;;
    history)
      step "bench/history_probe.py (a row's time against what ran before it)"
      # shellcheck disable=SC2086  # HISTORY_ARGS is a list of options
      timeout "${HISTORY_TIMEOUT:-240}" python3 bench/history_probe.py ${HISTORY_ARGS:-} > "$OUT/history_probe.md" 2> >(tee -a "$OUT/bench.txt" >&2)
      rc=$?
      cat "$OUT/history_probe.md" ;;
    cp)
      step "context parallelism on two GPUs (NCCL test, then bench/cp_bench.py)"
      # No NVLink multicast (NCCL's NVLS, torch's symmetric memory): the all-gathers
      # here are a few MB and need none of it.
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      timeout 120 python3 -m pytest tests/python/test_distributed_gpu.py -q -rs -s -p no:cacheprovider 2>&1 |
        tee -a "$OUT/bench.txt"
      rc=${PIPESTATUS[0]}
      timeout 300 torchrun --nproc-per-node 2 bench/cp_bench.py --fla > "$OUT/cp_bench.md" 2> >(tee -a "$OUT/bench.txt" >&2)
      rc2=$?
      cat "$OUT/cp_bench.md"
      [ "$rc" -eq 0 ] && rc=$rc2 ;;
  esac
  echo "gpu_python: $s exit code $rc"
  summary="$summary $s=$rc"
  [ "$rc" -eq 0 ] || rc_all=1
done

tar -czf "$OUT/triton-cache.tgz" -C "$TRITON_CACHE_DIR" . 2>/dev/null || echo "gpu_python: could not pack the Triton cache"
step "done:$summary; outputs in $OUT"
ls -la "$OUT"
exit $rc_all
