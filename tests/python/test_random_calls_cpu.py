"""Random engine-style calls of flash_kda.fwd on CPU tensors, every argument form at
once: q/k/v/g/beta as views of one fused projection output (or dense), int32 or
int64 cu_seqlens (with or without the host copy), a state pool that is a slice of a
bigger buffer (int32 or int64 indices, negative ones, has_initial_state), periodic
checkpoints in either layout and dtype. Each call is run again with the glue an
engine would otherwise write (contiguous copies, int64 boundaries, the slots
gathered into a dense initial state and the final states scattered back by hand)
and must be bitwise that run: the binding reads every form as the plain one, and
writes nothing else (the pool's other slots and padding, spare checkpoint entries)."""
from __future__ import annotations

import math
import random

import pytest
import torch

import flash_kda
from kda_reference import make_problem

CALLS = 60


def draw(seed):
    r = random.Random(seed)
    H = r.choice([1, 2])
    HV = H * r.choice([1, 2])
    K = r.choice([16, 32])
    V = r.choice([K, 16])
    varlen = r.random() < 0.75
    if varlen:
        lengths = [r.choice([0, r.randint(1, 15), 16 * r.randint(1, 4), r.randint(17, 150)])
                   for _ in range(r.randint(1, 5))]
        p = make_problem(H=H, HV=HV, K=K, V=V, seqlens=lengths, seed=seed)
    else:
        lengths = None
        p = make_problem(B=r.randint(1, 3), T=r.randint(1, 120), H=H, HV=HV, K=K, V=V, seed=seed)
    return r, p, lengths


def fused(p, r):
    """q | k | v | g | beta (| pad) of each token in one [B, T, width] buffer, and the views."""
    B, T, H, K = p["q"].shape
    HV, V = p["v"].shape[2], p["v"].shape[3]
    parts = [p["q"].reshape(B, T, H * K), p["k"].reshape(B, T, H * K), p["v"].reshape(B, T, HV * V),
             p["g"].reshape(B, T, HV * K), p["beta"]]
    pad = 8 * r.randint(0, 2)
    buf = torch.cat(parts + [torch.zeros(B, T, pad, dtype=torch.bfloat16)], dim=-1)
    at, views = 0, {}
    for name, t, shape in zip(("q", "k", "v", "g", "beta"), parts,
                              ((H, K), (H, K), (HV, V), (HV, K), None)):
        w = t.shape[-1]
        x = buf[..., at:at + w]
        views[name] = x if shape is None else x.unflatten(-1, shape)
        at += w
    return views


@pytest.mark.parametrize("seed", range(CALLS))
def test_engine_forms_are_bitwise_the_glued_call(seed):
    r, p, lengths = draw(seed)
    B, T, H, K = p["q"].shape
    HV, V = p["v"].shape[2], p["v"].shape[3]
    N = p["N"]
    common = dict(A_log=p["A_log"], dt_bias=p["dt_bias"], lower_bound=r.choice([-5.0, -1.0]), backend="cpu")
    scale = r.choice([None, 0.3])

    # ---- the engine's forms -----------------------------------------------------
    views = fused(p, r) if r.random() < 0.6 else {n: p[n] for n in ("q", "k", "v", "g", "beta")}
    kw = {}
    if lengths is not None:
        kw["cu_seqlens"] = p["cu_seqlens"].to(r.choice([torch.int32, torch.int64]))
        if r.random() < 0.5:
            kw["cu_seqlens_host"] = p["cu_seqlens"].clone()
    use_pool = r.random() < 0.6
    pool_dtype = r.choice([torch.float32, torch.bfloat16])
    P = 2 * N + 2
    per = HV * V * K
    slot_pad = r.choice([0, 8])
    gen = torch.Generator().manual_seed(seed + 7)
    pool_base = (0.1 * torch.randn(P, per + slot_pad, generator=gen)).to(pool_dtype)
    pool = pool_base[:, :per].view(P, HV, V, K)  # a slice: slots slot_pad elements apart
    slots = r.sample(range(P), N)
    slots = [s if r.random() < 0.8 else -1 for s in slots]
    has = [r.random() < 0.7 for _ in range(N)] if r.random() < 0.5 else None
    if use_pool:
        kw.update(state_pool=pool, state_indices=torch.tensor(slots, dtype=r.choice([torch.int32, torch.int64])))
        if has is not None:
            kw["has_initial_state"] = torch.tensor(has)
    interval = 16 * r.choice([1, 2, 4]) if r.random() < 0.5 else 0
    ck_dtype = r.choice([torch.float32, torch.bfloat16])
    value_major = r.random() < 0.5
    lens = lengths if lengths is not None else [T] * B
    entries = sum(math.ceil(n / interval) for n in lens) if interval else 0
    ck_entry = (HV, V, K) if value_major else (HV, K, V)
    ck = torch.full((max(entries, 1) + 1, *ck_entry), 7.0, dtype=ck_dtype)  # one spare entry
    if interval:
        kw.update(checkpoints=ck, checkpoint_interval=interval, checkpoints_value_major=value_major)

    before = pool_base.clone()
    out = torch.full_like(p["v"], float("nan"))
    dense_in = None if use_pool else p["initial_state"]
    fin = None if use_pool else torch.full((N, HV, V, K), float("nan"))
    flash_kda.fwd(views["q"], views["k"], views["v"], views["g"], views["beta"], scale, out,
                  initial_state=dense_in, final_state=fin, **common, **kw)

    # ---- the same call with the glue ----------------------------------------------
    gkw = {}
    if lengths is not None:
        gkw["cu_seqlens"] = p["cu_seqlens"].to(torch.int64)
    if use_pool:
        init = torch.zeros(N, HV, V, K, dtype=pool_dtype)
        for n, s in enumerate(slots):
            if s >= 0 and (has is None or has[n]):
                init[n] = before[s, :per].view(HV, V, K)
        glued_fin = torch.empty(N, HV, V, K, dtype=pool_dtype)
    else:
        init, glued_fin = dense_in, torch.empty(N, HV, V, K)
    glued_ck = torch.full_like(ck, 7.0)
    if interval:
        gkw.update(checkpoints=glued_ck, checkpoint_interval=interval, checkpoints_value_major=value_major)
    glued_out = torch.full_like(p["v"], float("nan"))
    flash_kda.fwd(*(p[n].contiguous() for n in ("q", "k", "v", "g", "beta")), scale, glued_out,
                  initial_state=init, final_state=glued_fin, **common, **gkw)

    assert torch.equal(out, glued_out), "out"
    if use_pool:
        expect = before.clone()
        for n, s in enumerate(slots):
            if s >= 0:
                expect[s, :per] = glued_fin[n].reshape(-1)
        assert torch.equal(pool_base, expect), "the pool: sequences' slots, and nothing else"
    else:
        assert torch.equal(fin, glued_fin), "final_state"
    if interval:
        assert torch.equal(ck[:entries], glued_ck[:entries]), "checkpoints"
        assert torch.all(ck[entries:] == 7.0), "spare checkpoint entries"
