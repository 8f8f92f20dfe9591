"""Context parallelism on two GPUs against one: flash_kda.distributed.cp_fwd over NCCL.

Run with one process per GPU:

    torchrun --nproc-per-node 2 bench/cp_bench.py [--heads 8,12] [--tokens 1048576] [--fla]

For each H (K = V = 128, fp32 states, one sequence of T tokens from a random initial
state):
- one GPU: flash_kda.fwd over all T tokens on rank 0's GPU (the segment scan's plan);
- two GPUs: cp_fwd, each rank holding T/2 tokens, timed as a whole (barrier to barrier,
  what a caller waits) and step by step with CUDA events: the summaries call, the
  all-gather of the summaries (the only communication), the composition of the
  incoming state, and the resume call;
- the two-GPU result against the one-GPU one: relative RMS differences of out and of
  the final state (both at the level of the kernel's own error, see
  tests/python/test_distributed_gpu.py);
- with --fla: fla's context-parallel chunk_kda (Triton; FLA_FLASH_KDA=0) on the same
  shards, if it runs there.
Medians of --iters runs after --warmup. A benchmark, not a test.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("FLA_FLASH_KDA", "0")  # fla's own Triton path when --fla

import torch
import torch.distributed as dist

import flash_kda
from flash_kda import distributed as cp


def make_inputs(T, H, dev, seed):
    g = torch.Generator(device=dev).manual_seed(seed)
    K = V = 128

    def bf16(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device=dev) * scale).to(torch.bfloat16)

    q, k = bf16(1, T, H, K), bf16(1, T, H, K)
    k = torch.nn.functional.normalize(k.float(), dim=-1).to(torch.bfloat16)
    x = dict(q=q, k=k, v=bf16(1, T, H, V), g=bf16(1, T, H, K), beta=bf16(1, T, H),
             A_log=torch.randn(H, generator=g, device=dev) * 0.5,
             dt_bias=torch.randn(H, K, generator=g, device=dev) * 0.1,
             s0=torch.randn(1, H, V, K, generator=g, device=dev) * 0.1)
    return x


def shard(x, lo, hi):
    return {n: (t[:, lo:hi].contiguous() if n in ("q", "k", "v", "g", "beta") else t) for n, t in x.items()}


def timed(fn, iters, warmup, sync_ranks):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if sync_ranks:
            torch.cuda.synchronize()
            dist.barrier()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if sync_ranks:
            dist.barrier()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def one_gpu(x, T, iters, warmup):
    out = torch.empty_like(x["v"])
    fs = torch.empty_like(x["s0"])
    cu = torch.tensor([0, T], dtype=torch.int64, device=x["q"].device)
    args = dict(A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=-5.0, initial_state=x["s0"], final_state=fs,
                cu_seqlens=cu, cu_seqlens_host=cu.cpu())
    ws = torch.empty(flash_kda.workspace_size(x["q"], x["k"], x["v"], x["g"], x["beta"], None, out, **args) + 255,
                     dtype=torch.uint8, device=x["q"].device)
    run = lambda: flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], None, out, workspace=ws, **args)
    ms = timed(run, iters, warmup, sync_ranks=False)
    del ws
    return ms, out, fs


def two_gpus(xs, T, iters, warmup):
    out = torch.empty_like(xs["v"])
    fs = torch.empty_like(xs["s0"])
    cu = [0, T]
    common = dict(A_log=xs["A_log"], dt_bias=xs["dt_bias"], lower_bound=-5.0)

    def run():
        cp.cp_fwd(xs["q"], xs["k"], xs["v"], xs["g"], xs["beta"], None, out, cu_seqlens=cu,
                  initial_state=xs["s0"], final_state=fs, **common)

    total = timed(run, iters, warmup, sync_ranks=True)

    # The steps, each between CUDA events on this rank (the all-gather includes the
    # wait for the slower rank).
    steps = {"summaries": [], "all-gather": [], "compose": [], "resume": []}
    for _ in range(iters):
        torch.cuda.synchronize()
        dist.barrier()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(5)]
        plan = cp._plan(xs["q"], xs["v"], cu, None)  # bookkeeping, outside the steps
        ev[0].record()
        local = cp._summarise(plan, xs["q"], xs["k"], xs["v"], xs["g"], xs["beta"], None, xs["A_log"],
                              xs["dt_bias"], -5.0, "auto")
        ev[1].record()
        M_list, B_list = cp._exchange(plan, local, None)
        ev[2].record()
        incoming = cp._incoming_states(plan, M_list, B_list, xs["s0"])
        ev[3].record()
        cp._resume(plan, local, incoming, xs["q"], xs["k"], xs["v"], xs["g"], xs["beta"], None, out,
                   xs["A_log"], xs["dt_bias"], -5.0, fs, "auto")
        ev[4].record()
        torch.cuda.synchronize()
        for i, name in enumerate(steps):
            steps[name].append(ev[i].elapsed_time(ev[i + 1]))
    return total, {n: statistics.median(v) for n, v in steps.items()}, out, fs


def fla_two_gpus(xs, T, iters, warmup):
    from fla.ops.cp import build_cp_context
    from fla.ops.kda import chunk_kda

    dev = xs["q"].device
    cu = torch.tensor([0, T], dtype=torch.int64, device=dev)
    ctx = build_cp_context(cu, group=dist.group.WORLD, cu_seqlens_cpu=cu.cpu())

    def run():
        # fla's context parallelism takes no initial state and returns no final state.
        chunk_kda(xs["q"], xs["k"], xs["v"], xs["g"], xs["beta"], initial_state=None, output_final_state=False,
                  use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                  safe_gate=True, lower_bound=-5.0, A_log=xs["A_log"], dt_bias=xs["dt_bias"].reshape(-1),
                  cu_seqlens=ctx.cu_seqlens, cp_context=ctx)

    return timed(run, iters, warmup, sync_ranks=True)


def rel_diff(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", default="8,12")
    ap.add_argument("--tokens", type=int, default=1 << 20)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--fla", action="store_true")
    a = ap.parse_args()

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != 2:
        raise SystemExit("run with torchrun --nproc-per-node 2")
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    T = a.tokens
    lo, hi = rank * T // 2, (rank + 1) * T // 2
    if rank == 0:
        print("| H | T | one GPU (ms) | two GPUs (ms) | speedup | summaries | all-gather | compose | resume "
              "| out vs one GPU | state vs one GPU |")
        print("|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for H in [int(h) for h in a.heads.split(",")]:
        x = make_inputs(T, H, dev, seed=H)  # the same inputs on both ranks
        one_ms = None
        if rank == 0:
            one_ms, ref_out, ref_fs = one_gpu(x, T, a.iters, a.warmup)
        else:  # the reference for this rank's half, untimed
            _, ref_out, ref_fs = one_gpu(x, T, 1, 0)
        dist.barrier()
        xs = shard(x, lo, hi)
        del x
        total, steps, out, fs = two_gpus(xs, T, a.iters, a.warmup)
        out_diff = rel_diff(out, ref_out[:, lo:hi])
        state_diff = rel_diff(fs, ref_fs) if rank == 1 else 0.0
        finite = bool(torch.isfinite(out).all() and torch.isfinite(ref_out).all())
        print(f"rank {rank}, H = {H}: out and the one-GPU out finite: {finite}; |out| {out.float().norm():.4e}, "
              f"relative difference {out_diff:.3e}" + (f"; final state {state_diff:.3e}" if rank == 1 else ""),
              file=sys.stderr, flush=True)
        if not finite:
            out_diff = float("inf")
        stats = torch.tensor([out_diff, state_diff] + [steps[n] for n in steps], device=dev)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        if rank == 0:  # row by row: a later row's failure or time-out keeps the earlier ones
            st = stats.tolist()
            print(f"| {H} | {T} | {one_ms:.3f} | {total:.3f} | {one_ms / total:.2f}x | {st[2]:.3f} | {st[3]:.3f} "
                  f"| {st[4]:.3f} | {st[5]:.3f} | {st[0]:.2e} | {st[1]:.2e} |", flush=True)
        del xs, out, fs, ref_out, ref_fs
        torch.cuda.empty_cache()
    if a.fla:  # after ours, so that fla's autotuning or a failure cannot lose our rows
        if rank == 0:
            print("\n| H | T | fla's context-parallel chunk_kda, two GPUs (ms) |\n|---|---|---|", flush=True)
        for H in [int(h) for h in a.heads.split(",")]:
            xs = shard(make_inputs(T, H, dev, seed=H), lo, hi)
            try:
                fla = f"{fla_two_gpus(xs, T, a.iters, a.warmup):.3f}"
            except Exception as e:  # report, do not hide: fla may not run this shape
                fla = f"failed: {type(e).__name__}: {str(e)[:100]}"
            if rank == 0:
                print(f"| {H} | {T} | {fla} |", flush=True)
            del xs
            torch.cuda.empty_cache()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
