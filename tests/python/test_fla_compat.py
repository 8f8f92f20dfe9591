"""flash_kda.chunk_kda, fla's entry point: the same numbers as flash_kda.fwd in fla's
layouts (state_v_first False and True, intermediate states every 64 tokens, a state pool
through initial_state_indices), and the unsupported flags refused by name. CPU tensors
here; the comparison with fla's own chunk_kda needs its Triton kernels (GPU)."""
from __future__ import annotations

import math

import pytest
import torch

import flash_kda
from kda_reference import make_problem

FLAGS = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
             safe_gate=True)


def direct(p, state_v_first):
    out = torch.empty_like(p["v"])
    fin = torch.empty_like(p["initial_state"])
    flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, A_log=p["A_log"],
                  dt_bias=p["dt_bias"], lower_bound=p["lower_bound"], initial_state=p["initial_state"],
                  final_state=fin, cu_seqlens=p["cu_seqlens"])
    return out, fin if state_v_first else fin.transpose(-1, -2)


@pytest.mark.parametrize("state_v_first", [False, True])
@pytest.mark.parametrize("varlen", [False, True])
def test_chunk_kda_is_fwd_in_flas_layout(state_v_first, varlen):
    p = make_problem(B=1 if varlen else 2, T=150, H=2, HV=4, K=32, seqlens=[150, 0, 70] if varlen else None,
                     seed=21)
    s0 = p["initial_state"] if state_v_first else p["initial_state"].transpose(-1, -2).contiguous()
    o, fs, h = flash_kda.chunk_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], scale=p["scale"], initial_state=s0,
                                   output_final_state=True, lower_bound=p["lower_bound"],
                                   return_intermediate_states=True, state_v_first=state_v_first,
                                   cu_seqlens=p["cu_seqlens"], A_log=p["A_log"], dt_bias=p["dt_bias"].flatten(),
                                   **FLAGS)
    o_ref, fs_ref = direct(p, state_v_first)
    assert torch.equal(o, o_ref) and fs.dtype == torch.float32 and torch.equal(fs, fs_ref)
    lengths = [150, 0, 70] if varlen else [150, 150]
    nt = sum(math.ceil(L / 64) for L in lengths)
    assert h.dtype == torch.bfloat16
    assert h.shape == ((1, nt) if varlen else (2, 3)) + ((4, 32, 32))
    # The first chunk's state of the first sequence is its initial state.
    first = p["initial_state"][0] if state_v_first else p["initial_state"][0].transpose(-1, -2)
    assert torch.equal(h.reshape(-1, 4, 32, 32)[0], first.bfloat16())


def test_chunk_kda_takes_cu_seqlens_cpu():
    # fla's host copy of the boundaries (int32 or int64) goes on as fwd's cu_seqlens_host.
    p = make_problem(B=1, H=2, K=32, seqlens=[150, 0, 70], seed=23)
    kw = dict(scale=p["scale"], initial_state=p["initial_state"], output_final_state=True, state_v_first=True,
              lower_bound=p["lower_bound"], cu_seqlens=p["cu_seqlens"], A_log=p["A_log"], dt_bias=p["dt_bias"],
              return_intermediate_states=True, **FLAGS)
    o, fs, h = flash_kda.chunk_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], **kw)
    for cpu in (p["cu_seqlens"].clone(), p["cu_seqlens"].to(torch.int32)):
        o2, fs2, h2 = flash_kda.chunk_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], cu_seqlens_cpu=cpu, **kw)
        assert torch.equal(o, o2) and torch.equal(fs, fs2) and torch.equal(h, h2)


def test_chunk_kda_cu_seqlens_cpu_needs_cu_seqlens_and_integers():
    # Neither was caught: without cu_seqlens the batch ran as one sequence, and a float
    # copy was truncated to int64 (here into a valid copy of cu_seqlens).
    p = make_problem(B=1, T=40, H=2, K=32, seed=23)
    kw = dict(A_log=p["A_log"], dt_bias=p["dt_bias"], lower_bound=p["lower_bound"], **FLAGS)
    args = (p["q"], p["k"], p["v"], p["g"], p["beta"])
    with pytest.raises(ValueError, match=r"^cu_seqlens_cpu: given without cu_seqlens"):
        flash_kda.chunk_kda(*args, cu_seqlens_cpu=torch.tensor([0, 20, 40]), **kw)
    with pytest.raises(TypeError, match=r"^cu_seqlens_cpu: expected dtype int64 or int32, got torch.float32"):
        flash_kda.chunk_kda(*args, cu_seqlens=torch.tensor([0, 40]), cu_seqlens_cpu=torch.tensor([0., 40.7]), **kw)


def test_chunk_kda_on_a_state_pool():
    p = make_problem(B=1, H=1, K=32, seqlens=[40, 24], seed=22)
    pool = torch.zeros(3, 1, 32, 32)
    pool[2], pool[0] = p["initial_state"][0], p["initial_state"][1]
    idx = torch.tensor([2, 0])
    o, fs = flash_kda.chunk_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], initial_state=pool,
                                state_v_first=True, cu_seqlens=p["cu_seqlens"], A_log=p["A_log"],
                                dt_bias=p["dt_bias"], initial_state_indices=idx, **FLAGS)
    o_ref, fs_ref = direct(p, True)
    assert fs is None and torch.equal(o, o_ref)
    assert torch.equal(pool[2], fs_ref[0]) and torch.equal(pool[0], fs_ref[1])
    # The slots as a strided column of a block table, as engines keep them.
    table = torch.tensor([[2, 1], [0, 1]])
    assert not table[:, 0].is_contiguous()
    pool2 = torch.zeros(3, 1, 32, 32)
    pool2[2], pool2[0] = p["initial_state"][0], p["initial_state"][1]
    o2, _ = flash_kda.chunk_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], initial_state=pool2,
                                state_v_first=True, cu_seqlens=p["cu_seqlens"], A_log=p["A_log"],
                                dt_bias=p["dt_bias"], initial_state_indices=table[:, 0], **FLAGS)
    assert torch.equal(o2, o) and torch.equal(pool2, pool)


@pytest.mark.parametrize("flag,value", [("use_qk_l2norm_in_kernel", False), ("allow_neg_eigval", True)])
def test_unsupported_flags_are_named(flag, value):
    p = make_problem(B=1, T=16, H=1, K=32, seed=23)
    kw = dict(FLAGS, A_log=p["A_log"], dt_bias=p["dt_bias"])
    kw[flag] = value
    with pytest.raises(NotImplementedError, match=flag):
        flash_kda.chunk_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], **kw)


def _chunk(p, **kw):
    args = dict(scale=p["scale"], initial_state=p["initial_state"], output_final_state=True, state_v_first=True,
                lower_bound=p["lower_bound"], cu_seqlens=p["cu_seqlens"], A_log=p["A_log"], dt_bias=p["dt_bias"],
                return_intermediate_states=True, **FLAGS)
    args.update(kw)
    return flash_kda.chunk_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], **args)


def test_chunk_kda_refuses_inputs_that_require_grad():
    # Forward only: an output without a gradient would train silently without it.
    p = make_problem(B=1, T=40, H=1, K=32, seed=40)
    q = p["q"].clone().requires_grad_()
    with pytest.raises(NotImplementedError, match=r"chunk_kda: flash_kda computes the forward only, and q requires "
                                                  r"grad"):
        _chunk(dict(p, q=q))
    with pytest.raises(NotImplementedError, match=r"A_log requires grad"):
        _chunk(p, A_log=p["A_log"].clone().requires_grad_())
    with torch.no_grad():
        o, fs, h = _chunk(dict(p, q=q))
    o2, fs2, h2 = _chunk(p)
    assert torch.equal(o, o2) and torch.equal(fs, fs2) and torch.equal(h, h2)


def test_chunk_kda_fixed_intermediate_states_with_use_graph():
    # fla's graph mode: h has ceil(T / 64) + max_num_seqs - 1 rows whatever the lengths
    # (nothing read on the host), the sequences' chunks first, in the same order.
    p = make_problem(B=1, H=2, K=32, seqlens=[70, 30, 0, 0], seed=41)
    o, fs, h = _chunk(p)
    og, fsg, hg = _chunk(p, use_graph=True)
    assert hg.shape == (1, math.ceil(100 / 64) + 4 - 1) + h.shape[2:]
    assert torch.equal(og, o) and torch.equal(fsg, fs) and torch.equal(hg[:, :h.shape[1]], h)
    with pytest.raises(ValueError, match=r"^max_num_seqs: expected cu_seqlens padded with empty sequences to "
                                         r"max_num_seqs \+ 1 = 6 entries \(use_graph\), got 5"):
        _chunk(p, use_graph=True, max_num_seqs=5)


def test_chunk_kda_takes_flas_other_spellings():
    p = make_problem(B=1, H=2, K=32, seqlens=[70, 30], seed=42)
    o, fs, h = _chunk(p)
    # The deprecated name of state_v_first.
    o2, fs2, h2 = _chunk(p, state_v_first=False, transpose_state_layout=True)
    assert torch.equal(o2, o) and torch.equal(fs2, fs) and torch.equal(h2, h)
    # The gate is lower_bound's whatever safe_gate says.
    o3, fs3, h3 = _chunk(p, safe_gate=False)
    assert torch.equal(o3, o) and torch.equal(fs3, fs) and torch.equal(h3, h)
    # chunk_size 32: h every 32 tokens (every other entry is the 64-token one).
    o4, fs4, h4 = _chunk(p, chunk_size=32)
    assert torch.equal(o4, o) and h4.shape[1] == math.ceil(70 / 32) + math.ceil(30 / 32)
    assert torch.equal(h4[:, [0, 2, 3]], h)
    with pytest.raises(ValueError, match=r"^chunk_size: expected 32 or 64"):
        _chunk(p, chunk_size=16)
    # A head-first storage (a permuted view) runs as its dense copy.
    vt = p["v"].transpose(1, 2).contiguous().transpose(1, 2)
    o5, fs5, h5 = _chunk(dict(p, v=vt))
    assert torch.equal(o5, o) and torch.equal(fs5, fs) and torch.equal(h5, h)


@pytest.mark.parametrize("entry", ["chunk_kda", "fused_recurrent_kda"])
def test_missing_or_half_precision_gate_parameters_are_flas(entry):
    # fla's gate: no A_log is a factor exp(0) = 1, no dt_bias is 0; bf16 ones widen exactly.
    p = make_problem(B=1, H=2, K=32, seqlens=[20, 9], seed=43)
    A_log16, dt_bias16 = p["A_log"].bfloat16(), p["dt_bias"].bfloat16()
    zeros = dict(A_log=torch.zeros_like(p["A_log"]), dt_bias=torch.zeros_like(p["dt_bias"]))
    if entry == "chunk_kda":
        run = lambda **kw: _chunk(p, **kw)[:2]  # noqa: E731
    else:
        kw0 = dict(scale=p["scale"], initial_state=p["initial_state"], output_final_state=True, state_v_first=True,
                   lower_bound=p["lower_bound"], cu_seqlens=p["cu_seqlens"], **RFLAGS)
        run = lambda **kw: flash_kda.fused_recurrent_kda(  # noqa: E731
            p["q"], p["k"], p["v"], p["g"], p["beta"], **dict(kw0, **dict(dict(A_log=p["A_log"],
                                                                               dt_bias=p["dt_bias"]), **kw)))
    for a, b in zip(run(A_log=None, dt_bias=None), run(**zeros)):
        assert torch.equal(a, b)
    for a, b in zip(run(A_log=A_log16, dt_bias=dt_bias16), run(A_log=A_log16.float(), dt_bias=dt_bias16.float())):
        assert torch.equal(a, b)


def test_shapes_outside_flas_layout_are_named():
    """A head-first [B, H, T, K] call and a dt_bias of the wrong size get errors that name
    the argument, not a reshape failure."""
    p = make_problem(B=1, T=16, H=2, K=32, seed=24)
    kw = dict(FLAGS, A_log=p["A_log"], dt_bias=p["dt_bias"].flatten())
    head_first = [p[n].transpose(1, 2) for n in ("q", "k", "v", "g")]
    with pytest.raises(ValueError, match=r"dt_bias: expected shape \[HV \* K\] = \[512\]"):
        flash_kda.chunk_kda(*head_first, p["beta"].transpose(1, 2), **kw)
    with pytest.raises(ValueError, match=r"q: expected a tensor \[B, T, heads, dim\]"):
        flash_kda.chunk_kda(p["q"][0], p["k"][0], p["v"][0], p["g"][0], p["beta"][0], **kw)
    o, _ = flash_kda.chunk_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], **kw)
    assert o.shape == p["v"].shape




def test_chunk_kda_bad_boundaries_and_types_are_named():
    p = make_problem(B=1, T=150, H=2, HV=4, K=32, seqlens=[150, 0, 70], seed=25)
    T = p["q"].shape[1]
    args = (p["q"], p["k"], p["v"], p["g"], p["beta"])
    kw = dict(FLAGS, A_log=p["A_log"], dt_bias=p["dt_bias"], lower_bound=p["lower_bound"])
    cu = p["cu_seqlens"]
    for extra, err, match in [
            (dict(cu_seqlens=5), TypeError, r"^cu_seqlens: expected a 1-d tensor \[N\+1\] with N >= 1, got int"),
            (dict(cu_seqlens=torch.tensor(5)), ValueError, r"^cu_seqlens: expected a 1-d tensor"),
            (dict(cu_seqlens=cu[:0], output_final_state=True), ValueError, r"^cu_seqlens: expected a 1-d tensor"),
            (dict(cu_seqlens=cu, cu_seqlens_cpu=cu.tolist()), TypeError, r"^cu_seqlens_cpu: expected a 1-d tensor"),
            (dict(cu_seqlens=torch.tensor([0, 150, 150, 2**62]), return_intermediate_states=True), ValueError,
             rf"^cu_seqlens: expected 0 = cu_seqlens\[0\] <= ... <= cu_seqlens\[N\] = T = {T}"),
            (dict(dt_bias=p["dt_bias"].tolist()), TypeError, r"^dt_bias: expected a torch.Tensor, got list"),
            (dict(cu_seqlens=cu, initial_state=p["initial_state"], state_v_first=True,
                  initial_state_indices=torch.tensor([0, 1, 99])), ValueError, r"^initial_state_indices: "),
            # fwd's own names (cu_seqlens_host, state_pool, states_key_major) turned into
            # the ones the caller passed
            (dict(cu_seqlens=cu, cu_seqlens_cpu=torch.tensor([0, 100, 100, 220])), ValueError,
             r"^cu_seqlens_cpu: expected a copy of cu_seqlens, but cu_seqlens_cpu\[1\]=100"),
            (dict(cu_seqlens=cu, cu_seqlens_cpu=cu, return_intermediate_states=True,
                  initial_state=torch.zeros(3, 4, 32, 33)), ValueError,
             r"^initial_state: expected shape \[N, HV, K, V\] \(fla's layout, state_v_first=False\)"),
            (dict(cu_seqlens=cu, initial_state=torch.zeros(5, 4, 16, 32), state_v_first=True,
                  initial_state_indices=torch.tensor([0, 1, 2])), ValueError, r"^initial_state: "),
    ]:
        with pytest.raises(err, match=match):
            flash_kda.chunk_kda(*args, **{**kw, **extra})
    # No tokens: fla's empty h, not an error about the buffer.
    z = [x[:, :0] for x in args]
    o, _, h = flash_kda.chunk_kda(*z, cu_seqlens=torch.tensor([0, 0]), return_intermediate_states=True, **kw)
    assert o.shape[1] == 0 and h.shape[:2] == (1, 0)

@pytest.mark.parametrize("output_final_state", [False, True])
def test_chunk_kda_state_dtypes(output_final_state):
    """fla reads a state of any float dtype into fp32: fp16 and bf16 states are widened
    exactly (the same numbers as the fp32 call on the widened state); a float64 state
    (which would be rounded) or an integer one is an error naming initial_state."""
    p = make_problem(B=1, T=70, H=2, HV=4, K=32, seqlens=[40, 30], seed=26)
    args = (p["q"], p["k"], p["v"], p["g"], p["beta"])
    kw = dict(FLAGS, A_log=p["A_log"], dt_bias=p["dt_bias"], lower_bound=p["lower_bound"], cu_seqlens=p["cu_seqlens"],
              output_final_state=output_final_state)
    s0 = p["initial_state"].transpose(-1, -2).contiguous()
    for dtype in (torch.float16, torch.bfloat16):
        narrow = s0.to(dtype)
        o, fs = flash_kda.chunk_kda(*args, initial_state=narrow, **kw)
        o_ref, fs_ref = flash_kda.chunk_kda(*args, initial_state=narrow.float(), **kw)
        assert torch.equal(o, o_ref), dtype
        assert (fs is None) == (not output_final_state)
        if output_final_state:
            assert fs.dtype == torch.float32 and torch.equal(fs, fs_ref), dtype
    for dtype in (torch.float64, torch.int32):
        with pytest.raises(TypeError, match=r"^initial_state: expected dtype float32, bfloat16 or float16"):
            flash_kda.chunk_kda(*args, initial_state=s0.to(dtype), **kw)
        with pytest.raises(TypeError, match=r"^initial_state: expected dtype float32, bfloat16 or float16"):
            flash_kda.fused_recurrent_kda(*args, initial_state=s0.to(dtype), A_log=p["A_log"], dt_bias=p["dt_bias"],
                                          lower_bound=-5.0, cu_seqlens=p["cu_seqlens"], **RFLAGS)

# ---- fused_recurrent_kda: fla's token-by-token entry point ---------------------------

RFLAGS = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True)


def decoded(p, state_v_first, initial_state):
    """flash_kda.decode on a pool of the N initial states (zero without them): out and
    the final states, in fla's layout."""
    N, HV, V, K = p["N"], p["v"].shape[2], p["v"].shape[3], p["q"].shape[3]
    pool = (initial_state.float().clone() if initial_state is not None else torch.zeros(N, HV, V, K))
    out = flash_kda.decode(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"], pool,
                           torch.arange(N, dtype=torch.int32), scale=p["scale"], lower_bound=p["lower_bound"],
                           cu_seqlens=p["cu_seqlens"])
    return out, pool if state_v_first else pool.transpose(-1, -2)


@pytest.mark.parametrize("state_v_first", [False, True])
@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16, None])
def test_fused_recurrent_kda_is_decode_in_flas_layout(state_v_first, varlen, state_dtype):
    p = make_problem(B=1 if varlen else 2, T=5, H=2, HV=4, K=32, seqlens=[3, 0, 6] if varlen else None,
                     state_dtype=state_dtype, seed=31)
    s0 = p["initial_state"]
    given = None if s0 is None else (s0 if state_v_first else s0.transpose(-1, -2).contiguous())
    before = None if given is None else given.clone()
    o, fs = flash_kda.fused_recurrent_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], A_log=p["A_log"],
                                          dt_bias=p["dt_bias"].flatten(), scale=p["scale"], initial_state=given,
                                          output_final_state=True, lower_bound=p["lower_bound"],
                                          state_v_first=state_v_first, cu_seqlens=p["cu_seqlens"], **RFLAGS)
    o_ref, fs_ref = decoded(p, state_v_first, s0)
    assert torch.equal(o, o_ref)
    assert fs.dtype == torch.float32 and fs.shape == fs_ref.shape and torch.equal(fs, fs_ref)
    if given is not None:
        assert torch.equal(given, before), "initial_state is left as it was"
    o2, none = flash_kda.fused_recurrent_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], A_log=p["A_log"],
                                             dt_bias=p["dt_bias"], scale=p["scale"], initial_state=given,
                                             lower_bound=p["lower_bound"], state_v_first=state_v_first,
                                             cu_seqlens=p["cu_seqlens"], **RFLAGS)
    assert none is None and torch.equal(o2, o)
    if given is not None:
        assert torch.equal(given, before), "initial_state is left as it was"


def test_fused_recurrent_kda_serving_form_is_decode_on_the_pool():
    # fla's fused_recurrent_kda_fwd serving arguments: ssm_state_indices into the pool,
    # in place; [N, 1 + S] with num_accepted_tokens for speculative verify.
    p = make_problem(B=1, H=2, K=32, seqlens=[3, 2], seed=32)
    gen = torch.Generator().manual_seed(33)
    pool0 = 0.1 * torch.randn(8, 2, 32, 32, generator=gen)
    for idx, acc in ((torch.tensor([5, 2], dtype=torch.int32), None),
                     (torch.tensor([[0, 1, 2], [3, 4, -1]], dtype=torch.int32), torch.tensor([2, 1], dtype=torch.int32))):
        pool, ref_pool = pool0.clone(), pool0.clone()
        o, fs = flash_kda.fused_recurrent_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], A_log=p["A_log"],
                                              dt_bias=p["dt_bias"], initial_state=pool, lower_bound=-5.0,
                                              state_v_first=True, cu_seqlens=p["cu_seqlens"], ssm_state_indices=idx,
                                              num_accepted_tokens=acc, inplace_final_state=True, **RFLAGS)
        ref = flash_kda.decode(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"], ref_pool, idx,
                               cu_seqlens=p["cu_seqlens"], num_accepted_tokens=acc)
        assert fs is pool and torch.equal(o, ref) and torch.equal(pool, ref_pool)
    # A padding entry (a negative slot): its rows of o are zeros, as fla allocates o.
    pool = pool0.clone()
    o, _ = flash_kda.fused_recurrent_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], A_log=p["A_log"],
                                         dt_bias=p["dt_bias"], initial_state=pool, lower_bound=-5.0,
                                         state_v_first=True, cu_seqlens=p["cu_seqlens"],
                                         ssm_state_indices=torch.tensor([-1, 2], dtype=torch.int32),
                                         inplace_final_state=True, **RFLAGS)
    assert torch.all(o[0, :3] == 0) and not torch.all(o[0, 3:] == 0)
    assert torch.equal(pool[[0, 1, 3, 4, 5, 6, 7]], pool0[[0, 1, 3, 4, 5, 6, 7]])


def test_fused_recurrent_kda_serving_form_without_draft_tokens():
    # ssm_state_indices [N, 1] with num_accepted_tokens (fla's serving form when no
    # draft tokens are proposed): the plain step on ssm_state_indices [N].
    p = make_problem(B=1, H=2, K=32, seqlens=[1, 1, 1], seed=35)
    pool0 = 0.1 * torch.randn(6, 2, 32, 32, generator=torch.Generator().manual_seed(36))
    outs = []
    for idx, acc in ((torch.tensor([4, -1, 1]), None), (torch.tensor([[4], [-1], [1]]), torch.ones(3, dtype=torch.int64))):
        pool = pool0.clone()
        o, _ = flash_kda.fused_recurrent_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], A_log=p["A_log"],
                                             dt_bias=p["dt_bias"], initial_state=pool, lower_bound=-5.0,
                                             state_v_first=True, cu_seqlens=p["cu_seqlens"], ssm_state_indices=idx,
                                             num_accepted_tokens=acc, inplace_final_state=True, **RFLAGS)
        outs.append((o, pool))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert not torch.equal(outs[0][1], pool0)


def test_fused_recurrent_kda_within_the_bars_of_the_float64_recurrence():
    from kda_reference import reference, rel_rms
    p = make_problem(B=1, H=2, HV=4, K=32, seqlens=[40, 1, 17], seed=34)
    o, fs = flash_kda.fused_recurrent_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], A_log=p["A_log"],
                                          dt_bias=p["dt_bias"], initial_state=p["initial_state"],
                                          output_final_state=True, lower_bound=p["lower_bound"], state_v_first=True,
                                          cu_seqlens=p["cu_seqlens"], **RFLAGS)
    o_ref, fs_ref = reference(p)
    assert rel_rms(o, o_ref) < 3.5e-3 and rel_rms(fs, fs_ref) < 1e-6


@pytest.mark.parametrize("kw,err,match", [
    (dict(use_qk_l2norm_in_kernel=False), NotImplementedError, "use_qk_l2norm_in_kernel=True"),
    (dict(allow_neg_eigval=True), NotImplementedError, "allow_neg_eigval=False"),
    (dict(inplace_final_state=True), NotImplementedError, "needs ssm_state_indices"),
    (dict(num_accepted_tokens=torch.tensor([1])), ValueError, "^num_accepted_tokens: given without ssm_state_indices"),
    (dict(ssm_state_indices=torch.tensor([0]), inplace_final_state=True), NotImplementedError, "state_v_first=True"),
    (dict(bogus=1), TypeError, "unexpected arguments \\['bogus'\\]"),
])
def test_fused_recurrent_kda_refuses_what_it_does_not_compute(kw, err, match):
    p = make_problem(B=1, T=4, H=1, K=32, seed=35)
    args = dict(A_log=p["A_log"], dt_bias=p["dt_bias"], initial_state=p["initial_state"], lower_bound=-5.0, **RFLAGS)
    args.update(kw)
    with pytest.raises(err, match=match):
        flash_kda.fused_recurrent_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], **args)


def test_fused_recurrent_kda_leaves_any_initial_state_view_alone():
    # fla's default layout handed a transposed view of V-first states: the pool the
    # decode reads is then that memory itself; the final states must go elsewhere.
    p = make_problem(B=2, T=3, H=2, K=32, state_dtype=None, seed=36)
    gen = torch.Generator().manual_seed(37)
    vfirst = 0.1 * torch.randn(2, 2, 32, 32, generator=gen)
    kw = dict(A_log=p["A_log"], dt_bias=p["dt_bias"], lower_bound=-5.0, **RFLAGS)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        base = vfirst.to(dtype)
        h0 = base.transpose(-1, -2)  # [N, HV, K, V], a view
        before = base.clone()
        for output_final_state in (False, True):
            o, fs = flash_kda.fused_recurrent_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], initial_state=h0,
                                                  output_final_state=output_final_state, **kw)
            assert torch.equal(base, before), f"{dtype}: initial_state written"
            o_ref, fs_ref = decoded(p, False, base.float())
            assert torch.equal(o, o_ref) and (fs is None) == (not output_final_state)
            if output_final_state:
                assert torch.equal(fs, fs_ref)


def test_fused_recurrent_kda_checks_shapes_by_name():
    p = make_problem(B=1, H=2, K=32, seqlens=[3, 2], seed=38)
    kw = dict(A_log=p["A_log"], dt_bias=p["dt_bias"], lower_bound=-5.0, cu_seqlens=p["cu_seqlens"], **RFLAGS)
    for rows in (1, 5):
        with pytest.raises(ValueError, match=r"^initial_state: expected a tensor \[2, 2, 32, 32\]"):
            flash_kda.fused_recurrent_kda(p["q"], p["k"], p["v"], p["g"], p["beta"],
                                          initial_state=torch.zeros(rows, 2, 32, 32), **kw)
    # Serving form without cu_seqlens: one row of ssm_state_indices per batch row.
    b = make_problem(B=2, T=3, H=2, K=32, seed=39)
    pool = torch.zeros(6, 2, 32, 32)
    with pytest.raises(ValueError, match=r"^ssm_state_indices: expected one row per batch row of q \(B=2\)"):
        flash_kda.fused_recurrent_kda(b["q"], b["k"], b["v"], b["g"], b["beta"], A_log=b["A_log"],
                                      dt_bias=b["dt_bias"], lower_bound=-5.0, initial_state=pool, state_v_first=True,
                                      inplace_final_state=True, ssm_state_indices=torch.tensor([0, 1, 2]), **RFLAGS)
    # decode's own names (state_indices, state_pool) turned into the caller's.
    serving = dict(A_log=b["A_log"], dt_bias=b["dt_bias"], lower_bound=-5.0, state_v_first=True,
                   inplace_final_state=True, **RFLAGS)
    for pool_, idx, err, match in [
            (pool, torch.tensor([0, 9]), ValueError, r"^ssm_state_indices: entry 1 is 9, expected < pool_size=6"),
            (pool, torch.tensor([0.0, 1.0]), TypeError, r"^ssm_state_indices: expected dtype int32 or int64"),
            (torch.zeros(6, 2, 32, 16), torch.tensor([0, 1]), ValueError, r"^initial_state: expected shape \[P, HV, V, K\]"),
            (pool.to(torch.int32), torch.tensor([0, 1]), TypeError, r"^initial_state: expected dtype float32 or bfloat16")]:
        with pytest.raises(err, match=match):
            flash_kda.fused_recurrent_kda(b["q"], b["k"], b["v"], b["g"], b["beta"], initial_state=pool_,
                                          ssm_state_indices=idx, **serving)


def test_fused_recurrent_kda_without_sequences_names_cu_seqlens_or_q():
    # N sequences are read from cu_seqlens (or B) to size the states: none is an error
    # naming them, not one about the internal pool of N slots.
    p = make_problem(B=1, H=2, K=32, seqlens=[3, 2], seed=38)
    kw = dict(A_log=p["A_log"], dt_bias=p["dt_bias"], lower_bound=-5.0, **RFLAGS)
    args = (p["q"], p["k"], p["v"], p["g"], p["beta"])
    for cu, got in ((torch.tensor([0]), r"\[1\]"), (p["cu_seqlens"][None], r"\[1, 3\]")):
        with pytest.raises(ValueError, match=rf"^cu_seqlens: expected a 1-d tensor \[N\+1\] with N >= 1, got {got}"):
            flash_kda.fused_recurrent_kda(*args, cu_seqlens=cu, **kw)
    with pytest.raises(ValueError, match=r"^q: expected at least one sequence \(B >= 1\), got shape \[0, 5, 2, 32\]"):
        flash_kda.fused_recurrent_kda(*(x[:0] for x in args), output_final_state=True, **kw)


def test_fused_recurrent_kda_without_tokens_returns_the_states_unchanged():
    # T = 0 in fla's [B, T] layout: o is empty and each batch row's state comes back
    # unchanged (fla's loop of no steps); on a pool the slots stay as they were.
    p = make_problem(B=2, T=3, H=2, K=32, seed=39)
    args = tuple(x[:, :0] for x in (p["q"], p["k"], p["v"], p["g"], p["beta"]))
    kw = dict(A_log=p["A_log"], dt_bias=p["dt_bias"], lower_bound=-5.0, **RFLAGS)
    s0 = 0.1 * torch.randn(2, 2, 32, 32, generator=torch.Generator().manual_seed(40))
    o, fs = flash_kda.fused_recurrent_kda(*args, initial_state=s0, output_final_state=True, **kw)
    assert o.shape == (2, 0, 2, 32) and torch.equal(fs, s0)
    o, fs = flash_kda.fused_recurrent_kda(*args, output_final_state=True, **kw)
    assert torch.equal(fs, torch.zeros_like(s0))
    pool = 0.1 * torch.randn(5, 2, 32, 32, generator=torch.Generator().manual_seed(41))
    before = pool.clone()
    o, fs = flash_kda.fused_recurrent_kda(*args, initial_state=pool, ssm_state_indices=torch.tensor([3, 1]),
                                          state_v_first=True, inplace_final_state=True, **kw)
    assert fs is pool and torch.equal(pool, before) and o.shape == (2, 0, 2, 32)


def test_fused_recurrent_kda_takes_strided_slot_indices():
    # fla reads ssm_state_indices through its strides: an engine's block-table column.
    p = make_problem(B=1, H=2, K=32, seqlens=[3, 2], seed=40)
    gen = torch.Generator().manual_seed(41)
    pool0 = 0.1 * torch.randn(8, 2, 32, 32, generator=gen)
    table = torch.tensor([[5, 7, 0], [2, 6, 1]], dtype=torch.int32)
    results = []
    for idx in (table[:, 0], table[:, 0].contiguous()):
        pool = pool0.clone()
        o, _ = flash_kda.fused_recurrent_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], A_log=p["A_log"],
                                             dt_bias=p["dt_bias"], initial_state=pool, lower_bound=-5.0,
                                             state_v_first=True, cu_seqlens=p["cu_seqlens"], ssm_state_indices=idx,
                                             inplace_final_state=True, **RFLAGS)
        results.append((o, pool))
    assert not table[:, 0].is_contiguous()
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
