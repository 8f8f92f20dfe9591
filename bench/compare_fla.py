#!/usr/bin/env python3
"""flash_kda.fwd against fla's Triton chunk_kda, same process, same inputs.

The spec's standard table: total T = 8192, K = V = 128, H in {96, 64}; cases
  8192      one sequence of 8192 tokens
  varlen6   varlen [1300, 547, 2048, 963, 271, 3063]
  8x1024    varlen 8 x 1024
with an fp32 initial and final state (--state bf16|none for the others).
Inputs follow the spec's accuracy distribution. Times are medians in ms
(triton.testing.do_bench, which clears L2 between launches, when triton is
importable; else CUDA events over --iters launches after warm-up). fla's Triton
kernels autotune on their first call per shape, so each shape is warmed once
before it is timed.

FLA_FLASH_KDA=0 is set before fla is imported, so chunk_kda runs fla's own
Triton path rather than dispatching back to flash_kda.

  python3 bench/compare_fla.py [--heads 96,64] [--cases 8192,varlen6,8x1024]
                               [--state fp32] [--png out.png] [--md out.md]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

os.environ["FLA_FLASH_KDA"] = "0"  # before fla is imported: fla's own Triton path

import torch  # noqa: E402

import flash_kda  # noqa: E402

CASES = {
    "8192": [8192],
    "varlen6": [1300, 547, 2048, 963, 271, 3063],
    "8x1024": [1024] * 8,
}
STATES = {"fp32": torch.float32, "bf16": torch.bfloat16, "none": None}


def make_inputs(seqlens, H, state_dtype, K=128, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    T, N = sum(seqlens), len(seqlens)
    dev = "cuda"

    def normal(*shape):
        return torch.randn(*shape, generator=g, device=dev, dtype=torch.float32)

    def l2n(x):
        return x / x.norm(dim=-1, keepdim=True)

    x = dict(
        q=l2n(normal(1, T, H, K)).bfloat16(),
        k=l2n(normal(1, T, H, K)).bfloat16(),
        v=normal(1, T, H, K).bfloat16(),
        g=normal(1, T, H, K).bfloat16(),
        beta=normal(1, T, H).bfloat16(),
        A_log=torch.rand(H, generator=g, device=dev),
        dt_bias=torch.rand(H, K, generator=g, device=dev),
        s0=None if state_dtype is None else (0.1 * normal(N, H, K, K)).to(state_dtype),
        # A single sequence goes through the batched (B = 1, no cu_seqlens) path, as fla's layer does.
        cu=None if N == 1 else torch.tensor([0] + seqlens, device=dev).cumsum(0),
        scale=K ** -0.5,
        N=N,
    )
    return x


def ours(x, state_dtype):
    out = torch.empty_like(x["v"])
    fs = None
    if state_dtype is not None:
        fs = torch.empty(x["N"], *x["v"].shape[2:], x["q"].shape[3], dtype=state_dtype, device="cuda")

    def run():
        flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], x["scale"], out, A_log=x["A_log"],
                      dt_bias=x["dt_bias"], lower_bound=-5.0, initial_state=x["s0"], final_state=fs,
                      cu_seqlens=x["cu"])
        return out, fs

    return run


def fla_fn(chunk_kda, x, state_dtype):
    s0 = x["s0"].float() if x["s0"] is not None else None  # fla's Triton path takes fp32 states only

    def run():
        return chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=x["scale"], initial_state=s0,
                         output_final_state=state_dtype is not None, use_qk_l2norm_in_kernel=True,
                         use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, safe_gate=True,
                         lower_bound=-5.0, state_v_first=True, cu_seqlens=x["cu"], A_log=x["A_log"],
                         dt_bias=x["dt_bias"].reshape(-1))

    return run


def median_ms(fn, iters):
    try:
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=25, rep=max(100, iters), return_mode="median"))
    except ImportError:
        pass
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def rel(a, b):
    a, b = a.double(), b.double()
    return (torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b)).item()


def io_floor_ms(T, H, K=128, bw=4.25e12):
    # Spec section 5: q, k, v, g read and out written (bf16), at the measured copy bandwidth.
    return 5 * T * H * K * 2 / bw * 1e3


def markdown(rows, state):
    lines = [
        f"KDA forward, {torch.cuda.get_device_name()}, K = V = 128, {state} state, median ms "
        f"(flash_kda {flash_kda.__version__}; fla Triton with FLA_FLASH_KDA=0)",
        "",
        "| H | case | flash_kda | fla chunk_kda | ratio (ours / fla) | IO floor | rel diff out | rel diff state |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['H']} | {r['case']} | {r['ours']:.3f} | {r['fla']:.3f} | {r['ours'] / r['fla']:.2f} | "
                     f"{r['floor']:.3f} | {r['d_out']:.2e} | {r['d_state']:.2e} |")
    return "\n".join(lines)


def plot(rows, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # missing, or built against another numpy
        print(f"matplotlib not importable ({type(e).__name__}: {e}): no PNG written to {path}", file=sys.stderr)
        return False
    labels = [f"H={r['H']}\n{r['case']}" for r in rows]
    xs = range(len(rows))
    w = 0.38
    fig, ax = plt.subplots(figsize=(max(6, 1.5 * len(rows)), 4.2))
    b1 = ax.bar([i - w / 2 for i in xs], [r["ours"] for r in rows], w, label="flash_kda.fwd")
    ax.bar([i + w / 2 for i in xs], [r["fla"] for r in rows], w, label="fla chunk_kda (Triton)")
    for bar, r in zip(b1, rows):
        ax.annotate(f"{r['ours'] / r['fla']:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("median ms")
    ax.set_title(f"KDA forward, K=V=128, T=8192 total, {rows[0]['state']} state ({torch.cuda.get_device_name()})",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", default="96,64")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--state", default="fp32", choices=list(STATES))
    ap.add_argument("--iters", type=int, default=100, help="CUDA-event iterations (without triton)")
    ap.add_argument("--png", default=None, help="write a bar chart here (needs matplotlib)")
    ap.add_argument("--md", default=None, help="also write the markdown table here")
    ap.add_argument("--no-fla", action="store_true", help="time flash_kda only")
    args = ap.parse_args()

    if not torch.cuda.is_available():
        sys.exit("compare_fla: no CUDA device")
    ok, why = flash_kda.cuda_status()
    if not ok:
        sys.exit(f"compare_fla: flash_kda CUDA backend unavailable: {why}")
    chunk_kda = None
    if not args.no_fla:
        try:
            from fla.ops.kda import chunk_kda
        except Exception as e:
            sys.exit(f"compare_fla: fla not importable ({type(e).__name__}: {e}); use --no-fla")

    state_dtype = STATES[args.state]
    heads = [int(h) for h in args.heads.split(",") if h]
    cases = [c for c in args.cases.split(",") if c]
    for c in cases:
        if c not in CASES:
            sys.exit(f"compare_fla: unknown case {c!r} (known: {', '.join(CASES)})")

    rows = []
    with torch.inference_mode():
        for H in heads:
            for case in cases:
                seqlens = CASES[case]
                x = make_inputs(seqlens, H, state_dtype)
                f_ours = ours(x, state_dtype)
                o_ours, s_ours = f_ours()
                t_ours = median_ms(f_ours, args.iters)
                row = dict(H=H, case=case, state=args.state, ours=t_ours, fla=float("nan"), d_out=float("nan"),
                           d_state=float("nan"), floor=io_floor_ms(sum(seqlens), H))
                if chunk_kda is not None:
                    f_fla = fla_fn(chunk_kda, x, state_dtype)
                    o_fla, s_fla = f_fla()  # warm-up: autotunes on the first call of a shape
                    torch.cuda.synchronize()
                    row["fla"] = median_ms(f_fla, args.iters)
                    row["d_out"] = rel(o_ours, o_fla)
                    if s_ours is not None:
                        row["d_state"] = rel(s_ours.float(), s_fla.float())
                rows.append(row)
                print(f"H={H:3d} {case:8s} ours {row['ours']:.3f} ms  fla {row['fla']:.3f} ms  "
                      f"ratio {row['ours'] / row['fla']:.2f}  rel diff out {row['d_out']:.2e} "
                      f"state {row['d_state']:.2e}", file=sys.stderr, flush=True)
                if args.md:  # after every row: a partial table survives a time limit
                    with open(args.md, "w") as f:
                        f.write(markdown(rows, args.state) + "\n")
                if args.png:
                    plot(rows, args.png)
                del x

    table = markdown(rows, args.state)
    print(table)
    if args.md:
        with open(args.md, "w") as f:
            f.write(table + "\n")
    if args.png and rows:
        plot(rows, args.png)


if __name__ == "__main__":
    main()
