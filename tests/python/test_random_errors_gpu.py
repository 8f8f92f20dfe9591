"""Invalid arguments in random engine-style calls on CUDA tensors (K = V in {64,
128}): random_errors.py's catalog with CUDA's rules. Besides what the CPU suite
draws, a tensor left on the CPU (or the host copy of cu_seqlens on the GPU), a
tensor starting one element into its buffer (off the 16-byte alignment of the
forward's rows and of states and pools), fused rows that are not whole 16-byte
groups, and K = V of 32, 96 or 256 (NotImplementedError). Values that live on
the device (cu_seqlens, num_accepted_tokens) are not drawn: CUDA skips and
records them for check_device_faults instead of raising; cu_seqlens' values are
broken through cu_seqlens_host, the copy the host validates. Each case must
raise the documented exception naming the argument, write no byte of any tensor
of the call, and leave nothing for check_device_faults.

Skipped, with the reason, without a CUDA device or when the CUDA backend of
flash_kda cannot run. FLASHKDA_RANDOM_SEEDS replaces the 100 default seeds of each
function.
"""
from __future__ import annotations

import pytest

from gpu_skip import requires_cuda_backend
from random_errors import check, draw_case
from random_forms import CUDA_HEAD_DIMS, seeds

CALLS = 100

pytestmark = requires_cuda_backend


@pytest.mark.parametrize("seed", seeds(CALLS))
def test_broken_forward_is_refused_by_name_and_writes_nothing(seed):
    check(draw_case("fwd", seed, "cuda", CUDA_HEAD_DIMS))


@pytest.mark.parametrize("seed", seeds(CALLS))
def test_broken_decode_step_is_refused_by_name_and_writes_nothing(seed):
    check(draw_case("decode", seed, "cuda", CUDA_HEAD_DIMS))
