#!/usr/bin/env bash
# Runs the Python tests and benchmarks on a Hopper GPU from locally built wheels
# (no package index needed), from the repository root:
#   bash scripts/gpu_python.sh [STEP...]     STEP: tests overhead forward decode engine history cp
#                                            (default: the first four)
# Options (environment variables):
#   WHEELS_DIR        holds exactly one flash_kda-*.whl (default dist; build it with CUDA
#                     on: python3 -m pip wheel . -w dist --no-deps)
#   EXTRA_WHEELS_DIR  fla_core-*.whl, and pytest / matplotlib wheels that are installed
#                     only where python3 cannot import them (default: none, fla and the
#                     helpers must then be importable already)
#   INSTALL_DIR       where the wheels are installed (pip --target; default: a new
#                     temporary directory, removed at exit); nothing else changes
#   RESULTS_DIR       where the outputs go (default ./gpu-results); when it is set, the
#                     Triton cache (TRITON_CACHE_DIR, else Triton's default) is also
#                     packed there as triton-cache.tgz, for reuse through TRITON_CACHE_DIR
#   TRITON_CACHE_DIR  Triton's kernel cache (default: Triton's own); fla's kernels
#                     compile and autotune on first use, for minutes per forward shape
#   FORWARD_ARGS      options for the forward step, e.g. "--heads 64 --cases varlen6,8x1024"
#   HISTORY_ARGS      options for the history step, e.g. --fla
#   TESTS_TIMEOUT, FORWARD_TIMEOUT, HISTORY_TIMEOUT   those steps' limits in seconds
# Each step runs under `timeout`, which bounds a hang (a benchmark stopped by it
# still prints and writes the rows it finished):
#   tests     pytest tests/python, GPU tests included, skips listed with their reasons;
#             limit TESTS_TIMEOUT, default 540 s (270 s with fla's kernels already
#             compiled, over 300 s with an empty Triton cache)
#             -> pytest.txt, pytest.xml
#   overhead  bench/host_overhead.py: host time per fwd / decode call, GPU idle (45 s)
#             -> host_overhead.md
#   forward   bench/compare_fla.py: the spec's standard forward table against fla
#             (FORWARD_TIMEOUT, default 150 s; fla autotunes once per shape)
#             -> compare_fla.md, compare_fla.png
#   decode    bench/compare_fla.py --no-forward: decode steps against fla's
#             fused_recurrent_kda under CUDA graphs (90 s) -> compare_fla_decode.md
#   engine    bench/engine_calls.py: each engine call with its glue against the native
#             arguments (60 s) -> engine_calls.md
#   history   bench/history_probe.py: one forward row's time first in a process and after
#             the other rows (HISTORY_TIMEOUT, default 240 s) -> history_probe.md
#   cp        two GPUs: tests/python/test_distributed_gpu.py (NCCL, 120 s), then
#             torchrun --nproc-per-node 2 bench/cp_bench.py --fla (H = 8, 12 at T = 1M,
#             fla's context-parallel chunk_kda beside it; 300 s) -> cp_bench.md
# and the log of the benchmarks in bench.txt, all in RESULTS_DIR.
# Exits non-zero when the install, a test or a benchmark fails.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
results="${RESULTS_DIR:-$PWD/gpu-results}"
mkdir -p "$results"
if [ -n "${INSTALL_DIR:-}" ]; then
  site="$INSTALL_DIR"
else
  site="$(mktemp -d)" || exit 2
  trap 'rm -rf "$site"' EXIT
fi
start=$(date +%s)
step() { echo; echo "==== gpu_python [$(( $(date +%s) - start ))s]: $*"; }

step "install (python3: $(python3 --version 2>&1), torch $(python3 -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>/dev/null))"
shopt -s nullglob
wheels="${WHEELS_DIR:-dist}"
extra_wheels="${EXTRA_WHEELS_DIR:-}"
ours=("$wheels"/flash_kda-*.whl)
fla=()
[ -n "$extra_wheels" ] && fla=("$extra_wheels"/fla_core-*.whl)
[ ${#ours[@]} -eq 1 ] || { echo "gpu_python: expected one $wheels/flash_kda-*.whl, found ${#ours[@]}" >&2; exit 2; }
# --upgrade: a given INSTALL_DIR may hold an earlier install.
python3 -m pip install -q --no-index --no-deps --upgrade --target "$site" "${fla[@]}" "${ours[@]}" || exit 2

# Test/plot helpers: only the ones python3 cannot import (never shadow its own).
extra=()
if [ -n "$extra_wheels" ]; then
  for pair in pytest:pytest iniconfig:iniconfig pluggy:pluggy pygments:pygments packaging:packaging \
              matplotlib:matplotlib contourpy:contourpy cycler:cycler fonttools:fontTools \
              kiwisolver:kiwisolver pillow:PIL pyparsing:pyparsing python_dateutil:dateutil six:six tzdata:tzdata; do
    dist=${pair%%:*} mod=${pair##*:}
    if ! python3 -c "import $mod" 2>/dev/null; then
      w=("$extra_wheels"/${dist}-*.whl)
      [ ${#w[@]} -gt 0 ] && extra+=("${w[0]}")
    fi
  done
fi
if [ ${#extra[@]} -gt 0 ]; then
  echo "gpu_python: adding ${extra[*]}"
  python3 -m pip install -q --no-index --no-deps --upgrade --target "$site" "${extra[@]}" || exit 2
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
# shape; a cache kept in TRITON_CACHE_DIR skips that.
[ -n "${TRITON_CACHE_DIR:-}" ] && mkdir -p "$TRITON_CACHE_DIR"
FORWARD_ARGS="${FORWARD_ARGS:-}"
rc_all=0
summary=""
: > "$results/bench.txt"
for s in "${steps[@]}"; do
  case "$s" in
    tests)
      step "pytest tests/python (GPU tests included)"
      timeout "${TESTS_TIMEOUT:-540}" python3 -m pytest tests/python -q -rs -p no:cacheprovider --junitxml="$results/pytest.xml" 2>&1 | tee "$results/pytest.txt"
      rc=${PIPESTATUS[0]} ;;
    overhead)
      step "bench/host_overhead.py (host time per call, GPU idle)"
      timeout 45 python3 bench/host_overhead.py --md "$results/host_overhead.md" 2>&1 | tee -a "$results/bench.txt"
      rc=${PIPESTATUS[0]} ;;
    forward)
      step "bench/compare_fla.py (standard forward table, fp32 state)"
      # shellcheck disable=SC2086  # FORWARD_ARGS is a list of options
      timeout "${FORWARD_TIMEOUT:-150}" python3 bench/compare_fla.py $FORWARD_ARGS --png "$results/compare_fla.png" --md "$results/compare_fla.md" 2>&1 |
        tee -a "$results/bench.txt"
      rc=${PIPESTATUS[0]} ;;
    decode)
      step "bench/compare_fla.py --no-forward (decode against fla, CUDA graphs)"
      timeout 90 python3 bench/compare_fla.py --no-forward --md "$results/compare_fla_decode.md" 2>&1 | tee -a "$results/bench.txt"
      rc=${PIPESTATUS[0]} ;;
    engine)
      step "bench/engine_calls.py (engine calls: glue against native arguments)"
      timeout 60 python3 bench/engine_calls.py --md "$results/engine_calls.md" 2>&1 | tee -a "$results/bench.txt"
      rc=${PIPESTATUS[0]} ;;
    history)
      step "bench/history_probe.py (a row's time against what ran before it)"
      # shellcheck disable=SC2086  # HISTORY_ARGS is a list of options
      timeout "${HISTORY_TIMEOUT:-240}" python3 bench/history_probe.py ${HISTORY_ARGS:-} > "$results/history_probe.md" 2> >(tee -a "$results/bench.txt" >&2)
      rc=$?
      cat "$results/history_probe.md" ;;
    cp)
      step "context parallelism on two GPUs (NCCL test, then bench/cp_bench.py)"
      # No NVLink multicast (NCCL's NVLS, torch's symmetric memory): the all-gathers
      # here are a few MB and need none of it.
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      timeout 120 python3 -m pytest tests/python/test_distributed_gpu.py -q -rs -s -p no:cacheprovider 2>&1 |
        tee -a "$results/bench.txt"
      rc=${PIPESTATUS[0]}
      timeout 300 torchrun --nproc-per-node 2 bench/cp_bench.py --fla > "$results/cp_bench.md" 2> >(tee -a "$results/bench.txt" >&2)
      rc2=$?
      cat "$results/cp_bench.md"
      [ "$rc" -eq 0 ] && rc=$rc2 ;;
  esac
  echo "gpu_python: $s exit code $rc"
  summary="$summary $s=$rc"
  [ "$rc" -eq 0 ] || rc_all=1
done

if [ -n "${RESULTS_DIR:-}" ]; then
  triton_cache="${TRITON_CACHE_DIR:-${TRITON_HOME:-$HOME}/.triton/cache}"
  tar -czf "$results/triton-cache.tgz" -C "$triton_cache" . 2>/dev/null ||
    echo "gpu_python: could not pack the Triton cache ($triton_cache)"
fi
step "done:$summary; outputs in $results"
ls -la "$results"
exit $rc_all
