"""Segment summaries (flash_kda.segment_summaries, compose_summaries) on the CPU
backends: the summaries of any split of varlen GVA sequences, composed along each
sequence and applied to its initial state, give the straight run's final state
(against this package's own float64 torch reference, kda_reference.py), and each
piece's forward from its composed incoming state gives the straight run's outputs.
Arguments are checked by name."""
from __future__ import annotations

import pytest
import torch

import flash_kda
from kda_reference import fwd_kwargs, make_problem, new_outputs, reference, rel_rms

SEQLENS = [150, 37, 90]


def slow_decay_problem(seed):
    """H = 1, HV = 2, K = V = 32. The spec's gates decay a state by up to e^-5 a token,
    which makes M ~ 0 after a few dozen tokens; a gate of -12 with A_log = dt_bias = 0
    (a ~ -3e-5 a token) carries the incoming state through, so M is tested."""
    p = make_problem(H=1, HV=2, K=32, seqlens=SEQLENS, seed=seed)
    p["g"] = torch.full_like(p["g"], -12.0)
    p["A_log"] = torch.zeros_like(p["A_log"])
    p["dt_bias"] = torch.zeros_like(p["dt_bias"])
    return p


def random_pieces(pieces, gen):
    """Per sequence, sorted cut points (duplicates: empty pieces), as (seq, begin, end)."""
    out, start = [], 0
    for n, L in enumerate(SEQLENS):
        cuts = sorted([0, L] + torch.randint(0, L + 1, (pieces - 1,), generator=gen).tolist())
        out += [(n, start + a, start + b) for a, b in zip(cuts[:-1], cuts[1:])]
        start += L
    return out


@pytest.mark.parametrize("backend,bar", [("reference", 5e-7), ("cpu", 5e-6)])
@pytest.mark.parametrize("pieces", [1, 3, 7])
def test_composed_pieces_give_the_straight_run(backend, bar, pieces):
    p = slow_decay_problem(seed=pieces)
    ref_out, ref_final = reference(p)
    gen = torch.Generator().manual_seed(100 + pieces)
    segs = random_pieces(pieces, gen)
    order = torch.randperm(len(segs), generator=gen).tolist()  # summaries asked for in any order
    segments = torch.tensor([[segs[i][1], segs[i][2]] for i in order], dtype=torch.int64)
    M, B = flash_kda.segment_summaries(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"],
                                       segments, lower_bound=p["lower_bound"], cu_seqlens=p["cu_seqlens"],
                                       backend=backend)
    assert M.shape == (len(segs), 2, 32, 32) and B.shape == (len(segs), 2, 32, 32)
    where = {segs[i]: j for j, i in enumerate(order)}
    for n in range(len(SEQLENS)):
        PM = torch.eye(32).expand(2, 32, 32).contiguous()
        PB = torch.zeros(2, 32, 32)
        for seg in [s for s in segs if s[0] == n]:
            _, b, e = seg
            incoming = p["initial_state"][n].double() @ PM.double() + PB.double()
            if e > b:
                # This piece alone, from its composed incoming state.
                piece = {key: (val[:, b:e] if key in ("q", "k", "v", "g", "beta") else val) for key, val in p.items()}
                piece["cu_seqlens"] = None
                piece["initial_state"] = incoming.float()[None]
                out = torch.empty_like(piece["v"])
                flash_kda.fwd(piece["q"], piece["k"], piece["v"], piece["g"], piece["beta"], p["scale"], out,
                              A_log=p["A_log"], dt_bias=p["dt_bias"], lower_bound=p["lower_bound"],
                              initial_state=piece["initial_state"], backend="reference")
                assert rel_rms(out.double(), ref_out[:, b:e]) <= 3e-3  # out's own bf16 rounding: ~1.7e-3
            j = where[seg]
            flash_kda.compose_summaries(PM, PB, M[j], B[j], out=(PM, PB), backend=backend)
        final = p["initial_state"][n].double() @ PM.double() + PB.double()
        err = rel_rms(final, ref_final[n])
        print(f"{backend:9s} {pieces} pieces, sequence {n}: final state {err:.3e}")
        assert err <= bar


def test_backends_agree_and_empty_is_identity():
    p = slow_decay_problem(seed=11)
    segments = torch.tensor([[3, 140], [190, 190], [150, 187], [187, 277]], dtype=torch.int64)
    args = (p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"], segments)
    Mr, Br = flash_kda.segment_summaries(*args, lower_bound=-5.0, cu_seqlens=p["cu_seqlens"], backend="reference")
    Mc, Bc = flash_kda.segment_summaries(*args, lower_bound=-5.0, cu_seqlens=p["cu_seqlens"])
    assert rel_rms(Mc.double(), Mr.double()) <= 5e-6
    assert rel_rms(Bc.double(), Br.double()) <= 5e-6
    for M, B in ((Mr, Br), (Mc, Bc)):
        assert torch.equal(M[1], torch.eye(32).expand(2, 32, 32))
        assert torch.equal(B[1], torch.zeros(2, 32, 32))


def test_compose_leading_dims_and_in_place():
    gen = torch.Generator().manual_seed(5)
    M1, M2 = (torch.randn(3, 2, 8, 8, generator=gen) for _ in range(2))
    B1, B2 = (torch.randn(3, 2, 6, 8, generator=gen) for _ in range(2))
    M, B = flash_kda.compose_summaries(M1, B1, M2, B2)
    assert torch.allclose(M.double(), M1.double() @ M2.double(), rtol=1e-6, atol=1e-6)
    assert torch.allclose(B.double(), B1.double() @ M2.double() + B2.double(), rtol=1e-6, atol=1e-6)
    M2c, B2c = M2.clone(), B2.clone()
    flash_kda.compose_summaries(M1, B1, M2c, B2c, out=(M2c, B2c))
    assert torch.equal(M2c, M) and torch.equal(B2c, B)


def test_bad_arguments_are_named():
    p = slow_decay_problem(seed=12)
    args = (p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"])
    kw = dict(lower_bound=-5.0, cu_seqlens=p["cu_seqlens"])
    with pytest.raises(ValueError, match="past the end of sequence 0"):
        flash_kda.segment_summaries(*args, torch.tensor([[140, 160]]), **kw)
    with pytest.raises(ValueError, match="segments"):
        flash_kda.segment_summaries(*args, torch.tensor([[20, 10]]), **kw)
    with pytest.raises(ValueError, match="segments"):
        flash_kda.segment_summaries(*args, torch.tensor([0, 10]), **kw)
    with pytest.raises(TypeError, match="segments"):
        flash_kda.segment_summaries(*args, torch.tensor([[0, 10]], dtype=torch.int32), **kw)
    with pytest.raises(ValueError, match="lower_bound"):
        flash_kda.segment_summaries(*args, torch.tensor([[0, 10]]), lower_bound=0.5, cu_seqlens=p["cu_seqlens"])
    with pytest.raises(ValueError, match="backend"):
        flash_kda.segment_summaries(*args, torch.tensor([[0, 10]]), backend="cuda", **kw)
    M = torch.zeros(2, 8, 8)
    with pytest.raises(ValueError, match="B1"):
        flash_kda.compose_summaries(M, torch.zeros(2, 6, 7), M, torch.zeros(2, 6, 8))
    with pytest.raises(ValueError, match="M2"):
        flash_kda.compose_summaries(M, torch.zeros(2, 6, 8), torch.zeros(3, 8, 8), torch.zeros(2, 6, 8))
    with pytest.raises(TypeError, match="M1"):
        flash_kda.compose_summaries(M.double(), torch.zeros(2, 6, 8), M, torch.zeros(2, 6, 8))
