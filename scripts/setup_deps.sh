#!/usr/bin/env bash
# Installs flash-kda's pinned build dependencies into third_party/ (ignored by git).
#   CUTLASS/CuTe headers: PyPI's nvidia-cutlass wheel carries them as package data
#   under cutlass_library/source/include. Installed with --no-deps: we need only the headers.
#   GoogleTest: Debian's libgtest-dev (only installed when missing and we are root).
# Idempotent: does nothing when the pinned versions are already there.
set -euo pipefail
CUTLASS_VERSION=4.2.0.0
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/third_party/nvidia-cutlass-$CUTLASS_VERSION"
inc="$dest/cutlass_library/source/include"

if [ ! -f "$inc/cute/tensor.hpp" ]; then
  echo "setup_deps: installing nvidia-cutlass==$CUTLASS_VERSION headers into $dest"
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --no-compile \
    --target "$dest" "nvidia-cutlass==$CUTLASS_VERSION"
fi
[ -f "$inc/cute/tensor.hpp" ] || { echo "setup_deps: CuTe headers not found under $inc" >&2; exit 1; }
echo "setup_deps: CUTLASS include dir: $inc"

if [ ! -f /usr/include/gtest/gtest.h ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup_deps: installing libgtest-dev from Debian"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libgtest-dev >/dev/null
  else
    echo "setup_deps: GoogleTest not found; install libgtest-dev (tests will not build without it)" >&2
  fi
fi
