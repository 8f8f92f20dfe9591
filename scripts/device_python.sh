#!/usr/bin/env bash
# The Python package on the GPU machine, from the repository root, in one call:
#   bash scripts/device_python.sh
# Expects the carried wheels: .devbuild/wheels/flash_kda-*.whl (built here with
# CUDA on: python3.12 -m pip wheel . -w .devbuild/wheels --no-deps) and .whl/
# (fla-core, plus pytest / matplotlib pieces installed only when the machine
# lacks them). Installs them into /tmp/site (nothing else on the machine changes),
# runs the Python tests (GPU tests included, skips listed with their reasons),
# then bench/compare_fla.py for the spec's standard table, writing
#   $OUT/pytest.txt, $OUT/pytest.xml, $OUT/compare_fla.md, $OUT/compare_fla.png, $OUT/bench.txt
# Exits non-zero when the install, a test or the benchmark fails. Bounded at about
# 6 minutes: tests 270 s, benchmark 200 s (fla autotunes once per shape).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-/tmp/flashkda-python-out}"
mkdir -p "$OUT"
site=/tmp/site
start=$(date +%s)
step() { echo; echo "==== device_python [$(( $(date +%s) - start ))s]: $*"; }

step "install (python3: $(python3 --version 2>&1), torch $(python3 -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>/dev/null))"
shopt -s nullglob
ours=(.devbuild/wheels/flash_kda-*.whl)
fla=(.whl/fla_core-*.whl)
[ ${#ours[@]} -eq 1 ] || { echo "device_python: expected one .devbuild/wheels/flash_kda-*.whl, found ${#ours[@]}" >&2; exit 2; }
rm -rf "$site"
python3 -m pip install -q --no-index --no-deps --target "$site" "${fla[@]}" "${ours[@]}" || exit 2

# Test/plot helpers: only the ones this machine cannot import (never shadow its own).
extra=()
for pair in pytest:pytest iniconfig:iniconfig pluggy:pluggy pygments:pygments packaging:packaging \
            matplotlib:matplotlib contourpy:contourpy cycler:cycler fonttools:fontTools \
            kiwisolver:kiwisolver pillow:PIL pyparsing:pyparsing python_dateutil:dateutil six:six tzdata:tzdata; do
  dist=${pair%%:*} mod=${pair##*:}
  if ! python3 -c "import $mod" 2>/dev/null; then
    w=(.whl/${dist}-*.whl)
    [ ${#w[@]} -gt 0 ] && extra+=("${w[0]}")
  fi
done
if [ ${#extra[@]} -gt 0 ]; then
  echo "device_python: adding ${extra[*]}"
  python3 -m pip install -q --no-index --no-deps --target "$site" "${extra[@]}" || exit 2
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import flash_kda, fla; print('flash_kda', flash_kda.__version__, flash_kda.__file__, flash_kda.cuda_status()); print('fla', fla.__version__, fla.__file__)" || exit 2
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1

step "pytest tests/python (GPU tests included)"
timeout 270 python3 -m pytest tests/python -q -rs -p no:cacheprovider --junitxml="$OUT/pytest.xml" 2>&1 | tee "$OUT/pytest.txt"
test_rc=${PIPESTATUS[0]}
echo "device_python: pytest exit code $test_rc"

step "bench/compare_fla.py (standard table, fp32 state)"
timeout 200 python3 bench/compare_fla.py --png "$OUT/compare_fla.png" --md "$OUT/compare_fla.md" 2>&1 | tee "$OUT/bench.txt"
bench_rc=${PIPESTATUS[0]}
echo "device_python: benchmark exit code $bench_rc"

step "done: pytest rc=$test_rc, benchmark rc=$bench_rc; outputs in $OUT"
ls -la "$OUT"
[ "$test_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
