"""Segment summaries (flash_kda.segment_summaries, compose_summaries) on the CPU
backends: the summaries of any split of varlen GVA sequences, composed along each
sequence and applied to its initial state, give the straight run's final state
(against this package's own float64 torch reference, kda_reference.py), and each
piece's forward from its composed incoming state gives the straight run's outputs.
fwd's summaries call (summaries=) writes the summaries of the whole sequences, and
the two calls of a split forward, rank by rank, give the straight run. Arguments are
checked by name."""
from __future__ import annotations

import pytest
import torch

import flash_kda
from dlpack_fake import DL_CPU, DL_CUDA, DL_VULKAN, FakeDeviceTensor
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


def test_half_precision_gate_parameters_widen_as_in_fwd():
    # A model cast to bf16 or fp16 passes A_log and dt_bias as they are (fwd widens them):
    # bitwise the summaries of their fp32 values.
    p = slow_decay_problem(seed=12)
    segments = torch.tensor([[3, 140], [150, 187]], dtype=torch.int64)
    for dtype in (torch.bfloat16, torch.float16):
        A_h, dt_h = p["A_log"].to(dtype), p["dt_bias"].to(dtype)
        got = flash_kda.segment_summaries(p["q"], p["k"], p["v"], p["g"], p["beta"], A_h, dt_h, segments,
                                          lower_bound=-5.0, cu_seqlens=p["cu_seqlens"])
        want = flash_kda.segment_summaries(p["q"], p["k"], p["v"], p["g"], p["beta"], A_h.float(), dt_h.float(),
                                           segments, lower_bound=-5.0, cu_seqlens=p["cu_seqlens"])
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


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
    # Any other overlap is refused by name: the outputs on one buffer, an output
    # partly over an input.
    buf = torch.zeros(3 * 2 * (8 + 6) * 8)
    with pytest.raises(ValueError, match=r"^M, B: the two outputs overlap"):
        flash_kda.compose_summaries(M1, B1, M2, B2, out=(buf[:384].view(3, 2, 8, 8), buf[128:416].view(3, 2, 6, 8)))
    base = torch.randn(4 * 2 * 8 * 8, generator=gen)
    with pytest.raises(ValueError, match=r"^M: overlaps M1; expected M1 or M2 itself"):
        flash_kda.compose_summaries(base[:384].view(3, 2, 8, 8), B1, M2, B2,
                                    out=(base[128:512].view(3, 2, 8, 8), torch.empty_like(B1)))


def test_strided_token_views_are_the_dense_call():
    # As fwd: q..beta may be views (here v as half of a wider buffer); the summaries
    # have no out to name.
    p = slow_decay_problem(seed=13)
    seg = torch.tensor([[0, 40], [40, 97]])
    kw = dict(lower_bound=-5.0, cu_seqlens=p["cu_seqlens"])
    dense = flash_kda.segment_summaries(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"], seg, **kw)
    v_view = torch.cat([p["v"], torch.zeros_like(p["v"])], dim=-1)[..., :p["v"].shape[-1]]
    assert not v_view.is_contiguous()
    view = flash_kda.segment_summaries(p["q"], p["k"], v_view, p["g"], p["beta"], p["A_log"], p["dt_bias"], seg, **kw)
    assert torch.equal(view[0], dense[0]) and torch.equal(view[1], dense[1])


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


def test_more_segments_than_their_summaries_can_be_allocated_is_named():
    # M and B [S, ...] are allocated before the extension reads segments: a DLPack array
    # can claim any S (here 2^40 rows, 8 PiB of results), and gets an error naming it.
    p = slow_decay_problem(seed=13)
    args = (p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"])
    segments = FakeDeviceTensor((2**40, 2), "int64", DL_CPU, 0, null=True)
    with pytest.raises(ValueError, match=rf"^segments: {2**40} segments need M \[S, HV, K, K\] and B"):
        flash_kda.segment_summaries(*args, segments, cu_seqlens=p["cu_seqlens"])


# ---- fwd's two calls of a split forward (summaries=, resume_from_summaries=) ------

def slow(p):
    p["g"] = torch.full_like(p["g"], -12.0)
    p["A_log"] = torch.zeros_like(p["A_log"])
    p["dt_bias"] = torch.zeros_like(p["dt_bias"])
    return p


def token_args(p):
    return (p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"])


def new_summaries(p):
    N, HV, V, K = p["N"], p["v"].shape[2], p["v"].shape[3], p["q"].shape[3]
    return (torch.full((N, HV, K, K), float("nan")), torch.full((N, HV, V, K), float("nan")))


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("K,V", [(32, 32), (32, 16)])
def test_summaries_call_is_segment_summaries_of_whole_sequences(backend, K, V):
    p = slow(make_problem(H=1, HV=2, K=K, V=V, seqlens=[60, 0, 37, 90], seed=31))
    cu = p["cu_seqlens"]
    segments = torch.stack([cu[:-1], cu[1:]], dim=1)
    want_M, want_B = flash_kda.segment_summaries(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"],
                                                 p["dt_bias"], segments, lower_bound=p["lower_bound"],
                                                 cu_seqlens=cu, backend=backend)
    kw = dict(A_log=p["A_log"], dt_bias=p["dt_bias"], lower_bound=p["lower_bound"], cu_seqlens=cu, backend=backend)
    M, B = new_summaries(p)
    flash_kda.fwd(*token_args(p), None, summaries=(M, B), **kw)
    assert torch.equal(M, want_M) and torch.equal(B, want_B)
    # With an out given: not written.
    out = torch.full_like(p["v"], 7.0)
    M, B = new_summaries(p)
    flash_kda.fwd(*token_args(p), out, summaries=[M, B], **kw)
    assert torch.equal(M, want_M) and torch.equal(B, want_B)
    assert torch.equal(out, torch.full_like(p["v"], 7.0))
    assert flash_kda.workspace_size(*token_args(p), None, summaries=(M, B), **kw) == 0


@pytest.mark.parametrize("backend,bar", [("reference", 5e-7), ("cpu", 5e-6)])
@pytest.mark.parametrize("cut", [67, 9])
def test_two_ranks_give_the_straight_run(backend, bar, cut):
    """Rank 0 holds the first `cut` tokens of sequence 0 (not a multiple of 16); rank 1 the
    rest of it and sequences 1 and 2. Every rank makes the summaries call on its tokens;
    rank 1's incoming state of sequence 0 is rank 0's summary applied to its initial state
    (float64); every rank then makes the resume call from its incoming states."""
    p = slow_decay_problem(seed=40 + cut)
    kw = dict(A_log=p["A_log"], dt_bias=p["dt_bias"], lower_bound=p["lower_bound"], backend=backend)
    straight, straight_final = new_outputs(p)
    flash_kda.fwd(*token_args(p), straight, final_state=straight_final, cu_seqlens=p["cu_seqlens"],
                  initial_state=p["initial_state"], **kw)

    L0 = SEQLENS[0]
    ranks = []
    for begin, end, lengths in ((0, cut, [cut]), (cut, sum(SEQLENS), [L0 - cut] + SEQLENS[1:])):
        r = {key: p[key][:, begin:end] for key in ("q", "k", "v", "g", "beta")}
        r["scale"], r["N"] = p["scale"], len(lengths)
        r["cu_seqlens"] = torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0)
        r["summaries"] = new_summaries(r)
        flash_kda.fwd(*token_args(r), None, cu_seqlens=r["cu_seqlens"], summaries=r["summaries"], **kw)
        ranks.append(r)

    # The exchange: rank 1's sequence 0 starts where rank 0's summary takes the initial state.
    S0 = p["initial_state"].double()
    M0, B0 = (x.double() for x in ranks[0]["summaries"])
    ranks[0]["initial_state"] = p["initial_state"][:1].clone()
    ranks[1]["initial_state"] = torch.cat([(S0[0] @ M0[0] + B0[0])[None], S0[1:]]).float()

    outs = []
    for r in ranks:
        r["out"] = torch.full_like(r["v"], float("nan"))
        r["final"] = torch.full_like(r["initial_state"], float("nan"))
        flash_kda.fwd(*token_args(r), r["out"], initial_state=r["initial_state"], final_state=r["final"],
                      cu_seqlens=r["cu_seqlens"], resume_from_summaries=True, **kw)
        outs.append(r["out"])
    out = torch.cat(outs, dim=1)

    # bf16 roundings of values that agree to fp32 rounding: equal or one ulp apart.
    want = straight.double()
    floor = 1e-6 * want.square().mean().sqrt()
    assert bool(((out.double() - want).abs() <= want.abs() / 128 + floor).all())
    assert rel_rms(out.double(), want) <= 3e-3
    err = rel_rms(ranks[1]["final"], straight_final)
    print(f"{backend:9s} cut at {cut}: final state {err:.3e}")
    assert err <= bar
    # Rank 1's own summaries take its incoming states to the final states.
    M1, B1 = (x.double() for x in ranks[1]["summaries"])
    composed = ranks[1]["initial_state"].double() @ M1 + B1
    assert rel_rms(composed, straight_final) <= bar


def test_summaries_arguments_are_named():
    p = make_problem(H=1, HV=2, K=32, seqlens=[40, 25], seed=50)
    kw = dict(A_log=p["A_log"], dt_bias=p["dt_bias"], cu_seqlens=p["cu_seqlens"])
    out = torch.empty_like(p["v"])
    fin = torch.empty(2, 2, 32, 32)
    M, B = new_summaries(p)
    with pytest.raises(TypeError, match=r"^summaries: expected a pair \(M, B\)"):
        flash_kda.fwd(*token_args(p), None, summaries=M, **kw)
    with pytest.raises(TypeError, match=r"^summaries: expected a pair .* of length 3"):
        flash_kda.fwd(*token_args(p), None, summaries=(M, B, B), **kw)
    with pytest.raises(TypeError, match=r"^summaries\[0\] \(M\): expected dtype float32"):
        flash_kda.fwd(*token_args(p), None, summaries=(M.double(), B), **kw)
    with pytest.raises(TypeError, match=r"^summaries\[1\] \(B\): expected a tensor"):
        flash_kda.fwd(*token_args(p), None, summaries=(M, None), **kw)
    with pytest.raises(ValueError, match=r"^summaries\[0\] \(M\): expected shape \[N, HV, K, K\]"):
        flash_kda.fwd(*token_args(p), None, summaries=(M[:1], B), **kw)
    with pytest.raises(ValueError, match=r"^summaries\[1\] \(B\): expected shape \[N, HV, V, K\]"):
        flash_kda.fwd(*token_args(p), None, summaries=(M, B[..., :16]), **kw)
    with pytest.raises(ValueError, match=r"^summaries\[1\] \(B\): expected a C-contiguous"):
        flash_kda.fwd(*token_args(p), None, summaries=(M, B.transpose(-1, -2)), **kw)
    fake = FakeDeviceTensor(tuple(M.shape), "float32", DL_CUDA, 0)
    with pytest.raises(ValueError, match=r"^summaries\[0\] \(M\): expected a tensor on the same device as q"):
        flash_kda.fwd(*token_args(p), None, summaries=(fake, B), **kw)
    with pytest.raises(ValueError, match="^summaries: given together with resume_from_summaries"):
        flash_kda.fwd(*token_args(p), None, summaries=(M, B), resume_from_summaries=True, **kw)
    with pytest.raises(ValueError, match="^summaries: given together with initial_state / final_state"):
        flash_kda.fwd(*token_args(p), None, summaries=(M, B), initial_state=p["initial_state"], **kw)
    with pytest.raises(ValueError, match="^summaries: given together with initial_state / final_state"):
        flash_kda.fwd(*token_args(p), out, summaries=(M, B), final_state=fin, **kw)
    pool = dict(state_pool=torch.zeros(2, 2, 32, 32), state_indices=torch.tensor([0, 1], dtype=torch.int32))
    with pytest.raises(ValueError, match="^summaries: not supported together with state_pool"):
        flash_kda.fwd(*token_args(p), None, summaries=(M, B), **pool, **kw)
    ck = dict(checkpoints=torch.zeros(4, 2, 32, 32), checkpoint_interval=32)
    with pytest.raises(ValueError, match="^summaries: not supported together with checkpoints"):
        flash_kda.fwd(*token_args(p), None, summaries=(M, B), **ck, **kw)
    # The resume call's own rules come from the library, by the same name.
    with pytest.raises(ValueError, match="^resume_from_summaries: not supported together with state_pool"):
        flash_kda.fwd(*token_args(p), out, resume_from_summaries=True, **pool, **kw)
    with pytest.raises(ValueError, match="^resume_from_summaries: not supported together with checkpoints"):
        flash_kda.fwd(*token_args(p), out, resume_from_summaries=True, **ck, **kw)
    # Without summaries, out is required as ever; workspace_size checks as fwd does.
    with pytest.raises(TypeError, match="^out: expected a tensor, got None"):
        flash_kda.fwd(*token_args(p), None, **kw)
    with pytest.raises(ValueError, match="^summaries: given together with resume_from_summaries"):
        flash_kda.workspace_size(*token_args(p), None, summaries=(M, B), resume_from_summaries=True, **kw)
    # Nothing was written by the rejected calls.
    assert bool(M.isnan().all()) and bool(B.isnan().all())


# ---- on CUDA --------------------------------------------------------------------------

@pytest.mark.skipif(not torch.cuda.is_available() or not flash_kda.cuda_status()[0],
                    reason="needs a CUDA device and flash_kda's CUDA backend")
@pytest.mark.parametrize("K", [128, 64])
def test_cuda_summaries_of_given_ranges_match_the_cpu(K):
    """CUDA tensors: each range as a summaries call on the GPU, against the CPU
    backend's summaries of the same ranges (whole sequences, inside one, one token,
    empty, overlapping)."""
    p = make_problem(H=1, HV=2, K=K, seqlens=SEQLENS, seed=30)
    p["g"] = torch.full_like(p["g"], -12.0)
    p["A_log"] = torch.zeros_like(p["A_log"])
    p["dt_bias"] = torch.zeros_like(p["dt_bias"])
    segs = torch.tensor([[0, 150], [10, 120], [150, 151], [187, 187], [187, 277], [160, 187]])
    args = [p[n] for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias")]
    M_c, B_c = flash_kda.segment_summaries(*args, segs, lower_bound=-5.0, cu_seqlens=p["cu_seqlens"])
    cuda_args = [x.cuda() for x in args]
    M_g, B_g = flash_kda.segment_summaries(*cuda_args, segs.cuda(), lower_bound=-5.0,
                                           cu_seqlens=p["cu_seqlens"].cuda())
    assert M_g.is_cuda and B_g.is_cuda
    e_m, e_b = rel_rms(M_g.cpu(), M_c), rel_rms(B_g.cpu(), B_c)
    print(f"K={K}: CUDA segment summaries against the CPU's: M {e_m:.2e}, B {e_b:.2e}")
    assert e_m <= 2.5e-3 and e_b <= 2.5e-3
    assert torch.equal(M_g[3].cpu(), M_c[3]) and torch.equal(B_g[3].cpu(), B_c[3])  # empty: (I, 0)
    with pytest.raises(ValueError, match="past the end of sequence 0"):
        flash_kda.segment_summaries(*cuda_args, torch.tensor([[140, 160]]).cuda(), lower_bound=-5.0,
                                    cu_seqlens=p["cu_seqlens"].cuda())


@pytest.mark.skipif(not torch.cuda.is_available() or not flash_kda.cuda_status()[0],
                    reason="needs a CUDA device and flash_kda's CUDA backend")
def test_cuda_compose_matches_the_cpu_in_place_and_in_a_graph():
    """CUDA tensors compose on the GPU: the CPU's float64 sums rounded to fp32 (at most
    one ulp apart), in place over either input, on a side stream and under graph capture;
    K above 128 refused on CUDA, naming the argument."""
    gen = torch.Generator().manual_seed(31)
    HV, K, V = 3, 128, 128
    M1, M2 = (torch.randn(2, HV, K, K, generator=gen) / K ** 0.5 for _ in range(2))
    B1, B2 = (torch.randn(2, HV, V, K, generator=gen) for _ in range(2))
    M_c, B_c = flash_kda.compose_summaries(M1, B1, M2, B2)

    def ulps(x, ref):
        spacing = torch.abs(torch.nextafter(ref, torch.full_like(ref, float("inf"))) - ref)
        return float(((x.cpu() - ref).abs() / spacing).max())

    g = [x.cuda() for x in (M1, B1, M2, B2)]
    M_g, B_g = flash_kda.compose_summaries(*g)
    assert ulps(M_g, M_c) <= 1 and ulps(B_g, B_c) <= 1
    # In place of (M2, B2), on a side stream.
    side = torch.cuda.Stream()
    m2, b2 = g[2].clone(), g[3].clone()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        flash_kda.compose_summaries(g[0], g[1], m2, b2, out=(m2, b2))
    side.synchronize()
    assert torch.equal(m2, M_g) and torch.equal(b2, B_g)
    # In place of (M1, B1), captured in a graph and replayed.
    m1, b1 = g[0].clone(), g[1].clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flash_kda.compose_summaries(m1, b1, g[2], g[3], out=(m1, b1))
    m1.copy_(g[0])
    b1.copy_(g[1])
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(m1, M_g) and torch.equal(b1, B_g)
    big = torch.zeros(1, 129, 129, device="cuda")
    with pytest.raises(NotImplementedError, match=r"^head_dim_k: the composition on backend kCuda runs head dims in \[1, 128\], got 129"):
        flash_kda.compose_summaries(big, torch.zeros(1, 4, 129, device="cuda"), big,
                                    torch.zeros(1, 4, 129, device="cuda"))


class _DLPackOnly:
    """A torch tensor seen only through DLPack (and its shape), as another framework's
    array would be."""

    def __init__(self, t):
        self._t, self.shape = t, tuple(t.shape)

    def __dlpack__(self, *args, **kwargs):
        return self._t.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


def test_dlpack_q_allocates_on_its_device_and_other_objects_are_named():
    # M and B are allocated beside q: from a DLPack array's device, as from a tensor's.
    p = slow_decay_problem(seed=14)
    args = [p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"]]
    segments = torch.tensor([[0, 6], [6, 12]], dtype=torch.int64)
    M, B = flash_kda.segment_summaries(*args, segments, cu_seqlens=p["cu_seqlens"])
    args[0] = _DLPackOnly(p["q"])
    M2, B2 = flash_kda.segment_summaries(*args, segments, cu_seqlens=p["cu_seqlens"])
    assert M2.device == M.device and torch.equal(M2, M) and torch.equal(B2, B)
    args[0] = FakeDeviceTensor(tuple(p["q"].shape), "bfloat16", DL_VULKAN, 0)
    with pytest.raises(TypeError, match=r"^q: expected a torch tensor or a DLPack array in CPU or CUDA memory"):
        flash_kda.segment_summaries(*args, segments, cu_seqlens=p["cu_seqlens"])
