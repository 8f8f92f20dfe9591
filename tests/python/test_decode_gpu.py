"""flash_kda.decode on CUDA tensors (the sm_90a decode kernels; K = V = 128, and 64 where named)
against the CPU decode (float64 recurrence) on the same inputs: single and
multi-token steps, padding, permuted int32 / int64 indices, per_token_states, a
separate out pool, strided pools, streams, and CUDA-graph capture + replay.

Skipped, with the reason, without a CUDA device or when the CUDA backend of
flash_kda cannot run (no kernels compiled in, or not a compute-capability-9.0 GPU).

Bars against the CPU result:
  fp32 pool state   <= 1e-5 relative RMS (fp32 arithmetic vs float64: ~1e-7).
  bf16 pool state   <= 3e-3 relative RMS (the bf16 rounding floor, ~1.7e-3, plus margin).
  out (bf16)        within one bf16 ulp of the CPU's out, plus 1e-6 * max|out| for
                    the few elements whose value cancels (a tiny out from O(1) terms:
                    fp32 rounding of the terms can exceed the ulp of the result).
"""
from __future__ import annotations

import pytest
import torch

import flash_kda
from gpu_skip import requires_cuda_backend
from kda_reference import rel_rms
from test_decode_cpu import kda_decode_two_steps, make_decode

K = 128
FP32_STATE_BAR = 1e-5
BF16_STATE_BAR = 3e-3


pytestmark = requires_cuda_backend


def to(p, device):
    return {n: (x.to(device) if isinstance(x, torch.Tensor) else x) for n, x in p.items()}


def call(p, pool, out=None, **kw):
    if out is None:
        out = torch.full_like(p["v"], 7.0)
    kw.setdefault("cu_seqlens", p["cu_seqlens"])
    kw.setdefault("scale", p["scale"])
    kw.setdefault("lower_bound", p["lower_bound"])
    return flash_kda.decode(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"], pool, p["indices"],
                            out=out, **kw)


def cpu_and_gpu(p, per_token=False, **kw):
    """Runs the CPU and the CUDA decode on the same inputs. Returns dicts with out,
    pool (and per_tok) for each; the GPU results copied back to the CPU."""
    res = {}
    for dev in ("cpu", "cuda"):
        pd = to(p, dev)
        pool = p["pool"].clone().to(dev)
        extra = dict(kw)
        if per_token:
            T, HV, V = p["v"].shape
            extra["per_token_states"] = torch.full((T, HV, V, p["pool"].shape[-1]), 7.0, dtype=p["pool"].dtype,
                                                   device=dev)
        out = call(pd, pool, **extra)
        torch.cuda.synchronize()
        res[dev] = dict(out=out.cpu(), pool=pool.cpu())
        if per_token:
            res[dev]["per_tok"] = extra["per_token_states"].cpu()
    return res["cpu"], res["cuda"]


def assert_out_within_one_ulp(out, ref, rows=None):
    if rows is not None:
        out, ref = out[rows], ref[rows]
    a, b = out.double(), ref.double()
    _, e = torch.frexp(b)
    ulp = torch.ldexp(torch.ones_like(b), e - 8)  # bf16: 8 significant bits, mantissa in [0.5, 1)
    slack = 1e-6 * b.abs().max().item()
    bad = (a - b).abs() > ulp + slack
    assert not bad.any(), f"{int(bad.sum())} out elements more than one bf16 ulp from the CPU's"


def assert_state(s, ref):
    bar = FP32_STATE_BAR if s.dtype == torch.float32 else BF16_STATE_BAR
    e = rel_rms(s, ref)
    assert e <= bar, f"state ({s.dtype}) rel RMS {e:.3e} > {bar}"


# ---- accuracy against the CPU decode ------------------------------------------------

@pytest.mark.parametrize("head_dim", [K, 64])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_single_token_matches_cpu(state_dtype, index_dtype, head_dim):
    p = make_decode(N=16, H=4, K=head_dim, P=40, state_dtype=state_dtype, index_dtype=index_dtype, seed=101)
    c, g = cpu_and_gpu(p)
    assert_out_within_one_ulp(g["out"], c["out"])
    assert_state(g["pool"], c["pool"])
    unused = sorted(set(range(40)) - set(p["indices"].tolist()))
    assert torch.equal(g["pool"][unused], p["pool"][unused])


def test_gva_matches_cpu():
    p = make_decode(N=8, H=2, HV=8, K=K, P=10, seed=102)
    c, g = cpu_and_gpu(p)
    assert_out_within_one_ulp(g["out"], c["out"])
    assert_state(g["pool"], c["pool"])


def test_permuted_indices_and_padding():
    idx = [17, -1, 3, 9, -1, 0, 30, 12]
    p = make_decode(N=8, H=4, K=K, P=32, indices=idx, index_dtype=torch.int64, seed=103)
    c, g = cpu_and_gpu(p)
    live = [n for n, s in enumerate(idx) if s >= 0]
    assert_out_within_one_ulp(g["out"], c["out"], rows=live)
    assert torch.all(g["out"][[1, 4]] == 7)  # padding rows: not written
    assert_state(g["pool"], c["pool"])
    unused = sorted(set(range(32)) - {s for s in idx if s >= 0})
    assert torch.equal(g["pool"][unused], p["pool"][unused])


def test_index_past_the_pool_is_skipped_like_padding():
    # The indices stay on the device (no read-back): the kernel skips an entry >= P.
    p = to(make_decode(N=3, H=2, K=K, P=4, indices=[2, 4, 0], seed=112), "cuda")
    pool = p["pool"].clone()
    out = call(p, pool)
    torch.cuda.synchronize()
    assert torch.all(out[1] == 7)
    assert torch.equal(pool[[1, 3]], p["pool"][[1, 3]])
    # ... and records it; reading the record clears it for the tests after this one.
    with pytest.raises(ValueError, match=r"state_indices \(decode\).*first at sequence 1"):
        flash_kda.check_device_faults()


@pytest.mark.parametrize("head_dim", [K, 64])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_multi_token_cu_seqlens_and_per_token_states(state_dtype, head_dim):
    p = make_decode(seqlens=[3, 1, 4, 2, 5], H=2, K=head_dim, P=12, indices=[7, -1, 2, 11, 0],
                    state_dtype=state_dtype, seed=104)
    c, g = cpu_and_gpu(p, per_token=True)
    cu = p["cu_seqlens"].tolist()
    live = [t for n, s in enumerate(p["indices"].tolist()) if s >= 0 for t in range(cu[n], cu[n + 1])]
    assert_out_within_one_ulp(g["out"], c["out"], rows=live)
    assert_state(g["per_tok"][live], c["per_tok"][live])
    assert_state(g["pool"], c["pool"])
    assert torch.all(g["per_tok"][3] == 7) and torch.all(g["out"][3] == 7)
    for n, slot in enumerate(p["indices"].tolist()):
        if slot >= 0:
            assert torch.equal(g["per_tok"][cu[n + 1] - 1], g["pool"][slot])


@pytest.mark.parametrize("head_dim", [K, 64])
@pytest.mark.parametrize("seqlens", [[2, 0, 3, 0], [0, 0, 0]])
def test_sequences_without_tokens_keep_their_state(seqlens, head_dim):
    # Among others, and a step where no sequence has a token (T = 0); with an out pool too.
    p = make_decode(seqlens=seqlens, H=2, K=head_dim, P=8, indices=[6, 1, 4, 3][:len(seqlens)], seed=106)
    c, g = cpu_and_gpu(p)
    if g["out"].numel():
        assert_out_within_one_ulp(g["out"], c["out"])
    assert_state(g["pool"], c["pool"])
    cu = p["cu_seqlens"].tolist()
    for n, slot in enumerate(p["indices"].tolist()):
        if cu[n] == cu[n + 1]:
            assert torch.equal(g["pool"][slot], p["pool"][slot]), f"sequence {n} has no tokens, but its slot changed"
    pd = to(p, "cuda")
    pool_out = torch.full_like(pd["pool"], 7.0)
    call(pd, pd["pool"].clone(), state_out_pool=pool_out)
    torch.cuda.synchronize()
    used = p["indices"].tolist()
    assert torch.equal(pool_out[used].cpu(), g["pool"][used])


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_int32_cu_seqlens_is_the_int64_call(state_dtype):
    """vLLM's int32 offsets, read on the device: the same bits as int64 ones."""
    p = to(make_decode(seqlens=[3, 1, 4, 2, 5], H=2, K=K, P=12, indices=[7, -1, 2, 11, 0], state_dtype=state_dtype,
                       seed=105), "cuda")
    pool64, pool32 = p["pool"].clone(), p["pool"].clone()
    out64 = call(p, pool64)
    out32 = call(p, pool32, cu_seqlens=p["cu_seqlens"].int())
    torch.cuda.synchronize()
    assert torch.equal(out32, out64) and torch.equal(pool32, pool64)


def test_uniform_tokens_per_seq():
    p = make_decode(N=6, t=3, H=2, K=K, P=8, seed=105)
    c, g = cpu_and_gpu(p)
    assert_out_within_one_ulp(g["out"], c["out"])
    assert_state(g["pool"], c["pool"])


def test_state_out_pool_and_strided_pools():
    p = make_decode(N=4, H=2, K=K, P=6, indices=[5, 0, -1, 3], seed=106)
    pd = to(p, "cuda")
    ref_pool = pd["pool"].clone()
    ref_out = call(pd, ref_pool)
    per_slot = 2 * K * K
    # Input pool: slots 3 * per_slot apart; out pool: slots 2 * per_slot apart.
    big_in = torch.full((6, 3 * per_slot), 7.0, device="cuda")
    pool_in = big_in[:, per_slot:2 * per_slot].view(6, 2, K, K)
    pool_in.copy_(pd["pool"])
    big_out = torch.full((6, 2 * per_slot), 7.0, device="cuda")
    pool_out = big_out[:, :per_slot].view(6, 2, K, K)
    out = call(pd, pool_in, state_out_pool=pool_out)
    torch.cuda.synchronize()
    assert torch.equal(out, ref_out)
    assert torch.equal(pool_in, pd["pool"])  # the input pool is untouched
    live = [5, 0, 3]
    assert torch.equal(pool_out[live], ref_pool[live])
    assert torch.all(pool_out[[1, 2, 4]] == 7) and torch.all(big_out[:, per_slot:] == 7)
    assert torch.all(big_in[:, :per_slot] == 7) and torch.all(big_in[:, 2 * per_slot:] == 7)


def test_functional_form_and_side_stream():
    p = to(make_decode(N=8, H=2, K=K, P=8, seed=107), "cuda")
    pool_a = p["pool"].clone()
    out_a = call(p, pool_a)
    pool_b = p["pool"].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out_b = flash_kda.decode(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"], pool_b,
                                 p["indices"])
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert out_b.device == p["v"].device and out_b.dtype == torch.bfloat16
    assert torch.equal(out_a, out_b) and torch.equal(pool_a, pool_b)


def test_torch_fast_path_equals_the_dlpack_path():
    p = to(make_decode(seqlens=[2, 1, 3], H=2, K=K, P=5, indices=[4, -1, 0], seed=113), "cuda")
    results = []
    for fast in (True, False):
        previous = flash_kda._set_torch_fast_path(fast)
        try:
            pool = p["pool"].clone()
            out = call(p, pool)
        finally:
            flash_kda._set_torch_fast_path(previous)
        results.append((out, pool))
    torch.cuda.synchronize()
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


# ---- CUDA graphs ----------------------------------------------------------------------

def test_cuda_graph_capture_and_replay_equals_a_direct_call():
    static = to(make_decode(N=16, H=4, K=K, P=24, index_dtype=torch.int64, seed=108), "cuda")
    fresh = to(make_decode(N=16, H=4, K=K, P=24, index_dtype=torch.int64, seed=109), "cuda")
    pool = static["pool"].clone()
    out = torch.empty_like(static["v"])

    def step():
        call(static, pool, out=out)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    # New inputs, new indices and a new pool in the same buffers: the graph reads them at replay.
    for name in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "indices"):
        static[name].copy_(fresh[name])
    pool.copy_(fresh["pool"])
    graph.replay()
    torch.cuda.synchronize()
    exp_pool = fresh["pool"].clone()
    exp_out = call(fresh, exp_pool, out=torch.empty_like(fresh["v"]))
    torch.cuda.synchronize()
    assert torch.equal(out, exp_out) and torch.equal(pool, exp_pool)


# ---- errors on CUDA -----------------------------------------------------------------

def test_errors_on_cuda():
    p = to(make_decode(N=2, H=2, K=K, P=4, seed=110), "cuda")
    pool = p["pool"].clone()
    with pytest.raises(ValueError, match=r"^k: expected a tensor on the same device as q \(cuda:0\), got cpu"):
        flash_kda.decode(p["q"], p["k"].cpu(), p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"], pool,
                         p["indices"])
    with pytest.raises(ValueError, match=r"^lower_bound: expected a finite value in \[-5, 0\), got 0"):
        call(p, pool, lower_bound=0.0)
    with pytest.raises(TypeError, match=r"^state_pool: expected dtype"):
        call(p, pool.double())


def test_unsupported_head_dim_is_not_implemented():
    p = to(make_decode(N=2, H=2, K=96, P=4, seed=111), "cuda")
    with pytest.raises(NotImplementedError, match=r"head_dim_k/head_dim_v: the CUDA decode supports K = V = 64 or 128"):
        call(p, p["pool"].clone())


@pytest.mark.parametrize("pdl", [True, False, None])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_pdl_launch_chained_steps_match_cpu(state_dtype, pdl):
    # pdl=True lets a step's kernel be scheduled while the previous one runs; it must
    # still see the pool the previous step wrote. Three chained steps on one pool,
    # back to back on the stream, against three CPU steps. False (never PDL) and None
    # (auto: PDL at this small size) must give the same.
    p = make_decode(N=7, H=4, K=K, P=12, state_dtype=state_dtype, seed=111)
    pc, pg = to(p, "cpu"), to(p, "cuda")
    pool_c, pool_g = p["pool"].clone(), p["pool"].clone().cuda()
    for _ in range(3):
        out_c = call(pc, pool_c)
        out_g = call(pg, pool_g, pdl=pdl)
    torch.cuda.synchronize()
    assert_state(pool_g.cpu(), pool_c)
    assert_out_within_one_ulp(out_g.cpu(), out_c)


def test_kda_decode_op_compiled_equals_eager():
    # The custom op under torch.compile (inductor, fullgraph): two chained steps,
    # the second reading the pool the first wrote.
    p = to(make_decode(N=5, H=4, K=K, P=8, seed=112), "cuda")
    two_steps = kda_decode_two_steps(p)

    pool_eager, pool_compiled = p["pool"].clone(), p["pool"].clone()
    eager = two_steps(pool_eager)
    compiled = torch.compile(two_steps, fullgraph=True)(pool_compiled)
    torch.cuda.synchronize()
    assert torch.equal(eager, compiled)
    assert torch.equal(pool_eager, pool_compiled)


@pytest.mark.parametrize("head_dim", [K, 64])
def test_kda_decode_op_speculative_verify_compiled_equals_eager(head_dim):
    # Speculative verify through the custom op (state_indices [N, 1 + S],
    # num_accepted_tokens) under torch.compile (inductor, fullgraph): bitwise the eager
    # op, which is bitwise flash_kda.decode.
    p = to(make_decode(seqlens=[3, 2, 4], H=2, K=head_dim, P=12, seed=121), "cuda")
    idx = torch.tensor([[0, 1, 2, 3], [-1, 4, 5, 6], [7, -1, 8, 9]], dtype=torch.int32, device="cuda")
    acc = torch.tensor([2, 1, 4], dtype=torch.int32, device="cuda")

    def verify(pool):
        return flash_kda.kda_decode(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"], pool, idx,
                                    cu_seqlens=p["cu_seqlens"], num_accepted_tokens=acc)

    pool_ref, pool_eager, pool_compiled = (p["pool"].clone() for _ in range(3))
    ref = flash_kda.decode(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"], pool_ref, idx,
                           cu_seqlens=p["cu_seqlens"], num_accepted_tokens=acc)
    eager = verify(pool_eager)
    compiled = torch.compile(verify, fullgraph=True)(pool_compiled)
    torch.cuda.synchronize()
    assert torch.equal(eager, ref) and torch.equal(pool_eager, pool_ref)
    assert torch.equal(compiled, eager) and torch.equal(pool_compiled, pool_eager)


def verify_on(p, idx, acc, dev):
    pd = to(p, dev)
    pd["indices"] = idx.to(dev)
    pool = p["pool"].clone().to(dev)
    out = call(pd, pool, num_accepted_tokens=acc.to(dev))
    if dev == "cuda":
        torch.cuda.synchronize()
    return out.cpu(), pool.cpu()


@pytest.mark.parametrize("head_dim", [K, 64])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_speculative_verify_matches_cpu_and_fla(state_dtype, head_dim):
    """Speculative verify on pool slots on CUDA (2-D state_indices [N, 1 + S] with
    num_accepted_tokens): the same pool and out as the float64 CPU verify on the same
    inputs (sequence 1 a padding row, sequence 2 skipping its second token's write), and
    the same as fla's serving-form fused_recurrent_kda_fwd (ssm_state_indices,
    num_accepted_tokens, in place), whose semantics it follows, on rows without
    negative entries."""
    p = make_decode(seqlens=[3, 2, 4, 1], H=2, K=head_dim, P=18, state_dtype=state_dtype, seed=120)
    idx = torch.tensor([[0, 1, 2, 3], [-1, 4, 5, 6], [7, -1, 8, 9], [10, 11, 12, 13]], dtype=torch.int32)
    acc = torch.tensor([2, 1, 1, 4], dtype=torch.int32)
    c_out, c_pool = verify_on(p, idx, acc, "cpu")
    g_out, g_pool = verify_on(p, idx, acc, "cuda")
    live = [t for t in range(10) if t not in (3, 4)]  # sequence 1's tokens stay untouched
    assert_out_within_one_ulp(g_out, c_out, rows=live)
    assert torch.all(g_out[3:5] == 7)
    assert_state(g_pool, c_pool)
    assert torch.equal(g_pool[14:], p["pool"][14:]), "slots in no row were written"

    try:
        from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd
    except Exception as e:  # fla missing or broken: say why
        pytest.skip(f"fla not importable: {type(e).__name__}: {e}")
    idx = torch.tensor([[0, 1, 2, 3], [14, 4, 5, 6], [7, 15, 8, 9], [10, 11, 12, 13]], dtype=torch.int32)
    g_out, g_pool = verify_on(p, idx, acc, "cuda")
    pd = to(p, "cuda")
    T, H, Kd = pd["q"].shape
    pool = p["pool"].clone().cuda()
    out = torch.full((1, T, H, Kd), 7.0, dtype=torch.bfloat16, device="cuda")
    fused_recurrent_kda_fwd(q=pd["q"][None], k=pd["k"][None], v=pd["v"][None], g=pd["g"][None], beta=pd["beta"][None],
                            A_log=pd["A_log"], dt_bias=pd["dt_bias"].reshape(-1), initial_state=pool,
                            scale=p["scale"], inplace_final_state=True, state_v_first=True,
                            cu_seqlens=pd["cu_seqlens"], ssm_state_indices=idx.cuda(), num_accepted_tokens=acc.cuda(),
                            use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                            lower_bound=-5.0, out=out)
    torch.cuda.synchronize()
    fla_pool, fla_out = pool.cpu(), out[0].cpu()
    e_out, e_pool = rel_rms(g_out, fla_out), rel_rms(g_pool, fla_pool)
    print(f"verify K={head_dim} {state_dtype}: against fla out {e_out:.2e}, pool {e_pool:.2e}")
    assert e_out <= 1e-2
    assert e_pool <= (1e-4 if state_dtype == torch.float32 else 1e-2)


def fused_views(p):
    """q, k, v, g, beta as slices of one fused projection output [T, width] (an
    engine's layout): token stride = width, last dimension contiguous."""
    T, H, Kq = p["q"].shape
    HV, V = p["v"].shape[1:]
    parts = [p["q"].reshape(T, -1), p["k"].reshape(T, -1), p["v"].reshape(T, -1), p["g"].reshape(T, -1), p["beta"]]
    fused = torch.cat(parts + [torch.zeros(T, 8, dtype=torch.bfloat16, device=p["q"].device)], dim=1)
    views, at = [], 0
    for x, shape in zip(parts, [(T, H, Kq), (T, H, Kq), (T, HV, V), (T, HV, Kq), (T, HV)]):
        views.append(fused[:, at:at + x.shape[1]].view(shape) if len(shape) == 3 else fused[:, at:at + x.shape[1]])
        at += x.shape[1]
    return dict(p, q=views[0], k=views[1], v=views[2], g=views[3], beta=views[4])


@pytest.mark.parametrize("N", [8, 64])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_strided_views_decode_as_the_dense_call(N, state_dtype):
    # Views of a fused projection at K = 128, 32 heads: from 2048 (sequence, head)
    # pairs decode copies them dense and runs the dense call's kernel (bitwise the
    # dense call); below that the strided latency kernel runs them, to the state bars.
    p = to(make_decode(N=N, H=32, K=K, P=N + 3, state_dtype=state_dtype, seed=130), "cuda")
    pv = fused_views(p)
    assert not pv["q"].is_contiguous() and not pv["beta"].is_contiguous()
    pool_d, pool_v = p["pool"].clone(), p["pool"].clone()
    out_d, out_v = call(p, pool_d), call(pv, pool_v)
    torch.cuda.synchronize()
    if N * 32 >= flash_kda._DECODE_COPY_VIEWS_FROM_PAIRS:
        assert torch.equal(out_v, out_d) and torch.equal(pool_v, pool_d)
    else:
        bar = FP32_STATE_BAR if state_dtype == torch.float32 else BF16_STATE_BAR
        assert rel_rms(pool_v.float(), pool_d.float()) <= bar
        assert rel_rms(out_v.float(), out_d.float()) <= 1e-2


@pytest.mark.parametrize("views", [False, True])
def test_side_stream_call_allocates_and_copies_on_its_stream(views):
    # decode(stream=s) with s not torch's current stream: the zero-filled out, the
    # dense copy of a strided index column and (views, 2048 pairs) of the token views
    # must be made on s. The current stream is kept busy, so anything queued there
    # would land after the kernel on s: out zeros, or copies read before written.
    N = 64 if views else 4
    p = to(make_decode(N=N, H=32, K=K, P=N + 3, seed=131), "cuda")
    pv = fused_views(p) if views else p
    table = torch.stack([p["indices"], torch.zeros_like(p["indices"])], dim=1)  # a block table
    idx = table[:, 0]
    assert not idx.is_contiguous()
    pool_ref, pool = p["pool"].clone(), p["pool"].clone()
    ref = flash_kda.decode(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"], pool_ref, p["indices"])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())  # the inputs are ready on the side stream
    torch.cuda._sleep(200_000_000)  # the current stream busy for ~0.1 s
    out = flash_kda.decode(pv["q"], pv["k"], pv["v"], pv["g"], pv["beta"], p["A_log"], p["dt_bias"], pool, idx,
                           stream=side.cuda_stream)
    side.synchronize()
    torch.cuda.synchronize()
    assert torch.equal(out, ref) and torch.equal(pool, pool_ref)
