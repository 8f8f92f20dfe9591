"""Random engine-style decode steps through the Python binding on CPU tensors, every
argument form at once: token tensors as views of one fused projection (or dense),
int32 or int64 cu_seqlens (or equal lengths), a pool sliced from a bigger buffer,
slot indices of either width as a block table's strided column (padding entries
among them), a separate output pool, per-token states, and speculative verify
(indices [N, 1 + S] with num_accepted_tokens). Each step is run again with an
engine's glue (contiguous copies, int64 boundaries, a dense pool copy, dense
indices) and must be bitwise that run; nothing else may be written. Head dims
K = V in {16, 32}. The draws and the two forms are random_forms.py's (shared with
the CUDA suite); FLASHKDA_RANDOM_SEEDS replaces the 40 default seeds."""
from __future__ import annotations

import pytest

from random_forms import CPU_HEAD_DIMS, decode_forms_are_the_glued_step, seeds

STEPS = 40


@pytest.mark.parametrize("seed", seeds(STEPS))
def test_decode_forms_are_bitwise_the_glued_step(seed):
    decode_forms_are_the_glued_step(seed, "cpu", CPU_HEAD_DIMS)
