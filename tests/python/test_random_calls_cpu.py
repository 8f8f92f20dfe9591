"""Random engine-style calls of flash_kda.fwd on CPU tensors, every argument form at
once: q/k/v/g/beta as views of one fused projection output (or dense), int32 or
int64 cu_seqlens (with or without the host copy), a state pool that is a slice of a
bigger buffer (int32 or int64 indices, negative ones, has_initial_state), periodic
checkpoints in either layout and dtype. Each call is run again with the glue an
engine would otherwise write (contiguous copies, int64 boundaries, the slots
gathered into a dense initial state and the final states scattered back by hand)
and must be bitwise that run: the binding reads every form as the plain one, and
writes nothing else (the pool's other slots and padding, spare checkpoint entries).
Head dims K in {16, 32} (V = K or 16). The draws and the two forms are
random_forms.py's (shared with the CUDA suite); FLASHKDA_RANDOM_SEEDS replaces
the 60 default seeds."""
from __future__ import annotations

import pytest

from random_forms import CPU_HEAD_DIMS, forward_forms_are_the_glued_call, seeds

CALLS = 60


@pytest.mark.parametrize("seed", seeds(CALLS))
def test_engine_forms_are_bitwise_the_glued_call(seed):
    forward_forms_are_the_glued_call(seed, "cpu", CPU_HEAD_DIMS)
