"""Invalid arguments in random engine-style calls on CPU tensors: each seed draws a
valid forward and a valid decode step in an engine's forms (random_forms.py, K in
{16, 32}), breaks each in one way drawn from random_errors.py's catalog (a wrong
dtype, shape, head count, head dim, stride, cu_seqlens, state_indices,
has_initial_state, lower_bound, scale, checkpoint interval or buffer,
num_accepted_tokens, output pool), and asserts what the API promises for bad
input: the documented exception type, a message that names the argument, and no
byte of any tensor of the call written. The CPU backends read cu_seqlens,
state_indices and num_accepted_tokens on the host, so their values are drawn here
(on CUDA only the host copy of cu_seqlens is). FLASHKDA_RANDOM_SEEDS replaces the
200 default seeds of each function.
"""
from __future__ import annotations

import pytest

from random_errors import CATALOG, applicable, check, draw_case
from random_forms import CPU_HEAD_DIMS, seeds

CALLS = 200


@pytest.mark.parametrize("seed", seeds(CALLS))
def test_broken_forward_is_refused_by_name_and_writes_nothing(seed):
    check(draw_case("fwd", seed, "cpu", CPU_HEAD_DIMS))


@pytest.mark.parametrize("seed", seeds(CALLS))
def test_broken_decode_step_is_refused_by_name_and_writes_nothing(seed):
    check(draw_case("decode", seed, "cpu", CPU_HEAD_DIMS))


@pytest.mark.parametrize("fn", ["fwd", "decode"])
def test_the_default_seeds_draw_every_kind_that_applies_on_the_cpu(fn):
    # The kinds are drawn uniformly among those a call admits: over the default
    # seeds each applicable kind must come up, or a catalog entry has silently
    # stopped applying (and its checks stopped running).
    drawn, seen = set(), set()
    for seed in range(CALLS):
        drawn.add(draw_case(fn, seed, "cpu", CPU_HEAD_DIMS).mutation.kind)
        if len(seen) < len(CATALOG):
            seen.update(name for name, _ in applicable(fn, seed, "cpu", CPU_HEAD_DIMS)[3])
    missing = seen - drawn
    assert not missing, f"{fn}: kinds that apply but no default seed draws: {sorted(missing)}"
