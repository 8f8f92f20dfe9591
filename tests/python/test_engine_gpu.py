"""Engines' calls on CUDA tensors (spec section 7): the forward on a state pool in
place, int32 cu_seqlens, q/k/v/g/beta as views of one fused projection, each
bitwise the dense CUDA call it stands for; flash_kda.chunk_kda against fla's own
Triton chunk_kda on the same inputs, and on a state pool through
initial_state_indices.

Skipped, with the reason, without a usable CUDA backend."""
from __future__ import annotations

import pytest
import torch

import flash_kda
from gpu_skip import requires_cuda_backend
from kda_reference import make_problem, reference, rel_rms

pytestmark = requires_cuda_backend

OUT_BAR = 3.5e-3
STATE_BAR_FP32 = 2.5e-3
SEQLENS = [37, 0, 300, 21, 130]


def clear_fault_record():
    """Earlier tests leave faults on purpose; this module checks that its own calls add none."""
    try:
        flash_kda.check_device_faults()
    except ValueError:
        pass


def problem(seed):
    return make_problem(H=2, HV=4, seqlens=SEQLENS, seed=seed, device="cuda")


def common(p):
    return dict(A_log=p["A_log"], dt_bias=p["dt_bias"], lower_bound=p["lower_bound"], cu_seqlens=p["cu_seqlens"])


def dense(p, init):
    out = torch.empty_like(p["v"])
    fin = torch.empty_like(init)
    flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, initial_state=init, final_state=fin,
                  **common(p))
    return out, fin


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_pool_forward_equals_the_dense_forward(dtype, index_dtype):
    clear_fault_record()
    p = problem(71)
    HV, V, K, P, PAD = 4, 128, 128, 9, 64
    base = (0.1 * torch.randn(P, HV * V * K + PAD, device="cuda")).to(dtype)
    pool = base[:, :HV * V * K].view(P, HV, V, K)
    before = base.clone()
    slots = torch.tensor([7, 2, -1, 0, 5], dtype=index_dtype, device="cuda")
    has = torch.tensor([True, True, True, False, True], device="cuda")
    init = torch.zeros(len(SEQLENS), HV, V, K, dtype=dtype, device="cuda")
    for n, s in enumerate(slots.tolist()):
        if s >= 0 and bool(has[n]):
            init[n] = pool[s]
    out_dense, fin = dense(p, init)
    out = torch.empty_like(p["v"])
    flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, state_pool=pool, state_indices=slots,
                  has_initial_state=has, **common(p))
    torch.cuda.synchronize()
    assert torch.equal(out, out_dense)
    owned = {s: n for n, s in enumerate(slots.tolist()) if s >= 0}
    for s in range(P):
        if s in owned:
            assert torch.equal(pool[s], fin[owned[s]]), f"slot {s}"
        else:
            assert torch.equal(base[s, :HV * V * K], before[s, :HV * V * K]), f"slot {s} was written"
        assert torch.equal(base[s, HV * V * K:], before[s, HV * V * K:]), f"padding after slot {s}"
    flash_kda.check_device_faults()


def test_int32_cu_seqlens_equal_int64():
    p = problem(72)
    out64, fin64 = dense(p, p["initial_state"])
    out = torch.empty_like(p["v"])
    fin = torch.empty_like(fin64)
    kw = common(p)
    kw["cu_seqlens"] = p["cu_seqlens"].to(torch.int32)
    flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, initial_state=p["initial_state"],
                  final_state=fin, **kw)
    torch.cuda.synchronize()
    assert torch.equal(out, out64) and torch.equal(fin, fin64)


def test_fused_projection_views_equal_dense_tensors():
    p = problem(73)
    T, H, HV, K, V = sum(SEQLENS), 2, 4, 128, 128
    widths = [H * K, H * K, HV * V, HV * K, HV]
    width = (sum(widths) + 8 + 7) // 8 * 8  # rows of every view 16-byte aligned
    fused = torch.full((T, width), float("nan"), dtype=torch.bfloat16, device="cuda")
    views, at = [], 0
    for name, w in zip(["q", "k", "v", "g", "beta"], widths):
        x = p[name].reshape(T, w)
        fused[:, at:at + w] = x
        view = fused[:, at:at + w]
        views.append(view.unsqueeze(0) if name == "beta" else view.unflatten(-1, (-1, 128)).unsqueeze(0))
        at += w
    assert not views[0].is_contiguous()
    out_dense, fin_dense = dense(p, p["initial_state"])
    out = torch.empty_like(p["v"])
    fin = torch.empty_like(fin_dense)
    flash_kda.fwd(*views, p["scale"], out, initial_state=p["initial_state"], final_state=fin, **common(p))
    torch.cuda.synchronize()
    assert torch.equal(out, out_dense) and torch.equal(fin, fin_dense)


@pytest.mark.parametrize("dim", [128, 64])
def test_prefill_op_engine_step_compiled_equals_eager(dim):
    """flash_kda.kda_prefill (the pool forward as a custom op) in an engine's step on
    CUDA tensors: chunked prefill with checkpoints, then kda_decode steps on the same
    pool, compiled with torch.compile(fullgraph=True) bitwise the eager step; the
    slots end at the float64 recurrence's final states within the bar."""
    from test_prefill_op import compiled_and_eager_steps

    clear_fault_record()
    p, (outs_c, pool_c, ck_c), (outs_e, pool_e, ck_e) = compiled_and_eager_steps("cuda", dim)
    torch.cuda.synchronize()
    assert len(outs_c) == len(outs_e)
    for a, b in zip(outs_c, outs_e):
        assert torch.equal(a, b)
    assert torch.equal(pool_c, pool_e) and torch.equal(ck_c, ck_e)
    _, ref_fin = reference(dict(p, initial_state=None))
    for n, s in enumerate((5, 2)):
        err = rel_rms(pool_e[s], ref_fin[n])
        assert err < STATE_BAR_FP32, f"dim {dim}, sequence {n}: slot {s} {err:.3e}"
    flash_kda.check_device_faults()


def _fla_chunk_kda():
    try:
        from fla.ops.kda import chunk_kda
    except Exception as e:  # fla missing or broken: say why
        pytest.skip(f"fla not importable: {type(e).__name__}: {e}")
    return chunk_kda


FLAGS = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
             safe_gate=True)


def test_chunk_kda_agrees_with_flas_chunk_kda(monkeypatch):
    fla_chunk_kda = _fla_chunk_kda()
    monkeypatch.setenv("FLA_FLASH_KDA", "0")  # fla's own Triton kernels, not a dispatch to us
    p = make_problem(H=2, seqlens=[100, 17, 139], seed=74, device="cuda")
    kw = dict(scale=p["scale"], initial_state=p["initial_state"], output_final_state=True,
              lower_bound=p["lower_bound"], state_v_first=True, cu_seqlens=p["cu_seqlens"], A_log=p["A_log"],
              dt_bias=p["dt_bias"].reshape(-1), **FLAGS)
    with torch.inference_mode():
        o_fla, s_fla = fla_chunk_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], **kw)
        o, s = flash_kda.chunk_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], **kw)
    torch.cuda.synchronize()
    ref_out, ref_fs = reference(p)
    e_ours, e_fla = (rel_rms(o, ref_out), rel_rms(s, ref_fs)), (rel_rms(o_fla, ref_out), rel_rms(s_fla, ref_fs))
    print(f"chunk_kda vs float64: ours out {e_ours[0]:.3e} state {e_ours[1]:.3e}; "
          f"fla out {e_fla[0]:.3e} state {e_fla[1]:.3e}")
    assert o.shape == o_fla.shape and s.shape == s_fla.shape and s.dtype == s_fla.dtype
    assert e_ours[0] <= OUT_BAR and e_ours[1] <= STATE_BAR_FP32
    # Both within the bars of the float64 truth: they differ by at most sqrt(2) x the bars.
    assert rel_rms(o, o_fla) <= 2 ** 0.5 * OUT_BAR
    assert rel_rms(s, s_fla) <= 2 ** 0.5 * STATE_BAR_FP32


@pytest.mark.parametrize("state_v_first", [False, True])
@pytest.mark.parametrize("head_dim", [128, 64])
def test_fused_recurrent_kda_agrees_with_flas(state_v_first, head_dim):
    """flash_kda.fused_recurrent_kda (flash_kda's decode) against fla's own
    fused_recurrent_kda on the same CUDA inputs, a few tokens a sequence as in decode:
    both within the bars of the float64 recurrence."""
    try:
        from fla.ops.kda import fused_recurrent_kda as fla_fused_recurrent_kda
    except Exception as e:  # fla missing or broken: say why
        pytest.skip(f"fla not importable: {type(e).__name__}: {e}")
    p = make_problem(H=2, HV=4, K=head_dim, seqlens=[1, 3, 2, 4], seed=77, device="cuda")
    s0 = p["initial_state"] if state_v_first else p["initial_state"].transpose(-1, -2).contiguous()
    kw = dict(A_log=p["A_log"], dt_bias=p["dt_bias"].reshape(-1), scale=p["scale"], initial_state=s0,
              output_final_state=True, lower_bound=p["lower_bound"], state_v_first=state_v_first,
              cu_seqlens=p["cu_seqlens"], use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
              use_beta_sigmoid_in_kernel=True)
    with torch.inference_mode():
        o_fla, s_fla = fla_fused_recurrent_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], **kw)
        o, s = flash_kda.fused_recurrent_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], **kw)
    torch.cuda.synchronize()
    ref_out, ref_fs = reference(p)
    if not state_v_first:
        ref_fs = ref_fs.transpose(-1, -2)
    e_ours, e_fla = (rel_rms(o, ref_out), rel_rms(s, ref_fs)), (rel_rms(o_fla, ref_out), rel_rms(s_fla, ref_fs))
    print(f"fused_recurrent_kda K={head_dim} vs float64: ours out {e_ours[0]:.3e} state {e_ours[1]:.3e}; "
          f"fla out {e_fla[0]:.3e} state {e_fla[1]:.3e}")
    assert o.shape == o_fla.shape and s.shape == s_fla.shape and s.dtype == s_fla.dtype
    assert e_ours[0] <= OUT_BAR and e_ours[1] <= STATE_BAR_FP32
    assert rel_rms(o, o_fla) <= 2 ** 0.5 * OUT_BAR
    assert rel_rms(s, s_fla) <= 2 ** 0.5 * STATE_BAR_FP32


def test_chunk_kda_on_a_state_pool_cuda():
    p = problem(75)
    HV, V, K, P = 4, 128, 128, 6
    pool = 0.1 * torch.randn(P, HV, V, K, device="cuda")
    idx = torch.tensor([3, 0, -1, 5, 1], dtype=torch.int32, device="cuda")
    init = torch.zeros(len(SEQLENS), HV, V, K, device="cuda")
    for n, s in enumerate(idx.tolist()):
        if s >= 0:
            init[n] = pool[s]
    out_dense, fin = dense(p, init)
    o, fs = flash_kda.chunk_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], scale=p["scale"], initial_state=pool,
                                initial_state_indices=idx, lower_bound=p["lower_bound"], state_v_first=True,
                                cu_seqlens=p["cu_seqlens"], A_log=p["A_log"], dt_bias=p["dt_bias"].reshape(-1),
                                **FLAGS)
    torch.cuda.synchronize()
    assert fs is None and torch.equal(o, out_dense)
    for n, s in enumerate(idx.tolist()):
        if s >= 0:
            assert torch.equal(pool[s], fin[n]), f"slot {s}"


@pytest.mark.parametrize("value_major", [False, True])
def test_each_checkpoint_is_the_prefix_runs_final_state_cuda(value_major):
    # One chain per sequence here (small shapes): the prefix run walks the same chunks
    # from the same state, so each fp32 checkpoint is its final state bit for bit.
    seqlens, c = [70, 0, 33, 128], 32
    p = make_problem(H=2, HV=4, seqlens=seqlens, seed=76, device="cuda")
    total = sum(-(-L // c) for L in seqlens)
    ck = torch.full((total, 4, 128, 128), float("nan"), device="cuda")
    out = torch.empty_like(p["v"])
    fin = torch.empty_like(p["initial_state"])
    flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, initial_state=p["initial_state"],
                  final_state=fin, checkpoints=ck, checkpoint_interval=c, checkpoints_value_major=value_major,
                  **common(p))
    entry, start = 0, 0
    for n, L in enumerate(seqlens):
        for j in range(-(-L // c)):
            init = p["initial_state"][n:n + 1]
            if j == 0:
                want = init[0]
            else:
                sl = slice(start, start + j * c)
                x = {key: p[key][:, sl] for key in ("q", "k", "v", "g", "beta")}
                o = torch.empty_like(x["v"])
                f = torch.empty_like(init)
                flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], p["scale"], o, A_log=p["A_log"],
                              dt_bias=p["dt_bias"], lower_bound=p["lower_bound"], initial_state=init, final_state=f)
                want = f[0]
            got = ck[entry] if value_major else ck[entry].transpose(-1, -2)
            assert torch.equal(got, want), f"sequence {n}, checkpoint {j}"
            entry += 1
        start += L


def test_chunk_kda_intermediate_states_agree_with_fla(monkeypatch):
    fla_chunk_kda = _fla_chunk_kda()
    monkeypatch.setenv("FLA_FLASH_KDA", "0")
    p = make_problem(H=2, seqlens=[100, 17, 139], seed=77, device="cuda")
    s0 = p["initial_state"].transpose(-1, -2).contiguous()  # fla's key-major state
    kw = dict(scale=p["scale"], initial_state=s0, output_final_state=True, lower_bound=p["lower_bound"],
              cu_seqlens=p["cu_seqlens"], A_log=p["A_log"], dt_bias=p["dt_bias"].reshape(-1),
              return_intermediate_states=True, **FLAGS)
    with torch.inference_mode():
        o_fla, s_fla, h_fla = fla_chunk_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], **kw)
        o, s, h = flash_kda.chunk_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], **kw)
    torch.cuda.synchronize()
    assert h.shape == h_fla.shape and h.dtype == h_fla.dtype == torch.bfloat16
    e = rel_rms(h.float(), h_fla.float())
    print(f"intermediate states, ours vs fla: {e:.3e}")
    # Both are bf16 roundings of states each within the fp32 bar of the truth.
    assert e <= 2 ** 0.5 * 6e-3


@pytest.mark.parametrize("offset", [128, 133])
def test_split_forward_two_pieces_match_the_straight_run(offset):
    """The two calls of a context-parallel forward (summaries=, then resume_from_summaries=)
    on CUDA, as two ranks would make them on one device: sequence 2 cut `offset` tokens
    in (on and off the 16-token chunk grid); the first piece's summary applied to its
    initial state in float64 gives the second piece's incoming state; each workspace
    keeps its summaries call's work for its resume call.

    Against the float64 recurrence the pieces meet the forward's own bars. Against the
    straight CUDA run they differ at the level of the kernel's own rounding, not of
    fp32: the kernel rounds the state to bf16 as a tensor-core operand inside each
    chunk, and the pieces' summaries and chunks round at other places."""
    clear_fault_record()
    p = problem(seed=61)
    cu = p["cu_seqlens"].tolist()
    straight = torch.full_like(p["v"], float("nan"))
    straight_final = torch.full_like(p["initial_state"], float("nan"))
    flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], straight, initial_state=p["initial_state"],
                  final_state=straight_final, **common(p))
    cut = cu[2] + offset  # inside sequence 2 (300 tokens)
    HV, V, K = p["v"].shape[2], p["v"].shape[3], p["q"].shape[3]
    pieces = [(0, cut, [0] + cu[1:3] + [cut]), (cut, cu[-1], [cut] + cu[3:])]
    ranks = []
    for begin, end, bounds in pieces:
        r = {key: p[key][:, begin:end] for key in ("q", "k", "v", "g", "beta")}
        r["cu"] = torch.tensor([b - begin for b in bounds], dtype=torch.int64)
        N = len(bounds) - 1
        r["M"] = torch.full((N, HV, K, K), float("nan"), device="cuda")
        r["B"] = torch.full((N, HV, V, K), float("nan"), device="cuda")
        r["kw"] = dict(A_log=p["A_log"], dt_bias=p["dt_bias"], lower_bound=p["lower_bound"],
                       cu_seqlens=r["cu"].cuda(), cu_seqlens_host=r["cu"])
        nbytes = flash_kda.workspace_size(r["q"], r["k"], r["v"], r["g"], r["beta"], p["scale"], None,
                                          summaries=(r["M"], r["B"]), **r["kw"])
        r["kw"]["workspace"] = torch.empty(nbytes + 255, dtype=torch.uint8, device="cuda")
        flash_kda.fwd(r["q"], r["k"], r["v"], r["g"], r["beta"], p["scale"], None, summaries=(r["M"], r["B"]),
                      **r["kw"])
        ranks.append(r)
    S0 = p["initial_state"].double()
    # Rank 0 holds sequences 0, 1 and the head of 2; rank 1 the tail of 2, then 3 and 4.
    ranks[0]["init"] = p["initial_state"][:3].clone()
    tail = S0[2] @ ranks[0]["M"][2].double() + ranks[0]["B"][2].double()
    ranks[1]["init"] = torch.cat([tail[None], S0[3:]]).float()
    outs, finals = [], []
    for r in ranks:
        out = torch.full_like(r["v"], float("nan"))
        fin = torch.full_like(r["init"], float("nan"))
        flash_kda.fwd(r["q"], r["k"], r["v"], r["g"], r["beta"], p["scale"], out, initial_state=r["init"],
                      final_state=fin, resume_from_summaries=True, **r["kw"])
        outs.append(out)
        finals.append(fin)
    torch.cuda.synchronize()
    out = torch.cat(outs, dim=1)
    final = torch.cat([finals[0][:2], finals[1]])  # sequence 2 ends on rank 1
    ref_out, ref_final = reference({key: (x.cpu() if isinstance(x, torch.Tensor) else x) for key, x in p.items()})
    e_out, e_state = rel_rms(out.cpu(), ref_out), rel_rms(final.cpu(), ref_final)
    d_out, d_state = rel_rms(out, straight), rel_rms(final, straight_final)
    print(f"split forward on CUDA, cut {offset} tokens in: against float64 out {e_out:.2e} state {e_state:.2e}; "
          f"against the straight run out {d_out:.2e} state {d_state:.2e}")
    assert e_out <= OUT_BAR and e_state <= STATE_BAR_FP32
    assert d_out <= OUT_BAR and d_state <= STATE_BAR_FP32
    flash_kda.check_device_faults()
