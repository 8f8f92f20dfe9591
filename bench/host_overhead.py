#!/usr/bin/env python3
"""Host overhead of one flash_kda call on CUDA tensors: host wall time per call,
with the GPU idle.

The shapes are the ones where the GPU work is a few microseconds, so what a call
costs is the host's part (argument checks, the workspace allocation, the launches):
  fwd     B = 1, T = 16, H = 1, K = V = 128, fp32 initial and final state
  decode  N = 1 sequence, one token, H = 32, K = V = 128, fp32 pool, out given

Per call: torch.cuda.synchronize() (the GPU idle, the launch queue empty), then
time.perf_counter_ns() around the one call; the table gives the median and the
10th / 90th percentiles over --calls calls, after --warmup calls. "back to back"
is the mean of --calls calls issued without a sync in between, which is what a
launch-bound loop sees: it is the larger of the host time and the GPU time per
call ("GPU" column, CUDA events around the same loop).

Rows:
  fwd                   flash_kda.fwd; torch tensors read through their attributes (the default)
  fwd, DLPack           the same call with every tensor exported through DLPack
                        (flash_kda._set_torch_fast_path(False)), as any non-torch array is
  fwd, workspace=       a preallocated workspace: no allocation in the call
  kda_forward           the custom op (allocates out and final_state)
  decode / decode, DLPack
and, to read the rows against, their parts: workspace_size(...) (reading and
checking the arguments, no launch), torch.empty of the workspace, and the stream
lookup.

  python3 bench/host_overhead.py [--calls 2000] [--warmup 200] [--md FILE] [--json FILE]

Exits 0 with a message, measuring nothing, when there is no CUDA device or the
flash_kda CUDA backend cannot run here.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

TARGET_US = 20.0  # the project's goal for fwd at T = 16, H = 1 (issue 4)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--md", default=None, help="also write the markdown table here")
    ap.add_argument("--json", default=None, help="also write the rows as JSON here")
    args = ap.parse_args()

    try:
        import torch
    except ImportError:
        print("host_overhead: torch is not installed; nothing measured", file=sys.stderr)
        return 0
    if not torch.cuda.is_available():
        print("host_overhead: no CUDA device (torch.cuda.is_available() is False); nothing measured",
              file=sys.stderr)
        return 0
    import flash_kda

    ok, why = flash_kda.cuda_status()
    if not ok:
        print(f"host_overhead: flash_kda CUDA backend unavailable ({why}); nothing measured", file=sys.stderr)
        return 0

    sync = torch.cuda.synchronize
    clock = time.perf_counter_ns

    def measure(fn):
        for _ in range(args.warmup):
            fn()
        sync()
        samples = []
        for _ in range(args.calls):
            sync()
            t0 = clock()
            fn()
            samples.append(clock() - t0)
        sync()
        samples.sort()
        n = len(samples)
        # Back to back, with CUDA events around the same loop for the GPU's time.
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = clock()
        for _ in range(args.calls):
            fn()
        t1 = clock()
        end.record()
        end.synchronize()
        return dict(median=statistics.median(samples) / 1e3, p10=samples[n // 10] / 1e3,
                    p90=samples[(9 * n) // 10] / 1e3, back_to_back=(t1 - t0) / args.calls / 1e3,
                    gpu=start.elapsed_time(end) * 1e3 / args.calls)

    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=dev).manual_seed(0)

    def randn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=gen, device=dev).to(dtype)

    # ---- fwd: B = 1, T = 16, H = 1 ------------------------------------------------
    T, H, K = 16, 1, 128
    q, k, v, g = (randn(1, T, H, K) for _ in range(4))
    beta = randn(1, T, H)
    A_log = torch.rand(H, generator=gen, device=dev)
    dt_bias = torch.rand(H, K, generator=gen, device=dev)
    s0 = 0.1 * randn(1, H, K, K, dtype=torch.float32)
    out, s1 = torch.empty_like(v), torch.empty_like(s0)
    fwd_kw = dict(A_log=A_log, dt_bias=dt_bias, lower_bound=-5.0, initial_state=s0, final_state=s1,
                  cu_seqlens=None)
    ws_bytes = flash_kda.workspace_size(q, k, v, g, beta, K ** -0.5, out, **fwd_kw)
    workspace = torch.empty(ws_bytes + 255, dtype=torch.uint8, device=dev)

    def fwd():
        flash_kda.fwd(q, k, v, g, beta, K ** -0.5, out, **fwd_kw)

    def fwd_workspace():
        flash_kda.fwd(q, k, v, g, beta, K ** -0.5, out, workspace=workspace, **fwd_kw)

    def kda_forward():
        flash_kda.kda_forward(q, k, v, g, beta, A_log, dt_bias, initial_state=s0, output_final_state=True)

    def workspace_size():
        flash_kda.workspace_size(q, k, v, g, beta, K ** -0.5, out, **fwd_kw)

    def alloc():
        torch.empty(ws_bytes + 255, dtype=torch.uint8, device=dev)

    def stream():
        torch.cuda.current_stream(dev).cuda_stream

    # ---- decode: N = 1, H = 32, one token ------------------------------------------
    DH = 32
    dq, dk, dv, dg = (randn(1, DH, K) for _ in range(4))
    dbeta = randn(1, DH)
    dA_log = torch.rand(DH, generator=gen, device=dev)
    ddt_bias = torch.rand(DH, K, generator=gen, device=dev)
    pool = 0.1 * randn(1, DH, K, K, dtype=torch.float32)
    indices = torch.zeros(1, dtype=torch.int32, device=dev)
    dout = torch.empty_like(dv)

    def decode():
        flash_kda.decode(dq, dk, dv, dg, dbeta, dA_log, ddt_bias, pool, indices, out=dout)

    rows = [
        ("fwd", "T=16 H=1", fwd, True),
        ("fwd, DLPack", "T=16 H=1", fwd, False),
        ("fwd, workspace=", "T=16 H=1", fwd_workspace, True),
        ("kda_forward", "T=16 H=1", kda_forward, True),
        ("decode", "N=1 H=32", decode, True),
        ("decode, DLPack", "N=1 H=32", decode, False),
        ("part: workspace_size(...)", "T=16 H=1", workspace_size, True),
        ("part: workspace_size(...), DLPack", "T=16 H=1", workspace_size, False),
        (f"part: torch.empty({ws_bytes + 255} B)", "", alloc, True),
        ("part: torch.cuda.current_stream().cuda_stream", "", stream, True),
    ]
    results = []
    previous = flash_kda._set_torch_fast_path(True)
    try:
        for name, shape, fn, fast in rows:
            flash_kda._set_torch_fast_path(fast)
            r = measure(fn)
            r.update(name=name, shape=shape)
            results.append(r)
            print(f"{name:48s} {shape:9s} median {r['median']:7.2f} us  (p10 {r['p10']:.2f}, p90 {r['p90']:.2f})  "
                  f"back to back {r['back_to_back']:.2f} us, GPU {r['gpu']:.2f} us", file=sys.stderr, flush=True)
    finally:
        flash_kda._set_torch_fast_path(previous)

    lines = [
        f"Host time per call, µs, GPU idle ({torch.cuda.get_device_name(dev)}, torch {torch.__version__}, "
        f"flash_kda {flash_kda.__version__}, {args.calls} calls; target for fwd: < {TARGET_US:.0f} µs)",
        "",
        "| call | shape | median | p10 | p90 | back to back | GPU per call |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {r['name']} | {r['shape']} | {r['median']:.2f} | {r['p10']:.2f} | {r['p90']:.2f} | "
                     f"{r['back_to_back']:.2f} | {r['gpu']:.2f} |")
    table = "\n".join(lines)
    print(table)
    if args.md:
        with open(args.md, "w") as f:
            f.write(table + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
