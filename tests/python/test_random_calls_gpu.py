"""Random engine-style calls of flash_kda.fwd on CUDA tensors (K = V in {64, 128}):
the draws of test_random_calls_cpu.py (random_forms.py) with CUDA's rules: fused
rows of whole 16-byte groups, every tensor on the device but the int64 host copy
of cu_seqlens, the default backend. Each call's forms (fused-projection views,
int32 or int64 cu_seqlens with or without the host copy, a sliced state pool with
negative indices and has_initial_state, periodic checkpoints in either layout and
dtype) must be bitwise the glued CUDA call (contiguous copies, int64 boundaries,
dense states; the host copy kept where given, since it decides whether the host
or the device plans the segments) and write nothing else: the binding reads every
form as the plain one.

The glued call is then run on the CPU backend with the same inputs: out, the final
states and the checkpoint entries within test_gpu.py's bars against it (relative
RMS of whole tensors; states and checkpoints by dtype).

Skipped, with the reason, without a CUDA device or when the CUDA backend of
flash_kda cannot run. FLASHKDA_RANDOM_SEEDS replaces the 40 default seeds.
"""
from __future__ import annotations

import pytest
import torch

from gpu_skip import requires_cuda_backend
from random_forms import CUDA_HEAD_DIMS, assert_near, forward_forms_are_the_glued_call, seeds
from test_gpu import OUT_BAR, STATE_BAR_BF16, STATE_BAR_FP32

CALLS = 40

pytestmark = requires_cuda_backend


def state_bar(x):
    return STATE_BAR_FP32 if x.dtype == torch.float32 else STATE_BAR_BF16


@pytest.mark.parametrize("seed", seeds(CALLS))
def test_engine_forms_are_bitwise_the_glued_call_and_near_the_cpu_backend(seed):
    call, gpu = forward_forms_are_the_glued_call(seed, "cuda", CUDA_HEAD_DIMS)
    cpu = call.glued("cpu")
    assert_near("out", gpu.out, cpu.out, OUT_BAR)
    assert_near("final states", gpu.final, cpu.final, state_bar(gpu.final))
    if call.interval:
        assert_near("checkpoints", gpu.checkpoints, cpu.checkpoints, state_bar(gpu.checkpoints))
