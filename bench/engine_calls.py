#!/usr/bin/env python3
"""What a serving engine's call costs with flash_kda's native arguments against the
glue it needs without them (spec section 7): one row per engine call, median µs of
each form on the same inputs, and the µs saved.

  prefill on a state pool   glue: gather the slots into a dense initial state, fwd,
                            scatter the final states back; native: fwd(state_pool=,
                            state_indices=, has_initial_state=)
  int32 cu_seqlens          glue: cu_seqlens.to(int64), fwd; native: int32 as given
  fused projection views    glue: .contiguous() of q, k, v, g, beta sliced from one
                            [T, width] projection, fwd; native: fwd on the views
  checkpoints every 64      glue: fla's Triton chunk_kda with
                            return_intermediate_states (the fallback engines use);
                            native: fwd(checkpoints=, checkpoint_interval=64)
  slot checkpoints          glue: checkpoints every 16 tokens into scratch, then a copy
                            of the wanted ones into their slots; native:
                            fwd(slot_checkpoint_offsets=, slot_checkpoint_slots=)
  decode, int32 cu_seqlens  glue: cu_seqlens.to(int64), decode; native: int32 as given
  decode on fused views     glue: .contiguous() of q, k, v, g, beta sliced from one
                            [N, width] projection, decode; native: decode on the views
  speculative verify        glue: fla's Triton fused_recurrent_kda in its serving form
                            (ssm_state_indices [N, 1 + S], num_accepted_tokens, in place;
                            the fallback without a native verify); native: decode with
                            2-D state_indices and num_accepted_tokens
  fla's chunk_kda call      glue: fla's Triton chunk_kda; native: flash_kda.chunk_kda,
                            the same arguments (one import changed)
  head dim 64               glue: fla's Triton chunk_kda at K = V = 64 (FlashKDA has no
                            head dim 64); native: fwd at K = V = 64

Shape: --seqs sequences of --tokens tokens (default 8 x 1024), --heads value heads
(default 32), K = V = 128 (the head-dim-64 row: 64), fp32 states; decode and verify:
--seqs sequences of one token (verify: 1 + --draft tokens).
Each form: --warmup calls, then --iters calls with CUDA events around each (the
glue's own kernels included), median. Exits 0 with a message when no CUDA device or
no usable CUDA backend is present.

  python3 bench/engine_calls.py [--seqs 8] [--tokens 1024] [--heads 32] [--iters 50] [--md FILE]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

os.environ.setdefault("FLA_FLASH_KDA", "0")  # fla's own Triton path for the fallback row

import torch

import flash_kda

K = V = 128
K64 = 64


def timed(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for _ in range(iters):
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        ms.append(e0.elapsed_time(e1))
    return statistics.median(ms) * 1e3  # µs


def problem(N, L, HV, D=K):
    dev = "cuda"
    T = N * L
    gen = torch.Generator(device=dev).manual_seed(0)

    def normal(*shape):
        return torch.randn(*shape, generator=gen, device=dev)

    q = torch.nn.functional.normalize(normal(1, T, HV, D), dim=-1).bfloat16()
    k = torch.nn.functional.normalize(normal(1, T, HV, D), dim=-1).bfloat16()
    return dict(q=q, k=k, v=normal(1, T, HV, D).bfloat16(), g=normal(1, T, HV, D).bfloat16(),
                beta=normal(1, T, HV).bfloat16(), A_log=torch.rand(HV, device=dev),
                dt_bias=torch.rand(HV, D, device=dev), scale=D ** -0.5, lower_bound=-5.0,
                cu=torch.arange(0, T + 1, L, dtype=torch.int64, device=dev))


def fla_chunk_kda_call(p, s0, **extra):
    """fla's Triton chunk_kda on problem p with fla's [N, HV, K, V] initial state s0
    (or None when fla is not importable: the row then has no glue column)."""
    try:
        from fla.ops.kda import chunk_kda as fla_chunk_kda
    except Exception as e:  # fla missing or broken: the row says so
        print(f"  fla not importable ({type(e).__name__}: {e}): no fallback column", file=sys.stderr)
        return None

    def call():
        with torch.inference_mode():
            fla_chunk_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], scale=p["scale"], initial_state=s0,
                          output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                          use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=p["lower_bound"],
                          cu_seqlens=p["cu"], A_log=p["A_log"], dt_bias=p["dt_bias"].reshape(-1), **extra)
    return call


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--draft", type=int, default=3, help="speculative verify: draft tokens a sequence")
    ap.add_argument("--md", default=None)
    a = ap.parse_args()
    ok, why = flash_kda.cuda_status()
    if not torch.cuda.is_available() or not ok:
        print(f"engine_calls: nothing measured ({why if not ok else 'no CUDA device'})")
        return 0
    N, L, HV = a.seqs, a.tokens, a.heads
    p = problem(N, L, HV)
    T = N * L
    common = dict(A_log=p["A_log"], dt_bias=p["dt_bias"], lower_bound=p["lower_bound"])
    out = torch.empty_like(p["v"])
    rows = []

    def row(name, glue, native):
        g = timed(glue, a.warmup, a.iters) if glue else None
        n = timed(native, a.warmup, a.iters)
        rows.append((name, g, n))
        print(f"  {name}: glue {g if g is None else round(g, 1)} µs, native {n:.1f} µs", file=sys.stderr, flush=True)

    # 1. Prefill on a state pool.
    P = 4 * N
    pool = 0.1 * torch.randn(P, HV, V, K, device="cuda")
    idx = torch.arange(0, 2 * N, 2, dtype=torch.int32, device="cuda")
    has = torch.ones(N, dtype=torch.bool, device="cuda")
    fin = torch.empty(N, HV, V, K, device="cuda")

    def pool_glue():
        init = pool.index_select(0, idx.long()) * has.view(-1, 1, 1, 1)
        flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, initial_state=init,
                      final_state=fin, cu_seqlens=p["cu"], **common)
        pool.index_copy_(0, idx.long(), fin)

    def pool_native():
        flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, state_pool=pool, state_indices=idx,
                      has_initial_state=has, cu_seqlens=p["cu"], **common)

    row("prefill on a state pool", pool_glue, pool_native)

    # 2. int32 cu_seqlens.
    cu32 = p["cu"].to(torch.int32)
    init = 0.1 * torch.randn(N, HV, V, K, device="cuda")

    def cu_glue():
        flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, initial_state=init,
                      final_state=fin, cu_seqlens=cu32.to(torch.int64), **common)

    def cu_native():
        flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, initial_state=init,
                      final_state=fin, cu_seqlens=cu32, **common)

    row("int32 cu_seqlens", cu_glue, cu_native)

    # 3. q, k, v, g, beta as views of one fused projection.
    widths = [HV * K, HV * K, HV * V, HV * K, HV]
    width = (sum(widths) + 7) // 8 * 8
    fused = torch.randn(T, width, device="cuda").bfloat16()
    views, at = [], 0
    for name, w in zip(["q", "k", "v", "g", "beta"], widths):
        view = fused[:, at:at + w]
        views.append(view.unsqueeze(0) if name == "beta" else view.unflatten(-1, (-1, 128)).unsqueeze(0))
        at += w

    def views_glue():
        dense = [x.contiguous() for x in views]
        flash_kda.fwd(*dense, p["scale"], out, initial_state=init, final_state=fin, cu_seqlens=p["cu"], **common)

    def views_native():
        flash_kda.fwd(*views, p["scale"], out, initial_state=init, final_state=fin, cu_seqlens=p["cu"], **common)

    row("fused projection views", views_glue, views_native)

    # 4. Checkpoints every 64 tokens (bf16, key-major: fla's h).
    entries = N * ((L + 63) // 64)
    ck = torch.empty(entries, HV, K, V, dtype=torch.bfloat16, device="cuda")

    def ck_native():
        flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, initial_state=init,
                      final_state=fin, cu_seqlens=p["cu"], checkpoints=ck, checkpoint_interval=64, **common)

    s0 = init.transpose(-1, -2).contiguous()  # fla's [N, HV, K, V]
    row("checkpoints every 64 (fallback: fla chunk_kda)",
        fla_chunk_kda_call(p, s0, return_intermediate_states=True), ck_native)

    # 5. Slot checkpoints (vLLM's align mode): two offsets per sequence.
    offsets = torch.tensor([[L // 2 // 16 * 16, L // 16 * 16]] * N, dtype=torch.int64, device="cuda")
    ck_slots = torch.arange(1, 4 * N, 2, dtype=torch.int32, device="cuda")[:2 * N].view(N, 2)
    every16 = torch.empty(N * ((L + 15) // 16), HV, V, K, device="cuda")
    first16 = torch.arange(N, device="cuda") * ((L + 15) // 16)
    pick = torch.stack([first16 + offsets[:, 0] // 16], 1)

    def slot_glue():
        flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, state_pool=pool, state_indices=idx,
                      cu_seqlens=p["cu"], checkpoints=every16, checkpoint_interval=16, checkpoints_value_major=True,
                      **common)
        pool.index_copy_(0, ck_slots[:, 0].long(), every16.index_select(0, pick[:, 0]))
        # The offset == L one is the final state, which the call left in the sequence's own slot.
        pool.index_copy_(0, ck_slots[:, 1].long(), pool.index_select(0, idx.long()))

    def slot_native():
        flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, state_pool=pool, state_indices=idx,
                      cu_seqlens=p["cu"], slot_checkpoint_offsets=offsets, slot_checkpoint_slots=ck_slots, **common)

    row("slot checkpoints", slot_glue, slot_native)

    # 6. A decode step with int32 cu_seqlens (one token a sequence, states in the pool).
    dq, dk = (torch.nn.functional.normalize(torch.randn(N, HV, K, device="cuda"), dim=-1).bfloat16() for _ in "qk")
    dv, dg = torch.randn(N, HV, V, device="cuda").bfloat16(), torch.randn(N, HV, K, device="cuda").bfloat16()
    dbeta = torch.randn(N, HV, device="cuda").bfloat16()
    dout = torch.empty_like(dv)
    dcu32 = torch.arange(0, N + 1, dtype=torch.int32, device="cuda")

    def decode_call(cu):
        flash_kda.decode(dq, dk, dv, dg, dbeta, p["A_log"], p["dt_bias"], pool, idx, out=dout, cu_seqlens=cu,
                         scale=p["scale"], lower_bound=p["lower_bound"])

    row("decode step, int32 cu_seqlens", lambda: decode_call(dcu32.to(torch.int64)), lambda: decode_call(dcu32))

    # 7. A decode step on views of one fused projection [N, width].
    dwidths = [HV * K, HV * K, HV * V, HV * K, HV]
    dfused = torch.randn(N, (sum(dwidths) + 7) // 8 * 8, device="cuda").bfloat16()
    dviews, at = [], 0
    for name, w in zip(["q", "k", "v", "g", "beta"], dwidths):
        view = dfused[:, at:at + w]
        dviews.append(view if name == "beta" else view.unflatten(-1, (HV, -1)))
        at += w

    def dviews_call(xs):
        flash_kda.decode(*xs, p["A_log"], p["dt_bias"], pool, idx, out=dout, cu_seqlens=dcu32, scale=p["scale"],
                         lower_bound=p["lower_bound"])

    row("decode step on fused projection views", lambda: dviews_call([x.contiguous() for x in dviews]),
        lambda: dviews_call(dviews))

    # 8. Speculative verify: 1 + S tokens a sequence, a slot per token, num_accepted_tokens.
    S1 = 1 + a.draft
    vq, vk = (torch.nn.functional.normalize(torch.randn(N * S1, HV, K, device="cuda"), dim=-1).bfloat16()
              for _ in "qk")
    vv, vg = torch.randn(N * S1, HV, V, device="cuda").bfloat16(), torch.randn(N * S1, HV, K, device="cuda").bfloat16()
    vbeta = torch.randn(N * S1, HV, device="cuda").bfloat16()
    vout = torch.empty_like(vv)
    vpool = 0.1 * torch.randn(N * S1, HV, V, K, device="cuda")
    vidx = torch.arange(N * S1, dtype=torch.int32, device="cuda").view(N, S1)
    vacc = (torch.arange(N, dtype=torch.int32, device="cuda") % S1) + 1
    vcu = torch.arange(0, N * S1 + 1, S1, dtype=torch.int32, device="cuda")

    def verify_native():
        flash_kda.decode(vq, vk, vv, vg, vbeta, p["A_log"], p["dt_bias"], vpool, vidx, out=vout, cu_seqlens=vcu,
                         scale=p["scale"], lower_bound=p["lower_bound"], num_accepted_tokens=vacc)

    verify_glue = None
    try:
        from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

        vout4, vcu64 = vout.unsqueeze(0), vcu.to(torch.int64)
        verify_glue = lambda: fused_recurrent_kda_fwd(  # noqa: E731
            q=vq[None], k=vk[None], v=vv[None], g=vg[None], beta=vbeta[None], A_log=p["A_log"],
            dt_bias=p["dt_bias"].reshape(-1), initial_state=vpool, scale=p["scale"], inplace_final_state=True,
            state_v_first=True, cu_seqlens=vcu64, ssm_state_indices=vidx, num_accepted_tokens=vacc,
            use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
            lower_bound=p["lower_bound"], out=vout4)
    except Exception as e:  # fla missing or broken: the row says so
        print(f"  fla not importable ({type(e).__name__}: {e}): no fallback column for verify", file=sys.stderr)
    row(f"speculative verify, {a.draft} draft tokens (fallback: fla fused_recurrent_kda)", verify_glue,
        verify_native)

    # 9. fla's chunk_kda call site with one import changed.
    def fla_style_native():
        flash_kda.chunk_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], scale=p["scale"], initial_state=s0,
                            output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                            use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=p["lower_bound"],
                            cu_seqlens=p["cu"], A_log=p["A_log"], dt_bias=p["dt_bias"].reshape(-1))

    row("fla's chunk_kda call, one import changed (fallback: fla chunk_kda)", fla_chunk_kda_call(p, s0),
        fla_style_native)

    # 10. Head dim 64: FlashKDA has none, so the fallback is fla's Triton kernel.
    p64 = problem(N, L, HV, K64)
    out64 = torch.empty_like(p64["v"])
    init64 = 0.1 * torch.randn(N, HV, K64, K64, device="cuda")
    fin64 = torch.empty_like(init64)

    def hd64_native():
        flash_kda.fwd(p64["q"], p64["k"], p64["v"], p64["g"], p64["beta"], p64["scale"], out64, initial_state=init64,
                      final_state=fin64, cu_seqlens=p64["cu"], A_log=p64["A_log"], dt_bias=p64["dt_bias"],
                      lower_bound=p64["lower_bound"])

    row("prefill at head dim 64 (fallback: fla chunk_kda)",
        fla_chunk_kda_call(p64, init64.transpose(-1, -2).contiguous()), hd64_native)

    head = (f"Engine calls, median µs of {a.iters} after {a.warmup} warm-up ({torch.cuda.get_device_name()}, "
            f"{N} x {L} tokens, HV = {HV}, K = V = 128 unless noted, fp32 states; decode: {N} x 1 token, "
            f"verify: {N} x {1 + a.draft})\n\n"
            "| engine call | with glue | native | saved |\n|---|---|---|---|\n")
    lines = []
    for name, g, n in rows:
        gs = "-" if g is None else f"{g:.1f}"
        saved = "-" if g is None else f"{g - n:.1f}"
        lines.append(f"| {name} | {gs} | {n:.1f} | {saved} |")
    text = head + "\n".join(lines) + "\n"
    print(text)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
