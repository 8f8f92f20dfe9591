"""flash_kda.kda_prefill, the forward on a state pool as a torch.library custom op, on
the CPU backend: bitwise flash_kda.fwd with the same pool arguments (out, the slots,
periodic and slot checkpoints), a registered op that passes torch.library.opcheck,
and an engine's step (chunked prefill with checkpoints, then decode steps on the same
pool) compiled with torch.compile(fullgraph=True) bitwise the eager step."""
from __future__ import annotations

import pytest
import torch

import flash_kda
from kda_reference import make_problem

H, HV, K = 2, 4, 32
P = 7  # pool slots


def pool_problem(seed, seqlens=(37, 0, 64, 21), dtype=torch.float32, device="cpu", dim=K):
    p = make_problem(H=H, HV=HV, K=dim, seqlens=list(seqlens), seed=seed, device=device)
    gen = torch.Generator().manual_seed(seed + 100)
    pool = (0.1 * torch.randn(P, HV, dim, dim, generator=gen)).to(dtype).to(device)
    return p, pool


def tokens(p):
    return p["q"], p["k"], p["v"], p["g"], p["beta"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_prefill_op_is_fwd_on_the_pool(dtype, index_dtype):
    p, pool = pool_problem(41, dtype=dtype)
    slots = torch.tensor([4, -1, 1, 0], dtype=index_dtype)
    has = torch.tensor([True, True, False, True])
    cu32 = p["cu_seqlens"].to(torch.int32)
    ck = torch.full((2 + 0 + 2 + 1, HV, K, K), float("nan"), dtype=torch.bfloat16)  # every 32 tokens
    offsets = torch.tensor([[16, -1], [-1, -1], [32, 48], [-1, 16]], dtype=torch.int64)
    ck_slots = torch.tensor([[2, -1], [-1, -1], [3, 5], [-1, 6]], dtype=index_dtype)
    kw = dict(has_initial_state=has, cu_seqlens=cu32, scale=p["scale"], lower_bound=p["lower_bound"],
              checkpoint_interval=32, slot_checkpoint_offsets=offsets, slot_checkpoint_slots=ck_slots)

    pool_eager, ck_eager = pool.clone(), ck.clone()
    out_eager = torch.empty_like(p["v"])
    flash_kda.fwd(*tokens(p), p["scale"], out_eager, A_log=p["A_log"], dt_bias=p["dt_bias"],
                  lower_bound=p["lower_bound"], cu_seqlens=cu32, state_pool=pool_eager, state_indices=slots,
                  has_initial_state=has, checkpoints=ck_eager, checkpoint_interval=32,
                  slot_checkpoint_offsets=offsets, slot_checkpoint_slots=ck_slots)

    pool_op, ck_op = pool.clone(), ck.clone()
    out_op = flash_kda.kda_prefill(*tokens(p), p["A_log"], p["dt_bias"], pool_op, slots, checkpoints=ck_op, **kw)
    assert torch.equal(out_op, out_eager)
    assert torch.equal(pool_op, pool_eager)
    assert torch.equal(ck_op, ck_eager)
    assert not torch.equal(pool_op, pool), "the op wrote the pool in place"
    assert not torch.isnan(ck_op.float()).any(), "every periodic entry written"


def test_prefill_op_is_a_registered_custom_op_that_mutates_the_pool():
    schema = torch.ops.flash_kda.kda_prefill.default._schema
    assert schema.name == "flash_kda::kda_prefill"
    mutated = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert mutated == {"state_pool", "checkpoints"}


def _op_args(p, pool, slots, ck=None, interval=64):
    return (*tokens(p), p["A_log"], p["dt_bias"], pool, slots, torch.tensor([True, False, True]),
            p["cu_seqlens"], None, ck, interval, False, None, None, float(p["scale"]), float(p["lower_bound"]))


@pytest.mark.skipif(not hasattr(torch.library, "opcheck"), reason="torch.library.opcheck needs torch >= 2.4")
@pytest.mark.parametrize("with_checkpoints", [False, True])
def test_prefill_opcheck(with_checkpoints):
    p, pool = pool_problem(42, seqlens=(20, 33, 5))
    slots = torch.tensor([3, 0, 6], dtype=torch.int32)
    ck = torch.zeros(2 + 3 + 1, HV, K, K) if with_checkpoints else None  # every 16: 2 + 3 + 1 entries
    torch.library.opcheck(torch.ops.flash_kda.kda_prefill.default, _op_args(p, pool, slots, ck, 16))


def engine_step(p, starts, split, steps):
    """A function of (pool, checkpoints): the engine's step on problem p (sequences of
    equal length starting at `starts` in p's packed tokens), a chunked prefill of the
    first `split` tokens and the rest up to `steps` before the end, then `steps`
    decode steps, all on pool slots 5 and 2; returns the outputs."""
    n, dev = len(starts), p["q"].device
    slots = torch.tensor([5, 2], dtype=torch.int32, device=dev)
    length = int(p["cu_seqlens"][1])
    prefill_end = length - steps

    def take(x, lo, hi):
        return torch.cat([x[0, s + lo:s + hi] for s in starts])[None]

    def step(pool, ck):
        outs = []
        for lo, hi, first in ((0, split, True), (split, prefill_end, False)):
            cu = torch.arange(n + 1, dtype=torch.int32, device=dev) * (hi - lo)
            extra = dict(checkpoints=ck, checkpoint_interval=32) if first else {}
            outs.append(flash_kda.kda_prefill(
                *(take(x, lo, hi) for x in tokens(p)), p["A_log"], p["dt_bias"], pool, slots,
                has_initial_state=torch.full((n,), not first, device=dev), cu_seqlens=cu, **extra))
        for t in range(prefill_end, length):
            at = [s + t for s in starts]
            outs.append(flash_kda.kda_decode(*(x[0, at] for x in tokens(p)), p["A_log"], p["dt_bias"], pool, slots))
        return outs

    return step


def compiled_and_eager_steps(device="cpu", dim=K):
    """The engine step of engine_step compiled (fullgraph) and eager from the same
    pool: (problem, (outs, pool, checkpoints) compiled, the same eager)."""
    p, _ = pool_problem(43, seqlens=(99, 99), device=device, dim=dim)
    step = engine_step(p, [0, 99], split=48, steps=3)
    pool0 = torch.zeros(P, HV, dim, dim, device=device)
    ck0 = torch.full((2 * 2, HV, dim, dim), float("nan"), device=device)  # every 32 over 48 tokens: 2 each
    pool_eager, ck_eager = pool0.clone(), ck0.clone()
    outs_eager = step(pool_eager, ck_eager)
    pool_compiled, ck_compiled = pool0.clone(), ck0.clone()
    outs_compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(pool_compiled, ck_compiled)
    return p, (outs_compiled, pool_compiled, ck_compiled), (outs_eager, pool_eager, ck_eager)


def test_engine_step_compiled_fullgraph_equals_eager():
    p, (outs_compiled, pool_compiled, ck_compiled), (outs_eager, pool_eager, ck_eager) = compiled_and_eager_steps()
    assert len(outs_compiled) == len(outs_eager)
    for a, b in zip(outs_compiled, outs_eager):
        assert torch.equal(a, b)
    assert torch.equal(pool_compiled, pool_eager)
    assert torch.equal(ck_compiled, ck_eager)

    # And the step is the straight run: slot 5 holds sequence 0's state after all 99 tokens.
    fin = torch.empty(2, HV, K, K)
    flash_kda.fwd(*tokens(p), p["scale"], torch.empty_like(p["v"]), A_log=p["A_log"], dt_bias=p["dt_bias"],
                  lower_bound=p["lower_bound"], cu_seqlens=p["cu_seqlens"], final_state=fin)
    for n, s in enumerate((5, 2)):
        rel = (pool_eager[s] - fin[n]).norm() / fin[n].norm()
        assert rel < 1e-5, f"sequence {n}: slot {s} against the straight run {rel:.2e}"


def test_prefill_op_errors_name_the_argument():
    p, pool = pool_problem(44, seqlens=(20, 33))
    args = (*tokens(p), p["A_log"], p["dt_bias"], pool)
    with pytest.raises(TypeError, match="state_indices"):
        flash_kda.kda_prefill(*args, torch.tensor([0.0, 1.0]), cu_seqlens=p["cu_seqlens"])
    with pytest.raises(ValueError, match="state_indices"):
        flash_kda.kda_prefill(*args, torch.tensor([0, 1, 2]), cu_seqlens=p["cu_seqlens"])
    with pytest.raises(TypeError, match="checkpoint_interval"):
        flash_kda.kda_prefill(*args, torch.tensor([0, 1]), cu_seqlens=p["cu_seqlens"], checkpoint_interval=64.0)
    with pytest.raises(ValueError, match="checkpoint_interval"):
        flash_kda.kda_prefill(*args, torch.tensor([0, 1]), cu_seqlens=p["cu_seqlens"],
                              checkpoints=torch.zeros(8, HV, K, K), checkpoint_interval=24)


def test_op_wrappers_name_bad_tensors_devices_and_flags():
    # Checked before the op is called: a tensor on another device (meta) would send
    # the call to the fake implementation (an unwritten out, the pool untouched), and a
    # non-tensor would get the op's whole schema.
    p, pool = pool_problem(45, seqlens=(20, 33))
    q, k, v, g, beta = tokens(p)
    slots = torch.tensor([0, 1])
    pre = dict(cu_seqlens=p["cu_seqlens"])
    args = [q, k, v, g, beta, p["A_log"], p["dt_bias"], pool, slots]
    for i, name in enumerate(["q", "k", "v", "g", "beta", "A_log", "dt_bias", "state_pool", "state_indices"]):
        bad = list(args)
        bad[i] = bad[i].to("meta")
        with pytest.raises(ValueError, match=rf"^{name}: expected a tensor on the device of q \(cpu\), got meta"
                           if i else r"^k: expected a tensor on the device of q \(meta\), got cpu"):
            flash_kda.kda_prefill(*bad, **pre)
        with pytest.raises(ValueError, match="expected a tensor on the device of q"):
            flash_kda.kda_decode(*bad, cu_seqlens=p["cu_seqlens"])
        bad[i] = None if i != 0 else [1.0]
        with pytest.raises(TypeError, match=rf"^{name}: expected a torch.Tensor, got"):
            flash_kda.kda_prefill(*bad, **pre)
    with pytest.raises(ValueError, match=r"^cu_seqlens: expected a tensor on the device of q"):
        flash_kda.kda_prefill(*args, cu_seqlens=p["cu_seqlens"].to("meta"))
    with pytest.raises(TypeError, match=r"^checkpoints: expected a torch.Tensor or None, got list"):
        flash_kda.kda_prefill(*args, checkpoints=[0], **pre)
    with pytest.raises(TypeError, match=r"^checkpoints_value_major: expected a bool, got str"):
        flash_kda.kda_prefill(*args, checkpoints=torch.zeros(8, HV, K, K), checkpoint_interval=16,
                              checkpoints_value_major="False", **pre)
    with pytest.raises(ValueError, match=r"^checkpoint_interval: expected a multiple of 16 within int64"):
        flash_kda.kda_prefill(*args, checkpoint_interval=2**63, **pre)
    for kw in (dict(scale=10**400), dict(lower_bound=-10**400)):
        with pytest.raises(TypeError, match=rf"^{next(iter(kw))}: expected a float"):
            flash_kda.kda_prefill(*args, **kw, **pre)
    with pytest.raises(ValueError, match=r"^initial_state: expected a tensor on the device of q"):
        flash_kda.kda_forward(q, k, v, g, beta, p["A_log"], p["dt_bias"], initial_state=torch.zeros(2, HV, K, K,
                              device="meta"), cu_seqlens=p["cu_seqlens"])
    with pytest.raises(TypeError, match=r"^output_final_state: expected a bool, got str"):
        flash_kda.kda_forward(q, k, v, g, beta, p["A_log"], p["dt_bias"], cu_seqlens=p["cu_seqlens"],
                              output_final_state="False")


def test_prefill_op_refuses_a_meta_tensor_beside_real_ones():
    # Torch would send the call to the fake implementation: the pool left as it was.
    p, pool = pool_problem(43, seqlens=(20, 33, 5))
    args = list(_op_args(p, pool, torch.tensor([3, 0, 6], dtype=torch.int32)))
    args[8] = args[8].to("meta")  # state_indices
    before = pool.clone()
    with pytest.raises(ValueError, match=r"^state_indices: expected a tensor on the device of q \(cpu\), got meta"):
        torch.ops.flash_kda.kda_prefill(*args)
    assert torch.equal(pool, before)
