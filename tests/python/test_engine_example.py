"""The README's engine-style example, run as written (CPU tensors): a state pool,
chunked prefill with checkpoints every 64 tokens, then decode steps on the same pool.
It checks that the pieces agree with one straight forward over all the tokens."""
from __future__ import annotations

import torch

import flash_kda
from kda_reference import make_problem


def test_engine_example_matches_one_straight_run():
    H, K = 2, 32
    # Two requests of 200 prompt tokens (+ 3 generated) each, packed varlen.
    p = make_problem(B=1, H=H, K=K, seqlens=[203, 203], seed=31)
    q, k, v, g, beta = (p[n][0] for n in ("q", "k", "v", "g", "beta"))  # [T, ...] per token
    A_log, dt_bias = p["A_log"], p["dt_bias"]
    starts = [0, 203]

    # ---- the example -------------------------------------------------------------
    pool = torch.zeros(8, H, K, K)                      # [P, HV, V, K] fp32 slots
    slots = torch.tensor([5, 2], dtype=torch.int32)     # request -> slot
    ckpt = torch.empty(2 * 2, H, K, K, dtype=torch.bfloat16)  # [V, K] states after 0 and 64 tokens

    def take(x, spans):                                 # the engine's packed batch
        return torch.cat([x[a:b] for a, b in spans])[None]

    for lo, hi in ((0, 128), (128, 200)):               # chunked prefill: two chunks
        spans = [(s + lo, s + hi) for s in starts]
        cu = torch.tensor([0, hi - lo, 2 * (hi - lo)], dtype=torch.int32)
        out = torch.empty(1, 2 * (hi - lo), H, K, dtype=torch.bfloat16)
        extra = {}
        if lo == 0:                                      # checkpoints of the first chunk: tokens 0 and 64
            extra = dict(checkpoints=ckpt[:4], checkpoint_interval=64, checkpoints_value_major=True)
        flash_kda.fwd(take(q, spans), take(k, spans), take(v, spans), take(g, spans), take(beta, spans),
                      None, out, A_log=A_log, dt_bias=dt_bias, cu_seqlens=cu,
                      state_pool=pool, state_indices=slots,
                      has_initial_state=torch.tensor([lo > 0, lo > 0]), **extra)
    for step in range(3):                                # decode: one token per request
        t = [s + 200 + step for s in starts]
        dec = flash_kda.decode(q[t], k[t], v[t], g[t], beta[t], A_log, dt_bias, pool, slots)
    # ---- end of the example ----------------------------------------------------------

    # One straight forward over each whole request from zero.
    ref_out = torch.empty_like(p["v"])
    ref_fin = torch.empty(2, H, K, K)
    flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], None, ref_out, A_log=A_log, dt_bias=dt_bias,
                  cu_seqlens=p["cu_seqlens"], final_state=ref_fin, backend="reference")
    for n, s in enumerate(slots.tolist()):
        rel = (pool[s].double() - ref_fin[n].double()).norm() / ref_fin[n].double().norm()
        assert rel < 1e-5, f"request {n}: pool slot vs straight run {rel:.2e}"
    last = torch.stack([ref_out[0, s + 202] for s in starts]).float()
    assert ((dec.float() - last).norm() / last.norm()) < 1e-2
    # Checkpoint 1 of request 0 (after 64 tokens) against a 64-token run.
    fin64 = torch.empty(1, H, K, K)
    flash_kda.fwd(p["q"][:, :64], p["k"][:, :64], p["v"][:, :64], p["g"][:, :64], p["beta"][:, :64], None,
                  torch.empty_like(p["v"][:, :64]), A_log=A_log, dt_bias=dt_bias, final_state=fin64)
    assert torch.equal(ckpt[1].float(), fin64[0].bfloat16().float())
