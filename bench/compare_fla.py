#!/usr/bin/env python3
"""flash_kda against fla's Triton kernels, same process, same inputs.

Forward (default): flash_kda.fwd against fla's chunk_kda on the spec's standard
table: total T = 8192, K = V = 128, H in {96, 64}; cases
  8192      one sequence of 8192 tokens
  varlen6   varlen [1300, 547, 2048, 963, 271, 3063]
  8x1024    varlen 8 x 1024
with an fp32 initial and final state (--state bf16|none for the others).
Inputs follow the spec's accuracy distribution. Times are medians in ms
(triton.testing.do_bench, which clears L2 between launches, when triton is
importable; else CUDA events over --iters launches after warm-up). fla's Triton
kernels autotune on their first call per shape, so each shape is warmed once
before it is timed. --heads and --cases pick rows (e.g. --heads 64 --cases
varlen6,8x1024). --table tp replaces them by the tensor-parallel (few heads per
GPU) table of spec section 5: H in {12, 24, 48} x one sequence of 1024, 8192,
32768 tokens; H = 12 with 4 x 8192 and with the varlen-6 lengths; H = 1 with one
sequence of 2^20 tokens (cases 1024, 32768, 4x8192, 1M are also accepted by
--cases). --head-dim 64 runs every row at K = V = 64 (FlashKDA has none; fla does).
--gate log-decay hands both sides the gate already activated and beta already
sigmoided, in fp32, as vLLM's Kimi Linear layer calls chunk_kda (g = the safe gate's
log decays, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False; fla then runs
its general-gate path, safe_gate=False).

Decode (--decode; --no-forward for decode only): one decode step, one token per
sequence, N in --seqs (1, 8, 64, 256, 1024), H = 32, K = V = 128, fp32 and bf16
state pools, the states read and written in place in the pool:
  flash_kda.decode(q, ..., state_pool, state_indices, out=out)
(the default pdl=None, auto; a second column with pdl=False, never PDL)
against fla's serving-style entry fla.ops.kda.fused_recurrent.fused_recurrent_kda_fwd
(what vLLM-style engines call: initial_state = the pool, ssm_state_indices picks
each sequence's slot, inplace_final_state=True, out given; q/k/v/g as [N, 1, H, K]).
fla's public fused_recurrent_kda takes no slot indices: it reads a per-batch
[N, H, V, K] initial_state and allocates the final state on every call;
--fla-decode plain times that form instead (the pool then is the per-batch state).
Each step is timed like bench/bench_decode.cu: 20 steps captured in one CUDA
graph (after a warm-up outside capture, which also JIT-compiles fla's kernel once
per shape), the graph replayed --graph-iters times with CUDA events around each
replay; median / 20 = µs per step. The slots are 0..N-1 (no padding entries: fla's
kernel has no padding convention). Both start from the same pool for the rel diff
columns (out and the updated pool after one step).

FLA_FLASH_KDA=0 is set before fla is imported, so chunk_kda runs fla's own
Triton path rather than dispatching back to flash_kda.

Progress goes to stderr, flushed, as each measurement starts; the tables go to
stdout at the end, and also when the run is stopped (SIGTERM, e.g. `timeout`, or
Ctrl-C): whatever rows are done are printed (and written to --md).

  python3 bench/compare_fla.py [--heads 96,64] [--cases 8192,varlen6,8x1024] [--table standard|tp]
                               [--state fp32] [--png out.png] [--md out.md]
                               [--decode] [--no-forward] [--seqs 1,8,64,256,1024]
                               [--decode-heads 32] [--pools fp32,bf16] [--fla-decode serving|plain]
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys

os.environ["FLA_FLASH_KDA"] = "0"  # before fla is imported: fla's own Triton path

import torch  # noqa: E402

import flash_kda  # noqa: E402

CASES = {
    "8192": [8192],
    "varlen6": [1300, 547, 2048, 963, 271, 3063],
    "8x1024": [1024] * 8,
    "1024": [1024],
    "32768": [32768],
    "4x8192": [8192] * 4,
    "1M": [1 << 20],
}
# The tensor-parallel table (spec section 5): (H, case) rows.
TP_ROWS = [(h, c) for h in (12, 24, 48) for c in ("1024", "8192", "32768")] + [
    (12, "4x8192"), (12, "varlen6"), (1, "1M")]
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
    # --gate log-decay: the same decays and betas, activated outside the kernels (fp32).
    x["g_log"] = -5.0 * torch.sigmoid(x["A_log"].exp()[:, None] * (x["g"].float() + x["dt_bias"]))
    x["beta_prob"] = torch.sigmoid(x["beta"].float())
    return x


def ours(x, state_dtype, gate="safe"):
    out = torch.empty_like(x["v"])
    fs = None
    if state_dtype is not None:
        fs = torch.empty(x["N"], *x["v"].shape[2:], x["q"].shape[3], dtype=state_dtype, device="cuda")

    def run():
        if gate == "log-decay":
            flash_kda.fwd(x["q"], x["k"], x["v"], x["g_log"], x["beta_prob"], x["scale"], out, initial_state=x["s0"],
                          final_state=fs, cu_seqlens=x["cu"], use_gate_in_kernel=False,
                          use_beta_sigmoid_in_kernel=False)
        else:
            flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], x["scale"], out, A_log=x["A_log"],
                          dt_bias=x["dt_bias"], lower_bound=-5.0, initial_state=x["s0"], final_state=fs,
                          cu_seqlens=x["cu"])
        return out, fs

    return run


def fla_fn(chunk_kda, x, state_dtype, gate="safe"):
    s0 = x["s0"].float() if x["s0"] is not None else None  # fla's Triton path takes fp32 states only

    def run():
        if gate == "log-decay":
            return chunk_kda(x["q"], x["k"], x["v"], x["g_log"], x["beta_prob"], scale=x["scale"], initial_state=s0,
                             output_final_state=state_dtype is not None, use_qk_l2norm_in_kernel=True,
                             state_v_first=True, cu_seqlens=x["cu"])
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
        return events_ms(fn, iters)


def events_ms(fn, iters):
    """Median of CUDA-event times over back-to-back launches after a warm-up (no L2 flush)."""
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


def io_floor_ms(T, H, K, bw=4.25e12):
    # Spec section 5: q, k, v, g read and out written (bf16), at the measured copy bandwidth.
    return 5 * T * H * K * 2 / bw * 1e3


def markdown(rows, state, K, gate="safe"):
    gate_note = ", gates and betas activated outside (fp32)" if gate == "log-decay" else ""
    lines = [
        f"KDA forward, {torch.cuda.get_device_name()}, K = V = {K}, {state} state{gate_note}, median ms "
        f"(flash_kda {flash_kda.__version__}; fla Triton with FLA_FLASH_KDA=0)",
        "",
        "| H | case | flash_kda | fla chunk_kda | ratio (ours / fla) | IO floor | rel diff out | rel diff state |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['H']} | {r['case']} | {r['ours']:.3f} | {r['fla']:.3f} | {r['ours'] / r['fla']:.2f} | "
                     f"{r['floor']:.3f} | {r['d_out']:.2e} | {r['d_state']:.2e} |")
    return "\n".join(lines)


def plot(rows, path, K):
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
    ax.set_title(f"KDA forward, K=V={K}, T=8192 total, {rows[0]['state']} state ({torch.cuda.get_device_name()})",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


COPY_BANDWIDTH = 4.25e12  # bytes/s, the H200's measured copy bandwidth (bench/bench_common.cuh)
STEPS_PER_GRAPH = 20       # as bench/bench_decode.cu: amortises the graph launch itself


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def make_decode_inputs(N, H, pool_dtype, K=128, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"

    def normal(*shape):
        return torch.randn(*shape, generator=g, device=dev, dtype=torch.float32)

    def l2n(x):
        return x / x.norm(dim=-1, keepdim=True)

    return dict(
        q=l2n(normal(N, H, K)).bfloat16(),
        k=l2n(normal(N, H, K)).bfloat16(),
        v=normal(N, H, K).bfloat16(),
        g=normal(N, H, K).bfloat16(),
        beta=normal(N, H).bfloat16(),
        A_log=torch.rand(H, generator=g, device=dev),
        dt_bias=torch.rand(H, K, generator=g, device=dev),
        pool=(0.1 * normal(N, H, K, K)).to(pool_dtype),
        indices=torch.arange(N, dtype=torch.int32, device=dev),
        scale=K ** -0.5,
    )


def ours_decode(x, pool, out, pdl=None):
    def step():
        flash_kda.decode(x["q"], x["k"], x["v"], x["g"], x["beta"], x["A_log"], x["dt_bias"], pool, x["indices"],
                         out=out, scale=x["scale"], lower_bound=-5.0, pdl=pdl)
    return step


def fla_decode(entry, form, x, pool, out):
    """One fla decode step on `pool` (see the module docstring); the step returns
    (out [N, H, V], the updated states)."""
    N, H, K = x["q"].shape
    q, k, v, g = (x[n].view(N, 1, H, K) for n in ("q", "k", "v", "g"))
    beta = x["beta"].view(N, 1, H)
    dt_bias = x["dt_bias"].reshape(-1)  # fla reads dt_bias as [HV * K]
    flags = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                 lower_bound=-5.0, state_v_first=True)
    if form == "serving":
        out4 = out.view(N, 1, H, K)

        def step():
            entry(q=q, k=k, v=v, g=g, beta=beta, A_log=x["A_log"], dt_bias=dt_bias, initial_state=pool,
                  scale=x["scale"], inplace_final_state=True, ssm_state_indices=x["indices"], out=out4, **flags)
            return out, pool
    else:
        def step():
            o, final_state = entry(q, k, v, g, beta, A_log=x["A_log"], dt_bias=dt_bias, scale=x["scale"],
                                   initial_state=pool, output_final_state=True, **flags)
            return o.view(N, H, K), final_state
    return step


def graph_us_per_step(step, iters):
    """µs per step: STEPS_PER_GRAPH steps in one CUDA graph, median over `iters` replays."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside capture (fla: JIT compile for this shape)
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(STEPS_PER_GRAPH):
            step()
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    del graph
    return statistics.median(times) * 1e3 / STEPS_PER_GRAPH


def decode_row(N, H, pool_name, fla_entry, fla_form, iters, K):
    pool_dtype = STATES[pool_name]
    x = make_decode_inputs(N, H, pool_dtype, K)
    state_bytes = 2 * x["pool"].numel() * x["pool"].element_size()  # read + write
    row = dict(N=N, H=H, pool=pool_name, ours=float("nan"), ours_nopdl=float("nan"), fla=float("nan"), d_out=float("nan"),
               d_pool=float("nan"), floor=state_bytes / COPY_BANDWIDTH * 1e6, state_bytes=state_bytes)
    # One step of each from the same pool: how far apart the results are.
    pool_a, out_a = x["pool"].clone(), torch.empty_like(x["v"])
    ours_decode(x, pool_a, out_a)()
    if fla_entry is not None:
        out_b, pool_b = fla_decode(fla_entry, fla_form, x, x["pool"].clone(), torch.empty_like(x["v"]))()
        torch.cuda.synchronize()
        row["d_out"] = rel(out_a, out_b)
        row["d_pool"] = rel(pool_a.float(), pool_b.float())
    log(f"decode N={N:5d} H={H} {pool_name}: flash_kda ...")
    pool, out = x["pool"].clone(), torch.empty_like(x["v"])
    row["ours"] = graph_us_per_step(ours_decode(x, pool, out), iters)  # pdl=None: the default (auto)
    # The same steps never launched with PDL: what auto gains (or gives up) at this size.
    row["ours_nopdl"] = graph_us_per_step(ours_decode(x, pool, out, pdl=False), iters)
    if fla_entry is not None:
        log(f"decode N={N:5d} H={H} {pool_name}: fla ({fla_form}; first call compiles) ...")
        pool, out = x["pool"].clone(), torch.empty_like(x["v"])
        row["fla"] = graph_us_per_step(fla_decode(fla_entry, fla_form, x, pool, out), iters)
    log(f"decode N={N:5d} H={H} {pool_name}: ours {row['ours']:.2f} us  fla {row['fla']:.2f} us  "
        f"ratio {row['ours'] / row['fla']:.2f}  rel diff out {row['d_out']:.2e} pool {row['d_pool']:.2e}")
    return row


def decode_markdown(rows, fla_form, K):
    fla_name = ("fused_recurrent_kda_fwd (serving form: pool + ssm_state_indices, in place)" if fla_form == "serving"
                else "fused_recurrent_kda (per-batch initial_state, final state allocated)")
    lines = [
        f"KDA decode, one token per sequence, {torch.cuda.get_device_name()}, K = V = {K}, µs per step "
        f"(median, {STEPS_PER_GRAPH} steps per CUDA graph; flash_kda {flash_kda.__version__}; fla {fla_name})",
        "",
        "| N | H | pool | flash_kda (default) | flash_kda, pdl=False | fla | ratio (ours / fla) | state floor | "
        "ours % of copy BW | rel diff out | rel diff pool |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        pct = 100 * r["floor"] / r["ours"]
        lines.append(f"| {r['N']} | {r['H']} | {r['pool']} | {r['ours']:.2f} | {r['ours_nopdl']:.2f} | {r['fla']:.2f} | "
                     f"{r['ours'] / r['fla']:.2f} | {r['floor']:.2f} | {pct:.0f}% | {r['d_out']:.2e} | "
                     f"{r['d_pool']:.2e} |")
    return "\n".join(lines)


def parse_list(text, cast=str):
    return [cast(t) for t in text.split(",") if t.strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", default="96,64")
    ap.add_argument("--cases", default="8192,varlen6,8x1024")
    ap.add_argument("--table", default="standard", choices=["standard", "tp"],
                    help="tp: the tensor-parallel rows of spec section 5 instead of --heads x --cases")
    ap.add_argument("--state", default="fp32", choices=list(STATES))
    ap.add_argument("--head-dim", type=int, default=128, choices=[64, 128], help="K = V of every row")
    ap.add_argument("--gate", default="safe", choices=["safe", "log-decay"],
                    help="forward: the raw gate and beta logit (FlashKDA's), or both activated outside (vLLM's)")
    ap.add_argument("--iters", type=int, default=100, help="CUDA-event iterations (without triton)")
    ap.add_argument("--png", default=None, help="write a bar chart of the forward rows here (needs matplotlib)")
    ap.add_argument("--md", default=None, help="also write the markdown table(s) here")
    ap.add_argument("--no-fla", action="store_true", help="time flash_kda only")
    ap.add_argument("--decode", action="store_true", help="also compare decode (see above)")
    ap.add_argument("--no-forward", action="store_true", help="skip the forward table (implies --decode)")
    ap.add_argument("--seqs", default="1,8,64,256,1024", help="decode: sequences (tokens) per step")
    ap.add_argument("--decode-heads", type=int, default=32)
    ap.add_argument("--pools", default="fp32,bf16", help="decode: state pool dtypes")
    ap.add_argument("--graph-iters", type=int, default=200, help="decode: timed graph replays")
    ap.add_argument("--fla-decode", default="serving", choices=["serving", "plain"],
                    help="decode: fla's serving entry (pool + indices) or the public per-batch form")
    args = ap.parse_args()
    run_forward = not args.no_forward
    run_decode = args.decode or args.no_forward

    if not torch.cuda.is_available():
        sys.exit("compare_fla: no CUDA device")
    ok, why = flash_kda.cuda_status()
    if not ok:
        sys.exit(f"compare_fla: flash_kda CUDA backend unavailable: {why}")

    state_dtype = STATES[args.state]
    heads = parse_list(args.heads, int)
    cases = parse_list(args.cases)
    for c in cases:
        if c not in CASES:
            sys.exit(f"compare_fla: unknown case {c!r} (known: {', '.join(CASES)})")
    rows = TP_ROWS if args.table == "tp" else [(H, c) for H in heads for c in cases]
    seqs = parse_list(args.seqs, int)
    pools = parse_list(args.pools)
    for pname in pools:
        if STATES.get(pname) is None:
            sys.exit(f"compare_fla: unknown pool dtype {pname!r} (known: fp32, bf16)")

    chunk_kda = fla_entry = None
    if not args.no_fla:
        try:
            if run_forward:
                from fla.ops.kda import chunk_kda
            if run_decode:
                if args.fla_decode == "serving":
                    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd as fla_entry
                else:
                    from fla.ops.kda import fused_recurrent_kda as fla_entry
        except Exception as e:
            sys.exit(f"compare_fla: fla not importable ({type(e).__name__}: {e}); use --no-fla")

    fwd_rows, dec_rows = [], []

    def tables():
        parts = []
        if fwd_rows:
            parts.append(markdown(fwd_rows, args.state, args.head_dim, args.gate))
        if dec_rows:
            parts.append(decode_markdown(dec_rows, args.fla_decode, args.head_dim))
        return "\n\n".join(parts)

    def write_md():
        if args.md:
            with open(args.md, "w") as f:
                f.write(tables() + "\n")

    def stopped(signum, frame):
        # A time limit or Ctrl-C: the rows measured so far are still worth having.
        log(f"compare_fla: stopped by signal {signum}; tables of the rows done so far:")
        print(tables(), flush=True)
        write_md()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stopped)
    signal.signal(signal.SIGINT, stopped)

    with torch.inference_mode():
        if run_forward:
            for H, case in rows:
                seqlens = CASES[case]
                x = make_inputs(seqlens, H, state_dtype, args.head_dim)
                log(f"forward H={H} {case}: flash_kda ...")
                f_ours = ours(x, state_dtype, args.gate)
                o_ours, s_ours = f_ours()
                t_ours = median_ms(f_ours, args.iters)
                row = dict(H=H, case=case, state=args.state, ours=t_ours, fla=float("nan"),
                           d_out=float("nan"), d_state=float("nan"),
                           floor=io_floor_ms(sum(seqlens), H, args.head_dim))
                if chunk_kda is not None:
                    log(f"forward H={H} {case}: fla (first call autotunes this shape) ...")
                    f_fla = fla_fn(chunk_kda, x, state_dtype, args.gate)
                    o_fla, s_fla = f_fla()  # warm-up: autotunes on the first call of a shape
                    torch.cuda.synchronize()
                    row["fla"] = median_ms(f_fla, args.iters)
                    row["d_out"] = rel(o_ours, o_fla)
                    if s_ours is not None:
                        row["d_state"] = rel(s_ours.float(), s_fla.float())
                fwd_rows.append(row)
                log(f"forward H={H:3d} {case:8s} ours {row['ours']:.3f} ms  fla {row['fla']:.3f} ms  "
                    f"ratio {row['ours'] / row['fla']:.2f}  rel diff out {row['d_out']:.2e} "
                    f"state {row['d_state']:.2e}")
                write_md()  # after every row: a partial table survives a time limit
                if args.png:
                    plot(fwd_rows, args.png, args.head_dim)
                del x
        if run_decode:
            for pool_name in pools:
                for N in seqs:
                    dec_rows.append(decode_row(N, args.decode_heads, pool_name, fla_entry, args.fla_decode,
                                               args.graph_iters, args.head_dim))
                    write_md()

    print(tables(), flush=True)
    write_md()
    if args.png and fwd_rows:
        plot(fwd_rows, args.png, args.head_dim)


if __name__ == "__main__":
    main()
