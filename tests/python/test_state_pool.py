"""flash_kda.fwd on a state pool (state_pool / state_indices / has_initial_state) on
the CPU backends: bitwise the dense forward from the gathered slots, final states back
in their slots, the other slots and the padding between slots untouched; errors by name."""
from __future__ import annotations

import pytest
import torch

import flash_kda
from kda_reference import make_problem

P, PAD = 6, 8  # slots; elements of padding after each slot


def strided_pool(HV, V, K, dtype, gen):
    """[P, HV, V, K] slots PAD elements apart, filled (padding included) with random values."""
    base = (0.1 * torch.randn(P, HV * V * K + PAD, generator=gen)).to(dtype)
    return base, base[:, :HV * V * K].view(P, HV, V, K)


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_pool_forward_equals_the_dense_forward(backend, dtype, index_dtype):
    p = make_problem(H=2, HV=4, K=32, seqlens=[37, 0, 64, 21], seed=3)
    HV, V, K = 4, 32, 32
    gen = torch.Generator().manual_seed(4)
    base, pool = strided_pool(HV, V, K, dtype, gen)
    before = base.clone()
    slots = torch.tensor([4, -1, 1, 0], dtype=index_dtype)
    has = torch.tensor([True, True, False, True])
    # The dense twin, gathered by hand.
    init = torch.zeros(4, HV, V, K, dtype=dtype)
    for n in (0, 3):
        init[n] = pool[int(slots[n])]
    fin = torch.empty_like(init)
    out_dense = torch.empty_like(p["v"])
    common = dict(A_log=p["A_log"], dt_bias=p["dt_bias"], lower_bound=p["lower_bound"], cu_seqlens=p["cu_seqlens"])
    flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out_dense, initial_state=init,
                  final_state=fin, backend=backend, **common)
    out = torch.empty_like(p["v"])
    flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, state_pool=pool, state_indices=slots,
                  has_initial_state=has, backend=backend, **common)
    assert torch.equal(out, out_dense)
    for s in range(P):
        seqs = [n for n in range(4) if int(slots[n]) == s]
        if seqs:
            assert torch.equal(pool[s], fin[seqs[0]]), f"slot {s}"
        else:
            assert torch.equal(base[s, :HV * V * K], before[s, :HV * V * K]), f"slot {s} was written"
        assert torch.equal(base[s, HV * V * K:], before[s, HV * V * K:]), f"padding after slot {s}"


def test_pool_arguments_are_checked_by_name():
    p = make_problem(H=1, K=32, seqlens=[10, 20], seed=5)
    pool = torch.zeros(3, 1, 32, 32)
    slots = torch.tensor([0, 2], dtype=torch.int32)
    out = torch.empty_like(p["v"])
    args = (p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out)
    kw = dict(A_log=p["A_log"], dt_bias=p["dt_bias"], cu_seqlens=p["cu_seqlens"])
    with pytest.raises(ValueError, match="state_pool: given together with initial_state"):
        flash_kda.fwd(*args, initial_state=p["initial_state"], state_pool=pool, state_indices=slots, **kw)
    with pytest.raises(ValueError, match="state_indices: required with state_pool"):
        flash_kda.fwd(*args, state_pool=pool, **kw)
    with pytest.raises(ValueError, match="state_indices: given without state_pool"):
        flash_kda.fwd(*args, state_indices=slots, **kw)
    with pytest.raises(ValueError, match="has_initial_state: given without state_pool"):
        flash_kda.fwd(*args, has_initial_state=torch.ones(2, dtype=torch.bool), **kw)
    with pytest.raises(ValueError, match=r"state_indices: expected shape \[N\]"):
        flash_kda.fwd(*args, state_pool=pool, state_indices=torch.tensor([0, 1, 2], dtype=torch.int32), **kw)
    with pytest.raises(TypeError, match="state_indices"):
        flash_kda.fwd(*args, state_pool=pool, state_indices=slots.float(), **kw)
    with pytest.raises(ValueError, match="state_indices: entry 1 is 3, expected < pool_size=3"):
        flash_kda.fwd(*args, state_pool=pool, state_indices=torch.tensor([0, 3], dtype=torch.int32), **kw)
    with pytest.raises(ValueError, match="state_pool"):
        flash_kda.fwd(*args, state_pool=torch.zeros(3, 1, 32, 16), state_indices=slots, **kw)


def test_outputs_in_a_strided_pools_slots_are_refused():
    """The overlap check is exact where one side is dense: out (or checkpoints) in a
    middle slot of a pool whose slots are two slots' room apart is refused, though
    neither end of the pool's range lies inside it; out in the gap between two slots
    shares no byte and runs."""
    p = make_problem(H=1, K=32, seqlens=[10, 20], seed=5)
    big = torch.zeros(8, 1, 32, 32)
    pool = big[::2]  # slots 0..3 at big[0], big[2], big[4], big[6]
    slots = torch.tensor([0, 2], dtype=torch.int32)
    kw = dict(A_log=p["A_log"], dt_bias=p["dt_bias"], cu_seqlens=p["cu_seqlens"], state_pool=pool,
              state_indices=slots)
    T, V = p["v"].shape[1], p["v"].shape[3]

    def out_in(i):  # a bf16 out laid over big[i]
        return big[i].view(torch.bfloat16).flatten()[:T * V].view(1, T, 1, V)

    args = (p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"])
    with pytest.raises(ValueError, match="state_pool: shares memory with out"):
        flash_kda.fwd(*args, out_in(2), **kw)
    with pytest.raises(ValueError, match="checkpoints: shares memory with state_pool"):
        # three entries (10 and 20 tokens every 16), dense over big[3:6]: pool slot 2 among them
        flash_kda.fwd(*args, torch.empty_like(p["v"]), checkpoints=big[3:6], checkpoint_interval=16, **kw)
    gap = out_in(1)
    flash_kda.fwd(*args, gap, **kw)
    assert torch.isfinite(gap.float()).all()


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_slot_checkpoints_hold_the_prefix_states(backend):
    """vLLM's "align" mode: the state after 16-aligned offsets of a sequence into given slots,
    bit for bit the final state of a forward on that prefix from the sequence's slot."""
    p = make_problem(H=1, K=32, seqlens=[40, 64], seed=7)
    pool = torch.zeros(6, 1, 32, 32)
    pool[0], pool[1] = p["initial_state"][0], p["initial_state"][1]
    slots = torch.tensor([0, 1], dtype=torch.int64)
    offsets = torch.tensor([[16, 32], [48, -1]])
    ck_slots = torch.tensor([[2, 3], [4, 5]])
    out = torch.empty_like(p["v"])
    flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, A_log=p["A_log"],
                  dt_bias=p["dt_bias"], lower_bound=p["lower_bound"], cu_seqlens=p["cu_seqlens"], state_pool=pool,
                  state_indices=slots, slot_checkpoint_offsets=offsets, slot_checkpoint_slots=ck_slots,
                  backend=backend)

    def prefix(n, start, tokens):
        x = {key: p[key][:, start:start + tokens] for key in ("q", "k", "v", "g", "beta")}
        fin = torch.empty(1, 1, 32, 32)
        flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], p["scale"], torch.empty_like(x["v"]),
                      A_log=p["A_log"], dt_bias=p["dt_bias"], lower_bound=p["lower_bound"],
                      initial_state=p["initial_state"][n:n + 1], final_state=fin, backend=backend)
        return fin[0]

    assert torch.equal(pool[2], prefix(0, 0, 16))
    assert torch.equal(pool[3], prefix(0, 0, 32))
    assert torch.equal(pool[4], prefix(1, 40, 48))
    assert torch.equal(pool[5], torch.zeros(1, 32, 32)), "a negative offset wrote its slot"
    with pytest.raises(ValueError, match="slot_checkpoint_offsets: entry"):
        flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, A_log=p["A_log"],
                      dt_bias=p["dt_bias"], cu_seqlens=p["cu_seqlens"], state_pool=pool, state_indices=slots,
                      slot_checkpoint_offsets=torch.tensor([[24, -1], [-1, -1]]), slot_checkpoint_slots=ck_slots)
    with pytest.raises(ValueError, match="slot checkpoints need a state_pool"):
        flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, A_log=p["A_log"],
                      dt_bias=p["dt_bias"], cu_seqlens=p["cu_seqlens"], slot_checkpoint_offsets=offsets,
                      slot_checkpoint_slots=ck_slots)
    with pytest.raises(TypeError, match="slot_checkpoint_slots: expected the dtype of state_indices"):
        flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, A_log=p["A_log"],
                      dt_bias=p["dt_bias"], cu_seqlens=p["cu_seqlens"], state_pool=pool, state_indices=slots,
                      slot_checkpoint_offsets=offsets, slot_checkpoint_slots=ck_slots.int())


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_int32_cu_seqlens_is_the_int64_run(backend):
    """vLLM passes cu_seqlens as int32: the same bits as int64 boundaries."""
    p = make_problem(H=2, HV=4, K=32, seqlens=[37, 0, 64, 21], seed=8)
    outs, fins = [], []
    for cu in (p["cu_seqlens"], p["cu_seqlens"].int()):
        out = torch.empty_like(p["v"])
        fin = torch.empty(4, 4, 32, 32)
        flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, A_log=p["A_log"],
                      dt_bias=p["dt_bias"], lower_bound=p["lower_bound"], initial_state=p["initial_state"],
                      final_state=fin, cu_seqlens=cu, backend=backend)
        outs.append(out)
        fins.append(fin)
    assert torch.equal(outs[0], outs[1]) and torch.equal(fins[0], fins[1])
    # Named as the caller's cu_seqlens (the core's int32 argument is cu_seqlens_int32).
    with pytest.raises(ValueError, match=r"^cu_seqlens: expected non-decreasing values, got cu_seqlens\[2\]=10"):
        flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], torch.empty_like(p["v"]),
                      A_log=p["A_log"], dt_bias=p["dt_bias"],
                      cu_seqlens=torch.tensor([0, 37, 10, 101, 122], dtype=torch.int32), backend=backend)


def test_strided_slot_indices_are_the_dense_ones():
    # An engine's slot column: block_table[:, 0], a strided view. fwd and decode take it
    # as its dense copy.
    p = make_problem(H=1, K=32, seqlens=[10, 20, 7], seed=9)
    table = torch.tensor([[4, 9, 9], [0, 9, 9], [2, 9, 9]], dtype=torch.int32)
    assert not table[:, 0].is_contiguous()
    out = []
    for idx in (table[:, 0], table[:, 0].contiguous()):
        pool = torch.zeros(P, 1, 32, 32)
        o = torch.empty_like(p["v"])
        flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], o, A_log=p["A_log"],
                      dt_bias=p["dt_bias"], cu_seqlens=p["cu_seqlens"], state_pool=pool, state_indices=idx)
        last = [int(c) - 1 for c in p["cu_seqlens"][1:]]
        d = flash_kda.decode(*(p[n][0, last] for n in ("q", "k", "v", "g", "beta")), p["A_log"], p["dt_bias"],
                             pool, idx)
        out.append((o, d, pool))
    assert all(torch.equal(a, b) for a, b in zip(out[0], out[1]))
