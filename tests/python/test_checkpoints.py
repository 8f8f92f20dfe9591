"""flash_kda.fwd(..., checkpoints=, checkpoint_interval=) on the CPU backends: entry
offset(n) + j is, bit for bit, the final state of the same backend run on the first
j * c tokens of sequence n, in fla's key-major [HV, K, V] layout (or value-major), and
close to this package's independent float64 torch reference; errors by name."""
from __future__ import annotations

import math

import pytest
import torch

import flash_kda
from kda_reference import make_problem, reference, rel_rms

SEQLENS = [70, 0, 33, 128]


def prefix_final(p, start, tokens, backend):
    """Final state [HV, V, K] (fp32) of `backend` on tokens [start, start + tokens) from the
    sequence's initial state (p's sequence index is found by start)."""
    n = [i for i in range(len(SEQLENS)) if sum(SEQLENS[:i]) == start and SEQLENS[i] > 0][0]
    init = p["initial_state"][n:n + 1]
    if tokens == 0:
        return init[0]
    sl = slice(start, start + tokens)
    x = {key: p[key][:, sl] for key in ("q", "k", "v", "g", "beta")}
    out = torch.empty_like(x["v"])
    fin = torch.empty_like(init)
    flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], p["scale"], out, A_log=p["A_log"],
                  dt_bias=p["dt_bias"], lower_bound=p["lower_bound"], initial_state=init, final_state=fin,
                  backend=backend)
    return fin[0]


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("c", [16, 64])
@pytest.mark.parametrize("value_major", [False, True])
def test_each_checkpoint_is_the_prefix_runs_final_state(backend, c, value_major):
    p = make_problem(H=2, HV=4, K=16, V=24, seqlens=SEQLENS, seed=c)
    total = sum(math.ceil(L / c) for L in SEQLENS)
    entry = (4, 24, 16) if value_major else (4, 16, 24)
    ck = torch.full((total + 1, *entry), float("nan"))
    out = torch.empty_like(p["v"])
    fin = torch.empty(4, 4, 24, 16)
    flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, A_log=p["A_log"],
                  dt_bias=p["dt_bias"], lower_bound=p["lower_bound"], initial_state=p["initial_state"],
                  final_state=fin, cu_seqlens=p["cu_seqlens"], checkpoints=ck, checkpoint_interval=c,
                  checkpoints_value_major=value_major, backend=backend)
    e, start = 0, 0
    for L in SEQLENS:
        for j in range(math.ceil(L / c)):
            want = prefix_final(p, start, j * c, backend)  # [HV, V, K]
            got = ck[e] if value_major else ck[e].transpose(-1, -2)
            assert torch.equal(got, want), f"sequence at {start}, checkpoint {j}"
            e += 1
        start += L
    assert e == total and torch.isnan(ck[total]).all(), "the spare entry was written"


def test_checkpoints_match_the_float64_reference():
    """Against kda_reference (shares no code with the library): the state after 64 tokens."""
    p = make_problem(H=1, K=32, seqlens=[100], seed=9)
    ck = torch.empty(2, 1, 32, 32)
    out = torch.empty_like(p["v"])
    flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, A_log=p["A_log"],
                  dt_bias=p["dt_bias"], lower_bound=p["lower_bound"], initial_state=p["initial_state"],
                  cu_seqlens=p["cu_seqlens"], checkpoints=ck, checkpoint_interval=64, backend="reference")
    q = dict(p)
    for key in ("q", "k", "v", "g", "beta"):
        q[key] = p[key][:, :64]
    q["cu_seqlens"] = torch.tensor([0, 64])
    _, final = reference(q)
    assert rel_rms(ck[1].transpose(-1, -2).double(), final[0]) <= 1e-6


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_an_empty_buffer_where_no_entry_is_needed(backend):
    """A buffer sized by sum(ceil(L_n / c)) has no entry for a batch of empty
    sequences (or no tokens): the call runs and writes its final states."""
    p = make_problem(H=1, K=16, seqlens=[0, 0, 0], seed=12)
    final = torch.full((3, 1, 16, 16), float("nan"))
    flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], torch.empty_like(p["v"]),
                  A_log=p["A_log"], dt_bias=p["dt_bias"], cu_seqlens=p["cu_seqlens"],
                  initial_state=p["initial_state"], final_state=final,
                  checkpoints=torch.empty(0, 1, 16, 16), checkpoint_interval=64, backend=backend)
    assert torch.equal(final, p["initial_state"])


def test_checkpoint_arguments_are_checked_by_name():
    p = make_problem(H=1, K=16, seqlens=[70, 33], seed=10)
    out = torch.empty_like(p["v"])
    args = (p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out)
    kw = dict(A_log=p["A_log"], dt_bias=p["dt_bias"], cu_seqlens=p["cu_seqlens"])
    with pytest.raises(ValueError, match=r"checkpoints: expected a tensor \[\.\.\., HV, K, V\]"):
        flash_kda.fwd(*args, checkpoints=torch.empty(5, 1, 16), **kw)
    with pytest.raises(ValueError, match="checkpoint_interval: expected a positive multiple of 16"):
        flash_kda.fwd(*args, checkpoints=torch.empty(5, 1, 16, 16), checkpoint_interval=24, **kw)
    with pytest.raises(ValueError, match="the sequences need 5 checkpoints .* holds 0 entries"):
        flash_kda.fwd(*args, checkpoints=torch.empty(0, 1, 16, 16), checkpoint_interval=32, **kw)
    with pytest.raises(ValueError, match="the sequences need 5 checkpoints"):
        flash_kda.fwd(*args, checkpoints=torch.empty(4, 1, 16, 16), checkpoint_interval=32, **kw)
    with pytest.raises(TypeError, match="checkpoints"):
        flash_kda.fwd(*args, checkpoints=torch.empty(5, 1, 16, 16, dtype=torch.float64), **kw)
    with pytest.raises(TypeError, match=r"^checkpoint_interval: expected int, got bool True"):
        flash_kda.fwd(*args, checkpoints=torch.empty(5, 1, 16, 16), checkpoint_interval=True, **kw)
