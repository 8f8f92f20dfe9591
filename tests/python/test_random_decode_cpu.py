"""Random engine-style decode steps through the Python binding on CPU tensors, every
argument form at once: token tensors as views of one fused projection (or dense),
int32 or int64 cu_seqlens (or equal lengths), a pool sliced from a bigger buffer,
slot indices of either width as a block table's strided column (padding entries
among them), a separate output pool, per-token states, and speculative verify
(indices [N, 1 + S] with num_accepted_tokens). Each step is run again with an
engine's glue (contiguous copies, int64 boundaries, a dense pool copy, dense
indices) and must be bitwise that run; nothing else may be written."""
from __future__ import annotations

import random

import pytest
import torch

import flash_kda
from test_decode_cpu import make_decode

STEPS = 40


def fused(p, r):
    """q | k | v | g | beta (| pad) of each token in one [T, width] buffer, and the views."""
    T, H, K = p["q"].shape
    HV, V = p["v"].shape[1], p["v"].shape[2]
    parts = [p["q"].reshape(T, H * K), p["k"].reshape(T, H * K), p["v"].reshape(T, HV * V),
             p["g"].reshape(T, HV * K), p["beta"]]
    buf = torch.cat(parts + [torch.zeros(T, 8 * r.randint(0, 2), dtype=torch.bfloat16)], dim=-1)
    at, views = 0, {}
    for name, t, shape in zip(("q", "k", "v", "g", "beta"), parts, ((H, K), (H, K), (HV, V), (HV, K), None)):
        x = buf[:, at:at + t.shape[-1]]
        views[name] = x if shape is None else x.unflatten(-1, shape)
        at += t.shape[-1]
    return views


@pytest.mark.parametrize("seed", range(STEPS))
def test_decode_forms_are_bitwise_the_glued_step(seed):
    r = random.Random(seed)
    N = r.randint(1, 4)
    verify = r.random() < 0.4
    S = r.randint(1, 3) if verify else 0
    lengths = [r.randint(1, 1 + S) for _ in range(N)] if (verify or r.random() < 0.5) else None
    t = 1 if lengths is None else None
    P = N * (2 + S) + 2
    H = r.choice([1, 2])
    p = make_decode(N=N, t=t or 1, H=H, HV=H * r.choice([1, 2]), K=r.choice([16, 32]), P=P, seqlens=lengths,
                    state_dtype=r.choice([torch.float32, torch.bfloat16]), seed=seed)
    T, HV, V = p["v"].shape
    K = p["q"].shape[-1]
    index_dtype = r.choice([torch.int32, torch.int64])
    free = list(range(P))
    r.shuffle(free)
    cols = 1 + S
    idx = torch.tensor([[free.pop() if (c > 0 or r.random() < 0.85) else -1 for c in range(cols)]
                        for _ in range(N)], dtype=index_dtype)
    if verify:
        acc = torch.tensor([r.randint(1, cols) for _ in range(N)], dtype=index_dtype)
        for n in range(N):  # a row that starts from a slot must have one there
            if idx[n, int(acc[n]) - 1] < 0:
                idx[n, int(acc[n]) - 1] = free.pop()
    else:
        acc = None
    table = torch.full((N, cols + 2), 99, dtype=index_dtype)
    table[:, :cols] = idx
    idx_view = table[:, :cols] if verify else table[:, 0]  # strided, as an engine's block table
    idx_dense = idx if verify else idx[:, 0].contiguous()

    per = HV * V * K
    pad = r.choice([0, 8])
    base = torch.zeros(P, per + pad, dtype=p["pool"].dtype)
    base[:, :per] = p["pool"].reshape(P, per)
    base[:, per:] = 3.0
    pool = base[:, :per].view(P, HV, V, K)
    before = base.clone()
    out_pool = None
    if not verify and r.random() < 0.3:  # verify writes each token's state to its slots
        out_base = torch.full((P, per + pad), 5.0, dtype=p["pool"].dtype)
        out_pool = out_base[:, :per].view(P, HV, V, K)
    per_token = torch.full((T, HV, V, K), 7.0, dtype=p["pool"].dtype) if (not verify and r.random() < 0.3) else None

    views = fused(p, r) if r.random() < 0.6 else {n: p[n] for n in ("q", "k", "v", "g", "beta")}
    kw = dict(scale=p["scale"], lower_bound=p["lower_bound"], num_accepted_tokens=acc)
    if lengths is not None:
        kw["cu_seqlens"] = p["cu_seqlens"].to(r.choice([torch.int32, torch.int64]))
    # A padding entry's out rows are not written: both runs start from the same bytes.
    out = torch.full_like(p["v"], 9.0)
    flash_kda.decode(views["q"], views["k"], views["v"], views["g"], views["beta"], p["A_log"], p["dt_bias"],
                     pool, idx_view, out=out, state_out_pool=out_pool, per_token_states=per_token, **kw)

    # ---- the glued step -------------------------------------------------------------
    glued_pool = before[:, :per].clone().view(P, HV, V, K)
    glued_out_pool = None if out_pool is None else torch.full_like(glued_pool, 5.0)
    glued_tok = None if per_token is None else torch.full_like(per_token, 7.0)
    gkw = dict(kw)
    if lengths is not None:
        gkw["cu_seqlens"] = p["cu_seqlens"]
    glued = torch.full_like(p["v"], 9.0)
    flash_kda.decode(*(p[n].contiguous() for n in ("q", "k", "v", "g", "beta")), p["A_log"], p["dt_bias"],
                     glued_pool, idx_dense, out=glued, state_out_pool=glued_out_pool, per_token_states=glued_tok, **gkw)

    assert torch.equal(out, glued), "out"
    assert torch.equal(base[:, :per].view(P, HV, V, K), glued_pool), "the pool's slots"
    assert torch.equal(base[:, per:], before[:, per:]), "the padding between slots"
    if out_pool is not None:
        assert torch.equal(out_pool, glued_out_pool), "the output pool"
        assert torch.all(out_base[:, per:] == 5.0), "the output pool's padding"
    if per_token is not None:
        assert torch.equal(per_token, glued_tok), "per-token states"
    assert torch.all(table[:, cols:] == 99), "the block table's other columns"
