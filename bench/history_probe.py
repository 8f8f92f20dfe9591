#!/usr/bin/env python3
"""Does a forward row's time depend on what ran before it in the same process?

Times one row of the standard table (default H = 64, 8 x 1024, fp32 state) first
in a fresh process, then after the other standard rows (as bench/compare_fla.py
orders them), then again after emptying torch's cache, and with a caller-given
workspace, each with both of compare_fla.py's timers: triton's do_bench (clears
L2 before every launch) and CUDA events over back-to-back launches. --fla also
runs fla's chunk_kda on every other row (its autotuning and its allocations), as
compare_fla.py does, and times the row again after each.

  python3 bench/history_probe.py [--heads 64] [--case 8x1024] [--fla] [--iters 100]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_fla as cf  # noqa: E402  (sets FLA_FLASH_KDA=0 before fla is imported)
import torch  # noqa: E402

import flash_kda  # noqa: E402


def with_workspace(x, state_dtype):
    """ours() with a workspace made once, outside the timed calls."""
    out = torch.empty_like(x["v"])
    fs = torch.empty(x["N"], *x["v"].shape[2:], x["q"].shape[3], dtype=state_dtype, device="cuda")
    kw = dict(A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=-5.0, initial_state=x["s0"], final_state=fs,
              cu_seqlens=x["cu"])
    nbytes = flash_kda.workspace_size(x["q"], x["k"], x["v"], x["g"], x["beta"], x["scale"], out, **kw)
    ws = torch.empty(nbytes + 255, dtype=torch.uint8, device="cuda")

    def run():
        flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], x["scale"], out, workspace=ws, **kw)

    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--case", default="8x1024")
    ap.add_argument("--fla", action="store_true", help="also run fla's chunk_kda on the other rows")
    ap.add_argument("--iters", type=int, default=100)
    args = ap.parse_args()
    state = torch.float32
    chunk_kda = None
    if args.fla:
        from fla.ops.kda import chunk_kda
    rows = []

    def measure(label, fn):
        t_bench = cf.median_ms(fn, args.iters)
        t_events = cf.events_ms(fn, args.iters)
        rows.append((label, t_bench, t_events))
        cf.log(f"{label}: do_bench {t_bench:.3f} ms, events {t_events:.3f} ms")

    with torch.inference_mode():
        target = cf.make_inputs(cf.CASES[args.case], args.heads, state)
        name = f"{args.heads}/{args.case}"
        measure(f"{name}, first in the process", cf.ours(target, state))
        for H in (96, 64):
            for case in ("8192", "varlen6", "8x1024"):
                if (H, case) == (args.heads, args.case):
                    continue
                x = cf.make_inputs(cf.CASES[case], H, state)
                measure(f"  {H}/{case}", cf.ours(x, state))
                if chunk_kda is not None:
                    f = cf.fla_fn(chunk_kda, x, state)
                    f()
                    torch.cuda.synchronize()
                    measure(f"  {H}/{case} fla", f)
                    del f
                    measure(f"{name}, right after fla's {H}/{case}", cf.ours(target, state))
                del x
        measure(f"{name}, after the other rows", cf.ours(target, state))
        measure(f"{name}, after, caller's workspace", with_workspace(target, state))
        torch.cuda.empty_cache()
        measure(f"{name}, after, torch cache emptied", cf.ours(target, state))
        fresh = cf.make_inputs(cf.CASES[args.case], args.heads, state)
        measure(f"{name}, after, new input tensors", cf.ours(fresh, state))
    print("| run | do_bench (L2 cleared) ms | CUDA events ms |")
    print("|---|---|---|")
    for label, a, b in rows:
        print(f"| {label} | {a:.3f} | {b:.3f} |")


if __name__ == "__main__":
    main()
