"""flash_kda.decode on CPU tensors (the float64 CPU decode): the token recurrence
on pool slots against an independent float64 reference written here, padding
entries, index dtypes and permutations, multi-token steps with cu_seqlens and
per_token_states, a separate out pool, strided pools, and every error case.

Tolerances: the CPU decode computes in float64 and rounds only what it stores,
so `out` (bf16) is within one bf16 ulp of the float64 reference and a bf16 state
within one bf16 ulp. An fp32 state is the float64 result rounded once to fp32:
within 2^-23 relative (one fp32 ulp; the reference's own float64 error is far below).
"""
from __future__ import annotations

import pytest
import torch

import flash_kda
from dlpack_fake import DL_CPU, DL_CUDA, FakeDeviceTensor

BF16_ULP = 2.0 ** -7  # relative spacing of bf16 values (8 significant bits)


# ---- problems and the float64 reference -------------------------------------------

def make_decode(N=3, t=1, H=2, HV=None, K=32, V=None, P=6, seqlens=None, state_dtype=torch.float32,
                index_dtype=torch.int32, indices=None, seed=0):
    """A decode problem: N sequences (t tokens each, or `seqlens`), a pool of P slots
    (0.1 N(0,1) states), indices = a random choice of distinct slots unless given."""
    V = K if V is None else V
    HV = H if HV is None else HV
    gen = torch.Generator().manual_seed(seed)
    cu = None
    if seqlens is not None:
        N, T = len(seqlens), int(sum(seqlens))
        cu = torch.tensor([0] + list(seqlens), dtype=torch.int64).cumsum(0)
    else:
        T = N * t

    def normal(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32)

    def l2n(x):
        return x / x.norm(dim=-1, keepdim=True)

    if indices is None:
        indices = torch.randperm(P, generator=gen)[:N].tolist()
    return dict(
        q=l2n(normal(T, H, K)).bfloat16(),
        k=l2n(normal(T, H, K)).bfloat16(),
        v=normal(T, HV, V).bfloat16(),
        g=normal(T, HV, K).bfloat16(),
        beta=normal(T, HV).bfloat16(),
        A_log=torch.rand(HV, generator=gen, dtype=torch.float32),
        dt_bias=torch.rand(HV, K, generator=gen, dtype=torch.float32),
        pool=(0.1 * normal(P, HV, V, K)).to(state_dtype),
        indices=torch.tensor(indices, dtype=index_dtype),
        cu_seqlens=cu,
        scale=K ** -0.5,
        lower_bound=-5.0,
        t=t,
    )


def step64(S, q, k, v, g, beta, A_log, dt_bias, scale, lb):
    """One token of spec section 1 in float64. S [HV, V, K]; q, k [H, K]; v [HV, V];
    g [HV, K]; beta [HV]. Returns (new S, o [HV, V])."""
    HV, H = S.shape[0], q.shape[0]
    qn = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
    kn = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    qn = qn.repeat_interleave(HV // H, dim=0)
    kn = kn.repeat_interleave(HV // H, dim=0)
    decay = torch.exp(lb * torch.sigmoid(torch.exp(A_log)[:, None] * (g + dt_bias)))
    S = S * decay[:, None, :]
    Sk = torch.einsum("hvk,hk->hv", S, kn)
    S = S + torch.sigmoid(beta)[:, None, None] * (v - Sk)[:, :, None] * kn[:, None, :]
    return S, scale * torch.einsum("hvk,hk->hv", S, qn)


def reference_decode(p, pool=None):
    """(out [T, HV, V], new pool [P, HV, V, K], per-token states [T, HV, V, K]) in float64.
    Rows of padding entries stay NaN in out / per-token states; their slots keep the input."""
    d = {n: p[n].double() for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias")}
    pool = (p["pool"] if pool is None else pool).double().clone()
    T, HV, V = d["v"].shape
    K = d["q"].shape[-1]
    idx = p["indices"].tolist()
    N = len(idx)
    if p["cu_seqlens"] is not None:
        cu = p["cu_seqlens"].tolist()
    else:
        cu = [n * p["t"] for n in range(N + 1)]
    out = torch.full((T, HV, V), float("nan"), dtype=torch.float64)
    per_tok = torch.full((T, HV, V, K), float("nan"), dtype=torch.float64)
    for n in range(N):
        if idx[n] < 0:
            continue
        S = pool[idx[n]].clone()
        for t in range(cu[n], cu[n + 1]):
            S, out[t] = step64(S, *(d[x][t] for x in ("q", "k", "v", "g", "beta")), d["A_log"], d["dt_bias"],
                               p["scale"], p["lower_bound"])
            per_tok[t] = S
        pool[idx[n]] = S
    return out, pool, per_tok


def run(p, pool=None, **kw):
    """flash_kda.decode on problem p (the pool updated in place); returns (out, pool)."""
    pool = p["pool"].clone() if pool is None else pool
    kw.setdefault("out", torch.full_like(p["v"], float("nan")))
    kw.setdefault("scale", p["scale"])
    kw.setdefault("lower_bound", p["lower_bound"])
    kw.setdefault("cu_seqlens", p["cu_seqlens"])
    out = flash_kda.decode(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"], pool,
                           p["indices"], **kw)
    return out, pool


def assert_out_close(out, ref, rows=None):
    """bf16 out within one bf16 ulp of the float64 reference (on `rows`, default all)."""
    if rows is not None:
        out, ref = out[rows], ref[rows]
    torch.testing.assert_close(out.double(), ref, rtol=BF16_ULP, atol=1e-6)


def assert_state_close(s, ref):
    if s.dtype == torch.float32:
        torch.testing.assert_close(s.double(), ref, rtol=2.0 ** -23, atol=1e-12)
    else:
        torch.testing.assert_close(s.double(), ref, rtol=BF16_ULP, atol=1e-6)


# ---- accuracy ----------------------------------------------------------------------

@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_single_token_matches_reference(state_dtype, index_dtype):
    p = make_decode(N=4, H=2, K=32, P=7, state_dtype=state_dtype, index_dtype=index_dtype, seed=1)
    out, pool = run(p)
    ref_out, ref_pool, _ = reference_decode(p)
    assert out.dtype == torch.bfloat16 and pool.dtype == state_dtype
    assert_out_close(out, ref_out)
    assert_state_close(pool, ref_pool)
    unused = sorted(set(range(7)) - set(p["indices"].tolist()))
    assert torch.equal(pool[unused], p["pool"][unused])


def test_pdl_modes_are_accepted_and_change_nothing_on_the_cpu():
    # pdl= only changes how the CUDA kernel is launched; CPU tensors ignore it.
    p = make_decode(N=3, H=2, K=32, P=5, seed=4)
    out_a, pool_a = run(p)  # pdl=None: auto
    for pdl in (None, True, False):
        out_b, pool_b = run(p, pdl=pdl)
        assert torch.equal(out_a, out_b) and torch.equal(pool_a, pool_b), pdl


@pytest.mark.parametrize("pdl", ["yes", 1, 0, -1])
def test_pdl_other_than_none_or_bool_is_rejected(pdl):
    # Ints too: 0 is auto in the C ABI but would be False here.
    p = make_decode(N=3, H=2, K=32, P=5, seed=4)
    pool = p["pool"].clone()
    with pytest.raises(TypeError, match=r"^pdl: expected None \(auto\), True \(on\) or False \(off\), got "):
        run(p, pool=pool, pdl=pdl)
    with pytest.raises(TypeError, match=r"^pdl: "):
        flash_kda.kda_decode(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"], pool,
                             p["indices"], pdl=pdl)
    assert torch.equal(pool, p["pool"])  # rejected before anything ran


def test_gva_and_unequal_head_dims():
    p = make_decode(N=3, H=2, HV=4, K=32, V=16, P=5, seed=2)
    out, pool = run(p)
    ref_out, ref_pool, _ = reference_decode(p)
    assert_out_close(out, ref_out)
    assert_state_close(pool, ref_pool)


def test_permuted_indices_equal_the_sequences_in_another_order():
    p = make_decode(N=5, H=2, K=32, P=8, indices=[6, 2, 0, 7, 3], seed=3)
    out, pool = run(p)
    ref_out, ref_pool, _ = reference_decode(p)
    assert_out_close(out, ref_out)
    assert_state_close(pool, ref_pool)
    # The same sequences listed in another order: the same slots, the same rows (bit for bit).
    perm = [3, 0, 4, 2, 1]
    p2 = dict(p)
    for name in ("q", "k", "v", "g", "beta"):
        p2[name] = p[name][perm].contiguous()
    p2["indices"] = p["indices"][perm].contiguous()
    out2, pool2 = run(p2)
    assert torch.equal(out2, out[perm]) and torch.equal(pool2, pool)


def test_padding_entries_are_untouched():
    p = make_decode(N=5, H=2, K=32, P=6, indices=[3, -1, 0, -1, 5], index_dtype=torch.int64, seed=4)
    out0 = torch.full_like(p["v"], 7.0)
    out, pool = run(p, out=out0)
    assert out is out0
    ref_out, ref_pool, _ = reference_decode(p)
    live = [0, 2, 4]
    assert_out_close(out, ref_out, rows=live)
    assert torch.all(out[[1, 3]] == 7)                      # padding rows: not written
    assert_state_close(pool, ref_pool)
    assert torch.equal(pool[[1, 2, 4]], p["pool"][[1, 2, 4]])  # unused slots: bit for bit


def test_all_padding_is_a_no_op():
    p = make_decode(N=2, H=1, K=16, P=3, indices=[-1, -2], seed=5)
    out0 = torch.full_like(p["v"], 7.0)
    out, pool = run(p, out=out0)
    assert torch.all(out == 7) and torch.equal(pool, p["pool"])


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_multi_token_cu_seqlens_and_per_token_states(state_dtype):
    p = make_decode(seqlens=[3, 1, 4, 2], H=2, K=32, P=6, indices=[4, -1, 1, 0], state_dtype=state_dtype, seed=6)
    T = 10
    per_tok = torch.full((T, 2, 32, 32), 7.0, dtype=state_dtype)
    out, pool = run(p, per_token_states=per_tok)
    ref_out, ref_pool, ref_tok = reference_decode(p)
    live = [0, 1, 2, 4, 5, 6, 7, 8, 9]  # sequence 1 (token 3) is padding
    assert_out_close(out, ref_out, rows=live)
    assert_state_close(per_tok[live], ref_tok[live])
    assert_state_close(pool, ref_pool)
    assert torch.all(per_tok[3] == 7) and torch.all(out[3].isnan())
    # The state after each sequence's last token is the pool's new state, bit for bit.
    cu = p["cu_seqlens"].tolist()
    for n, slot in enumerate(p["indices"].tolist()):
        if slot >= 0:
            assert torch.equal(per_tok[cu[n + 1] - 1], pool[slot])


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_sequences_without_tokens_keep_their_state(state_dtype):
    # Sequences 1 and 3 have no tokens: in place their slots stay as they were, and
    # with an out pool their states are copied there.
    p = make_decode(seqlens=[2, 0, 3, 0], H=2, K=16, P=6, indices=[4, 1, 0, 5], state_dtype=state_dtype, seed=16)
    out, pool = run(p)
    ref_out, ref_pool, _ = reference_decode(p)
    assert_out_close(out, ref_out)
    assert_state_close(pool, ref_pool)
    assert torch.equal(pool[[1, 5]], p["pool"][[1, 5]])
    pool_out = torch.full_like(p["pool"], 7.0)
    run(p, pool=p["pool"].clone(), state_out_pool=pool_out)
    assert torch.equal(pool_out[[1, 5]], p["pool"][[1, 5]])
    assert torch.equal(pool_out[[0, 4]], pool[[0, 4]])


def test_uniform_tokens_per_seq_and_rank4_inputs():
    p = make_decode(N=3, t=3, H=2, K=32, P=4, seed=7)
    out, pool = run(p)
    ref_out, ref_pool, _ = reference_decode(p)
    assert_out_close(out, ref_out)
    assert_state_close(pool, ref_pool)
    # The same tokens as [N, t, ...] tensors (flattened to [N*t, ...]).
    p4 = dict(p)
    for name in ("q", "k", "v", "g", "beta"):
        p4[name] = p[name].reshape(3, 3, *p[name].shape[1:])
    per_tok = torch.empty(3, 3, 2, 32, 32)
    out4, pool4 = run(p4, out=torch.empty_like(p4["v"]), per_token_states=per_tok)
    assert out4.shape == (3, 3, 2, 32)
    assert torch.equal(out4.reshape(out.shape), out) and torch.equal(pool4, pool)
    assert torch.equal(per_tok[:, -1], pool[p["indices"]])


def test_rank4_rows_other_than_the_sequences_are_value_error_naming_q():
    # [N, t, ...] without cu_seqlens: one row a sequence. Three rows of two tokens
    # with two slots would otherwise run as two sequences of three tokens, the
    # second starting inside row 1; with six slots, as six sequences of one token.
    p = make_decode(N=3, t=2, H=2, K=32, P=8, seed=22)
    p4 = dict(p)
    for name in ("q", "k", "v", "g", "beta"):
        p4[name] = p[name].reshape(3, 2, *p[name].shape[1:])
    for slots in ([0, 1], [0, 1, 2, 3, 4, 5]):
        p4["indices"] = torch.tensor(slots, dtype=p["indices"].dtype)
        with pytest.raises(ValueError, match=rf"^q: expected \[N, t, H, K\] with N = len\(state_indices\) = "
                                             rf"{len(slots)} sequences without cu_seqlens"):
            run(p4, out=torch.empty_like(p4["v"]))
    # With cu_seqlens the leading dims are only flattened ([1, T], fla's serving form).
    p1 = dict(p)
    for name in ("q", "k", "v", "g", "beta"):
        p1[name] = p[name].reshape(1, 6, *p[name].shape[1:])
    cu = torch.tensor([0, 2, 4, 6], dtype=torch.int64)
    out1, pool1 = run(p1, out=torch.empty_like(p1["v"]), cu_seqlens=cu)
    out, pool = run(p, cu_seqlens=cu)
    assert torch.equal(out1.reshape(out.shape), out) and torch.equal(pool1, pool)


def test_uniform_equals_cu_seqlens():
    p = make_decode(N=3, t=2, H=2, K=32, P=4, seed=8)
    out_a, pool_a = run(p)
    out_b, pool_b = run(p, cu_seqlens=torch.tensor([0, 2, 4, 6]))
    assert torch.equal(out_a, out_b) and torch.equal(pool_a, pool_b)


def test_state_out_pool_leaves_the_input_pool_untouched():
    p = make_decode(N=3, H=2, K=32, P=5, indices=[2, -1, 4], seed=9)
    pool_in = p["pool"].clone()
    pool_out = torch.full_like(pool_in, 7.0)
    out, _ = run(p, pool=pool_in, state_out_pool=pool_out)
    assert torch.equal(pool_in, p["pool"])
    ref_out, ref_pool, _ = reference_decode(p)
    assert_out_close(out, ref_out, rows=[0, 2])
    assert_state_close(pool_out[[2, 4]], ref_pool[[2, 4]])
    assert torch.all(pool_out[[0, 1, 3]] == 7)  # only the indexed slots are written


def test_pool_with_a_larger_slot_stride():
    # Slots spaced 2 * HV*V*K elements apart: a slice of a bigger buffer (vLLM-style
    # pools interleave other per-slot data).
    p = make_decode(N=3, H=2, K=32, P=5, indices=[1, 4, 0], seed=10)
    per_slot = 2 * 32 * 32
    big = torch.full((5, 2 * per_slot), 7.0)
    pool = big[:, :per_slot].view(5, 2, 32, 32)
    pool.copy_(p["pool"])
    assert pool.stride(0) == 2 * per_slot and not pool.is_contiguous()
    out, _ = run(p, pool=pool)
    out_c, pool_c = run(p)
    assert torch.equal(out, out_c) and torch.equal(pool, pool_c)
    assert torch.all(big[:, per_slot:] == 7)  # the gaps between slots are untouched
    # A strided out pool too.
    big_out = torch.full((5, 3 * per_slot), 7.0)
    pool_out = big_out[:, per_slot:2 * per_slot].view(5, 2, 32, 32)
    out2, _ = run(p, pool=p["pool"].clone(), state_out_pool=pool_out)
    assert torch.equal(out2, out_c) and torch.equal(pool_out[[1, 4, 0]], pool_c[[1, 4, 0]])
    assert torch.all(big_out[:, :per_slot] == 7) and torch.all(big_out[:, 2 * per_slot:] == 7)


def test_single_slot_pool_with_any_slot_stride():
    p = make_decode(N=1, H=1, K=16, P=1, indices=[0], seed=11)
    pool = p["pool"].clone().as_strided((1, 1, 16, 16), (5, 256, 16, 1))  # stride(0) irrelevant for P = 1
    out, _ = run(p, pool=pool)
    ref_out, ref_pool, _ = reference_decode(p)
    assert_out_close(out, ref_out)
    assert_state_close(pool, ref_pool)


def test_functional_form_allocates_out():
    p = make_decode(N=2, H=2, K=32, P=3, seed=12)
    pool = p["pool"].clone()
    out = flash_kda.decode(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"], pool,
                           p["indices"])  # scale -> K^-0.5, lower_bound -> -5.0
    assert out.shape == p["v"].shape and out.dtype == torch.bfloat16
    out_b, pool_b = run(p)
    assert torch.equal(out, out_b) and torch.equal(pool, pool_b)


def test_parameters_and_inference_mode():
    p = make_decode(N=2, H=2, K=32, P=3, seed=13)
    with torch.inference_mode():
        pool = p["pool"].clone()
        out = flash_kda.decode(p["q"], p["k"], p["v"], p["g"], p["beta"], torch.nn.Parameter(p["A_log"].clone()),
                               torch.nn.Parameter(p["dt_bias"].clone()), pool, p["indices"])
    out_b, pool_b = run(p)
    assert torch.equal(out, out_b) and torch.equal(pool, pool_b)


def test_no_sequences_is_a_no_op():
    p = make_decode(N=0, H=2, K=32, P=3, indices=[], seed=14)
    out, pool = run(p)
    assert out.numel() == 0 and torch.equal(pool, p["pool"])


# ---- errors --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small():
    return make_decode(N=2, t=1, H=2, K=32, P=6, indices=[3, 1], seed=20)


def call_with(p, **override):
    """decode on problem p with some arguments replaced (pool: a fresh copy)."""
    args = dict(q=p["q"], k=p["k"], v=p["v"], g=p["g"], beta=p["beta"], A_log=p["A_log"],
                dt_bias=p["dt_bias"], state_pool=p["pool"].clone(), state_indices=p["indices"])
    kw = dict(out=torch.empty_like(p["v"]), cu_seqlens=p["cu_seqlens"])
    for name, val in override.items():
        (args if name in args else kw)[name] = val
    return flash_kda.decode(*args.values(), **kw)


@pytest.mark.parametrize("name,dtype", [
    ("q", torch.float32), ("k", torch.float16), ("v", torch.float32), ("g", torch.float32),
    ("beta", torch.float16), ("A_log", torch.bfloat16), ("dt_bias", torch.float64), ("out", torch.float32),
    ("state_pool", torch.float16), ("state_indices", torch.int16), ("cu_seqlens", torch.int16),
    ("state_out_pool", torch.float64), ("per_token_states", torch.float16),
])
def test_wrong_dtype_is_type_error_naming_the_argument(small, name, dtype):
    src = {"out": small["v"], "state_pool": small["pool"], "state_indices": small["indices"],
           "cu_seqlens": torch.tensor([0, 1, 2]), "state_out_pool": small["pool"],
           "per_token_states": torch.zeros(2, 2, 32, 32)}.get(name, small.get(name))
    with pytest.raises(TypeError, match=rf"^{name}: expected dtype"):
        call_with(small, **{name: src.to(dtype)})


@pytest.mark.parametrize("name", ["state_out_pool", "per_token_states"])
def test_state_dtype_mismatch_is_type_error(small, name):
    val = small["pool"].bfloat16() if name == "state_out_pool" else torch.zeros(2, 2, 32, 32, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=rf"^{name}: expected the dtype of state_pool \(float32\)"):
        call_with(small, **{name: val})


def test_not_a_tensor_is_type_error(small):
    with pytest.raises(TypeError, match=r"^k: expected a tensor"):
        call_with(small, k=[1, 2, 3])
    with pytest.raises(TypeError, match=r"^state_indices: expected a tensor, got None"):
        call_with(small, state_indices=None)


def test_out_none_without_torch_is_type_error(small):
    fake_v = FakeDeviceTensor(small["v"].shape, "bfloat16", DL_CUDA, 0)
    with pytest.raises(TypeError, match=r"^out: pass an output array"):
        call_with(small, v=fake_v, out=None)


@pytest.mark.parametrize("name,shape", [
    ("k", (2, 2, 16)), ("k", (2, 3, 32)), ("v", (3, 2, 32)), ("g", (2, 2, 16)), ("beta", (2, 3)),
    ("beta", (2, 2, 1)), ("A_log", (3,)), ("dt_bias", (2, 16)), ("out", (2, 2, 16)),
    ("state_pool", (6, 3, 32, 32)), ("state_pool", (6, 2, 32)), ("state_pool", (0, 2, 32, 32)),
    ("state_out_pool", (5, 2, 32, 32)), ("per_token_states", (1, 2, 32, 32)), ("state_indices", (2, 1, 1)),
    ("cu_seqlens", (2,)),
])
def test_wrong_shape_is_value_error_naming_the_argument(small, name, shape):
    dtype = {"A_log": torch.float32, "dt_bias": torch.float32, "state_pool": torch.float32,
             "state_out_pool": torch.float32, "per_token_states": torch.float32,
             "state_indices": torch.int32, "cu_seqlens": torch.int64}.get(name, torch.bfloat16)
    with pytest.raises(ValueError, match=rf"^{name}: expected "):
        call_with(small, **{name: torch.zeros(shape, dtype=dtype)})


def test_wrong_rank_of_q_is_value_error(small):
    with pytest.raises(ValueError, match=r"^q: expected a 3-d tensor \[T, H, K\] or a 4-d tensor"):
        call_with(small, q=small["q"][0])
    with pytest.raises(ValueError, match=r"^v: expected a 3-d tensor"):
        call_with(small, v=small["v"][None])


def test_empty_head_dimensions_name_the_tensor():
    # As for fwd: H, K, HV or V of 0 is named by q or v, not by the core's fields.
    def call(H, HV, K, V):
        q = torch.zeros(2, H, K, dtype=torch.bfloat16)
        v = torch.zeros(2, HV, V, dtype=torch.bfloat16)
        flash_kda.decode(q, q, v, torch.zeros(2, HV, K, dtype=torch.bfloat16), torch.zeros(2, HV, dtype=torch.bfloat16),
                         torch.zeros(HV), torch.zeros(HV, K), torch.zeros(2, HV, V, K),
                         torch.tensor([0, 1], dtype=torch.int32), out=torch.empty_like(v))

    for H, K in [(0, 32), (2, 0)]:
        with pytest.raises(ValueError, match=r"^q: expected H and K of at least 1 in \[T, H, K\]"):
            call(H, max(H, 1), K, 32)
    with pytest.raises(ValueError, match=r"^v: expected HV and V of at least 1 in \[T, HV, V\]"):
        call(2, 2, 32, 0)


def test_tokens_not_a_multiple_of_sequences_is_value_error_naming_q():
    p = make_decode(N=3, t=1, H=2, K=32, P=4, seed=21)
    with pytest.raises(ValueError, match=r"^q: expected a token count T = 3 that is a positive multiple of N = "
                                         r"len\(state_indices\) = 2"):
        call_with(p, state_indices=torch.tensor([0, 1], dtype=torch.int32))


@pytest.mark.parametrize("name", ["out", "dt_bias", "per_token_states"])
def test_non_contiguous_is_value_error(small, name):
    t = {"out": torch.empty_like(small["v"]), "per_token_states": torch.zeros(2, 2, 32, 32)}.get(name, small.get(name))
    nc = t.transpose(0, -1).contiguous().transpose(0, -1)
    assert nc.shape == t.shape and not nc.is_contiguous()
    with pytest.raises(ValueError, match=rf"^{name}: expected a C-contiguous"):
        call_with(small, **{name: nc})


@pytest.mark.parametrize("name", ["q", "k", "v", "g"])
def test_token_view_with_a_strided_last_dimension_is_value_error(small, name):
    # Token tensors may be strided views (tests/python/test_random_decode_cpu.py), with
    # their last dimension contiguous.
    nc = small[name].transpose(0, -1).contiguous().transpose(0, -1)
    assert not nc.is_contiguous()
    with pytest.raises(ValueError, match=rf"^{name}: expected the last dimension contiguous"):
        call_with(small, **{name: nc})


def test_beta_view_of_any_strides_is_the_dense_beta(small):
    # beta has no width: a transposed [T, HV] memory read through its strides.
    nc = small["beta"].transpose(0, -1).contiguous().transpose(0, -1)
    assert not nc.is_contiguous()
    assert torch.equal(call_with(small, beta=nc), call_with(small))


@pytest.mark.parametrize("name", ["state_pool", "state_out_pool"])
def test_pool_with_non_dense_slots_is_value_error(small, name):
    pool = small["pool"].clone().transpose(2, 3)  # [P, HV, K, V] memory read as [P, HV, V, K]
    with pytest.raises(ValueError, match=rf"^{name}: expected dense row-major slots"):
        call_with(small, **{name: pool})


def test_pool_with_overlapping_slots_is_value_error(small):
    buf = torch.zeros(6 * 2 * 32 * 32)
    pool = buf.as_strided((6, 2, 32, 32), (1024, 1024, 32, 1))  # slot stride < HV*V*K = 2048
    with pytest.raises(ValueError, match=r"^state_pool: expected a stride between slots \(stride\(0\)\) of at least "
                                         r"HV\*V\*K = 2048 elements, got 1024"):
        call_with(small, state_pool=pool)


@pytest.mark.parametrize("lb", [0.0, 0.5, -5.5, float("nan")])
def test_bad_lower_bound_is_value_error_with_the_cpp_message(small, lb):
    with pytest.raises(ValueError, match=r"^lower_bound: expected a finite value in \[-5, 0\), got "):
        call_with(small, lower_bound=lb)


def test_bad_scale_is_value_error(small):
    with pytest.raises(ValueError, match=r"^scale: expected a finite value"):
        call_with(small, scale=float("inf"))


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_index_past_the_pool_is_value_error_naming_state_indices(small, index_dtype):
    with pytest.raises(ValueError, match=r"^state_indices: entry 1 is 6, expected < pool_size=6"):
        call_with(small, state_indices=torch.tensor([0, 6], dtype=index_dtype))


@pytest.mark.parametrize("as_numpy", [False, True])
def test_state_indices_without_columns_is_value_error(small, as_numpy):
    # [N, 0] names no slot for any sequence; read as [N] it took N indices from
    # outside the empty array and wrote those slots.
    idx = torch.empty(2, 0, dtype=torch.int64)
    pool = small["pool"].clone()
    with pytest.raises(ValueError, match=r"^state_indices: expected \[N\] or \[N, 1 \+ draft tokens\] with at "
                                         r"least one column, got shape \[2, 0\]"):
        call_with(small, state_pool=pool, state_indices=idx.numpy() if as_numpy else idx)
    assert torch.equal(pool, small["pool"])


def test_cu_seqlens_values_are_validated(small):
    with pytest.raises(ValueError, match=r"^cu_seqlens: expected cu_seqlens\[num_seqs\] == total_tokens=2, got 3"):
        call_with(small, cu_seqlens=torch.tensor([0, 1, 3]))
    with pytest.raises(ValueError, match=r"^cu_seqlens: expected non-decreasing values"):
        call_with(small, cu_seqlens=torch.tensor([0, 2, 1]))
    with pytest.raises(ValueError, match=r"^cu_seqlens_host: given without cu_seqlens"):
        call_with(small, cu_seqlens=None, cu_seqlens_host=torch.tensor([0, 1, 2]))


@pytest.mark.parametrize("name", ["k", "out", "state_pool", "state_indices", "per_token_states",
                                  "num_accepted_tokens"])
def test_mixed_devices_is_value_error(small, name):
    shape, dtype = {"out": (small["v"].shape, "bfloat16"), "state_pool": (small["pool"].shape, "float32"),
                    "state_indices": ((2,), "int64"), "per_token_states": ((2, 2, 32, 32), "float32"),
                    "k": (small["k"].shape, "bfloat16"), "num_accepted_tokens": ((2,), "int32")}[name]
    # The counts of a verify call are read by the kernel: on another device than q
    # they would be dereferenced where they do not live.
    extra = dict(state_indices=small["indices"][:, None].contiguous()) if name == "num_accepted_tokens" else {}
    fake = FakeDeviceTensor(shape, dtype, DL_CUDA, 0)
    with pytest.raises(ValueError, match=rf"^{name}: expected a tensor on the same device as q \(cpu\), got cuda:0"):
        call_with(small, **extra, **{name: fake})


@pytest.mark.parametrize("name", ["cu_seqlens", "state_out_pool", "per_token_states", "num_accepted_tokens"])
def test_null_data_pointer_is_value_error_naming_the_argument(small, name):
    # A DLPack array with elements but no memory is an error, not an argument left out
    # (a null state_out_pool had the step write state_pool in place).
    pool = small["pool"].clone()
    shape, dtype, extra = {
        "cu_seqlens": ((3,), "int64", {}), "state_out_pool": (tuple(pool.shape), "float32", {}),
        "per_token_states": ((2, 2, 32, 32), "float32", {}),
        "num_accepted_tokens": ((2,), "int32", dict(state_indices=small["indices"][:, None].contiguous()))}[name]
    with pytest.raises(ValueError, match=rf"^{name}: null pointer for a tensor of shape \[{shape[0]}"):
        call_with(small, state_pool=pool, **extra, **{name: FakeDeviceTensor(shape, dtype, DL_CPU, 0, null=True)})
    assert torch.equal(pool, small["pool"])


@pytest.mark.skipif(flash_kda.cuda_available(), reason="checks the no-GPU path")
def test_cuda_tensors_without_usable_cuda_backend_raise_not_implemented(small):
    f = {n: FakeDeviceTensor(small[n].shape, "bfloat16") for n in ("q", "k", "v", "g", "beta")}
    out = FakeDeviceTensor(small["v"].shape, "bfloat16")
    A_log, dt_bias = FakeDeviceTensor((2,), "float32"), FakeDeviceTensor((2, 32), "float32")
    pool = FakeDeviceTensor((6, 2, 32, 32), "float32")
    idx = FakeDeviceTensor((2,), "int64")
    with pytest.raises(NotImplementedError, match=r"^backend kCuda"):
        flash_kda.decode(f["q"], f["k"], f["v"], f["g"], f["beta"], A_log, dt_bias, pool, idx, out=out, stream=0)


# ---- kda_decode: the custom op --------------------------------------------------------

def test_kda_decode_op_equals_decode():
    p = make_decode(N=4, H=2, K=32, P=6, t=2, seed=31)
    T, HV, V = p["v"].shape
    out_ref, pool_ref = run(p, per_token_states=torch.zeros((T, HV, V, 32)))
    pool = p["pool"].clone()
    per_tok = torch.zeros((T, HV, V, 32))
    out = flash_kda.kda_decode(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"], pool,
                               p["indices"], scale=p["scale"], lower_bound=p["lower_bound"],
                               cu_seqlens=p["cu_seqlens"], per_token_states=per_tok)
    assert torch.equal(out, out_ref) and torch.equal(pool, pool_ref)
    ref_tok = torch.zeros((T, HV, V, 32))
    run(p, per_token_states=ref_tok)
    assert torch.equal(per_tok, ref_tok)


@pytest.mark.parametrize("pdl", [None, False, True])
def test_kda_decode_opcheck(pdl):
    # pdl is an optional bool in the op's schema (None = auto).
    p = make_decode(N=3, H=2, K=32, P=5, seed=32)
    args = (p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"], p["pool"].clone(), p["indices"],
            p["cu_seqlens"], None, p["scale"], p["lower_bound"], pdl)
    torch.library.opcheck(torch.ops.flash_kda.kda_decode.default, args)


def verify_problem():
    """Speculative verify on problem p: state_indices [N, 1 + S], num_accepted_tokens."""
    p = make_decode(N=2, K=32, P=8, seqlens=[3, 2], seed=33)
    idx = torch.tensor([[0, 1, 2], [3, 4, -1]], dtype=torch.int32)
    acc = torch.tensor([2, 1], dtype=torch.int32)
    return p, idx, acc


def test_kda_decode_op_speculative_verify_equals_decode():
    p, idx, acc = verify_problem()
    pool_ref, pool = p["pool"].clone(), p["pool"].clone()
    ref = flash_kda.decode(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"], pool_ref, idx,
                           cu_seqlens=p["cu_seqlens"], num_accepted_tokens=acc)
    out = flash_kda.kda_decode(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"], pool, idx,
                               cu_seqlens=p["cu_seqlens"], num_accepted_tokens=acc)
    assert torch.equal(out, ref) and torch.equal(pool, pool_ref)
    args = (p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"], p["pool"].clone(), idx,
            p["cu_seqlens"], None, float(p["scale"]), float(p["lower_bound"]), None, acc)
    torch.library.opcheck(torch.ops.flash_kda.kda_decode.default, args)

    def verify(pool):
        return flash_kda.kda_decode(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"], pool, idx,
                                    cu_seqlens=p["cu_seqlens"], num_accepted_tokens=acc)

    pool_c = p["pool"].clone()
    out_c = torch.compile(verify, fullgraph=True, backend="aot_eager")(pool_c)
    assert torch.equal(out_c, ref) and torch.equal(pool_c, pool_ref)


def test_allocated_out_padding_rows_are_zero(monkeypatch):
    # A padding entry's rows are not written by the kernel: an out the call allocates
    # must hold zeros there (as fla's o), not what the allocator handed back. torch.empty
    # is made to return NaN-filled memory, so an allocation that relied on it fails here.
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: real_empty(*a, **kw).fill_(float("nan")))
    p = make_decode(N=3, K=32, P=6, seqlens=[2, 3, 1], seed=34)
    idx = torch.tensor([0, -1, 4], dtype=torch.int32)
    rows = slice(2, 5)  # sequence 1's tokens
    outs = (flash_kda.decode(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"],
                             p["pool"].clone(), idx, cu_seqlens=p["cu_seqlens"]),
            flash_kda.kda_decode(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"],
                                 p["pool"].clone(), idx, cu_seqlens=p["cu_seqlens"]))
    for out in outs:
        assert torch.equal(out[rows], torch.zeros_like(out[rows]))
        assert torch.isfinite(out.float()).all()
    assert torch.equal(outs[0], outs[1])


def test_verify_with_one_column_is_the_plain_step():
    # fla's serving form with no draft tokens: state_indices [N, 1] with
    # num_accepted_tokens (all ones) is the plain [N] step; a count of 2 is named.
    p = make_decode(N=3, K=32, P=6, seed=35)
    idx = torch.tensor([4, -1, 1], dtype=torch.int64)
    pool_ref, pool = p["pool"].clone(), p["pool"].clone()
    args = (p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"])
    ref = flash_kda.decode(*args, pool_ref, idx)
    out = flash_kda.decode(*args, pool, idx[:, None], num_accepted_tokens=torch.ones(3, dtype=torch.int64))
    assert torch.equal(out, ref) and torch.equal(pool, pool_ref)
    with pytest.raises(ValueError, match=r"num_accepted_tokens: entry 2 is 2, expected a value in \[1, 1\]"):
        flash_kda.decode(*args, p["pool"].clone(), idx[:, None], num_accepted_tokens=torch.tensor([1, 1, 2]))


def kda_decode_two_steps(p):
    """A function of the pool running two chained kda_decode steps on problem p: the
    second must read the pool the first wrote (only true when the op declares its
    mutation, once compiled)."""
    def two_steps(pool):
        outs = [flash_kda.kda_decode(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"], pool,
                                     p["indices"], scale=p["scale"], lower_bound=p["lower_bound"])
                for _ in range(2)]
        return outs[0].float() + outs[1].float()
    return two_steps


def test_kda_decode_torch_compile_fullgraph_updates_the_pool():
    p = make_decode(N=3, H=2, K=32, P=5, seed=33)
    two_steps = kda_decode_two_steps(p)
    pool_eager, pool_compiled = p["pool"].clone(), p["pool"].clone()
    eager = two_steps(pool_eager)
    compiled = torch.compile(two_steps, fullgraph=True, backend="aot_eager")(pool_compiled)
    assert torch.equal(eager, compiled)
    assert torch.equal(pool_eager, pool_compiled)
    assert not torch.equal(pool_eager, p["pool"])


def test_int32_cu_seqlens_is_the_int64_call():
    """vLLM's int32 offsets: the same bits as int64 ones."""
    p = make_decode(N=3, K=32, seqlens=[1, 3, 2])
    out64, pool64 = run(p)
    out32, pool32 = run(p, cu_seqlens=p["cu_seqlens"].int())
    assert torch.equal(out32, out64) and torch.equal(pool32, pool64)


def test_speculative_verify_writes_each_tokens_state_to_its_slot():
    """state_indices [N, 1 + S] with num_accepted_tokens (fla's serving-form semantics): each
    sequence starts from the slot of its last accepted token, and token t's state goes to
    slot [n, t]; checked against a plain decode with per-token states from that slot."""
    p = make_decode(N=2, K=32, P=8, seqlens=[3, 2])
    idx = torch.tensor([[0, 1, 2], [3, 4, -1]], dtype=torch.int32)
    acc = torch.tensor([2, 1], dtype=torch.int32)           # start from slots 1 and 3
    pool = p["pool"].clone()
    out = flash_kda.decode(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"], pool, idx,
                           cu_seqlens=p["cu_seqlens"], num_accepted_tokens=acc)
    per_tok = torch.empty(5, *p["pool"].shape[1:])
    ref_pool = p["pool"].clone()
    ref_out = flash_kda.decode(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"], ref_pool,
                               torch.tensor([1, 3], dtype=torch.int32), cu_seqlens=p["cu_seqlens"],
                               per_token_states=per_tok)
    assert torch.equal(out, ref_out)
    for n, t0 in ((0, 0), (1, 3)):
        for t in range(3 if n == 0 else 2):
            assert torch.equal(pool[int(idx[n, t])], per_tok[t0 + t]), f"sequence {n} token {t}"
    for s in (5, 6, 7):
        assert torch.equal(pool[s], p["pool"][s]), f"slot {s} was written"
    with pytest.raises(ValueError, match="num_accepted_tokens: entry 1 is 4"):
        flash_kda.decode(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"], pool.clone(), idx,
                         cu_seqlens=p["cu_seqlens"], num_accepted_tokens=torch.tensor([2, 4], dtype=torch.int32))
    with pytest.raises(TypeError, match="num_accepted_tokens: expected the dtype of state_indices"):
        flash_kda.decode(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"], pool.clone(), idx,
                         cu_seqlens=p["cu_seqlens"], num_accepted_tokens=acc.long())
