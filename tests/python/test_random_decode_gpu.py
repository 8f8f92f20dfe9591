"""Random engine-style decode steps on CUDA tensors (K = V in {64, 128}): the draws
of test_random_decode_cpu.py (random_forms.py) with CUDA's rules: fused rows of
whole 16-byte groups, every tensor (pools, indices, num_accepted_tokens,
cu_seqlens) on the device. Each step's forms (fused-projection views, int32 or
int64 cu_seqlens, a sliced pool, a block table's strided index column with
padding entries, a separate output pool, per-token states, speculative verify)
must be bitwise the glued CUDA step and write nothing else.

The glued step is then run by the CPU decode (float64) with the same inputs: the
pool, output pool and per-token states within test_decode_gpu.py's state bars
(fp32 1e-5, bf16 3e-3 relative RMS), out within the spec's out bar (test_gpu.py's
3.5e-3 relative RMS of the whole tensor: looser than test_decode_gpu.py's
one-ulp check, enough to catch a wrong token or sequence).

Skipped, with the reason, without a CUDA device or when the CUDA backend of
flash_kda cannot run. FLASHKDA_RANDOM_SEEDS replaces the 40 default seeds.
"""
from __future__ import annotations

import pytest
import torch

from gpu_skip import requires_cuda_backend
from random_forms import CUDA_HEAD_DIMS, assert_near, decode_forms_are_the_glued_step, seeds
from test_decode_gpu import BF16_STATE_BAR, FP32_STATE_BAR
from test_gpu import OUT_BAR

STEPS = 40

pytestmark = requires_cuda_backend


@pytest.mark.parametrize("seed", seeds(STEPS))
def test_decode_forms_are_bitwise_the_glued_step_and_near_the_cpu_decode(seed):
    step, gpu = decode_forms_are_the_glued_step(seed, "cuda", CUDA_HEAD_DIMS)
    cpu = step.glued("cpu")
    assert_near("out", gpu.out, cpu.out, OUT_BAR)
    bar = FP32_STATE_BAR if step.state_dtype == torch.float32 else BF16_STATE_BAR
    for name in ("pool", "out_pool", "per_token"):
        if getattr(gpu, name) is not None:
            assert_near(name, getattr(gpu, name), getattr(cpu, name), bar)
