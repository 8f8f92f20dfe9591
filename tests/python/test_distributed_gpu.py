"""flash_kda.distributed.cp_fwd on CUDA tensors over NCCL, two processes on two GPUs
of one host, against the single-GPU forward of the whole batch: out within one bf16
ulp, final states within 1e-4 relative RMS (the CUDA forward's own state error
against float64 is up to ~5e-5, spec section 2, and a split changes where its chunks
start). The cases of test_distributed.py at K = V = 128.

Skipped, with the reason, without two CUDA devices, NCCL or a usable CUDA backend."""
from __future__ import annotations

import datetime
import os
import tempfile

import pytest
import torch

import flash_kda
from kda_reference import make_problem

dist = pytest.importorskip("torch.distributed")
if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
    pytest.skip("needs two CUDA devices", allow_module_level=True)
if not dist.is_available() or not dist.is_nccl_available():
    pytest.skip("torch.distributed with NCCL is not available in this torch build", allow_module_level=True)
if not flash_kda.cuda_available():
    pytest.skip(f"no usable CUDA backend: {flash_kda.cuda_status()[1]}", allow_module_level=True)

CASES = [
    ("one sequence, uneven", [1000], [333, 667], torch.float32),
    ("varlen crossing", [700, 0, 330, 1280, 50], [1000, 1360], torch.float32),
    ("no initial state", [700, 0, 330, 1280, 50], [710, 1650], None),
    ("bf16 states", [700, 0, 330, 1280, 50], [1000, 1360], torch.bfloat16),
]
STATE_BAR = 1e-4


def bf16_ulps(a, b):
    a, b = a.float(), b.float()
    mag = torch.maximum(a.abs(), b.abs()).clamp_min(2.0 ** -126)
    return ((a - b).abs() / torch.exp2(torch.floor(torch.log2(mag)) - 7)).max().item()


def _run(rank, world, init_file, result_dir):
    errors = []
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        for name, seqlens, sizes, state_dtype in CASES:
            fin_dtype = state_dtype or torch.float32
            p = make_problem(H=2, HV=4, seqlens=seqlens, seed=len(name), state_dtype=state_dtype,
                             final_dtype=fin_dtype, device=f"cuda:{rank}")
            out_ref = torch.empty_like(p["v"])
            fin_ref = torch.empty(len(seqlens), 4, 128, 128, dtype=fin_dtype, device=f"cuda:{rank}")
            flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out_ref, A_log=p["A_log"],
                          dt_bias=p["dt_bias"], lower_bound=p["lower_bound"], initial_state=p["initial_state"],
                          final_state=fin_ref, cu_seqlens=p["cu_seqlens"])
            lo = sum(sizes[:rank])
            sl = slice(lo, lo + sizes[rank])
            x = {key: p[key][:, sl].contiguous() for key in ("q", "k", "v", "g", "beta")}
            out = torch.empty_like(x["v"])
            fin = torch.full_like(fin_ref, float("nan"))
            owned = flash_kda.distributed.cp_fwd(
                x["q"], x["k"], x["v"], x["g"], x["beta"], p["scale"], out, A_log=p["A_log"], dt_bias=p["dt_bias"],
                lower_bound=p["lower_bound"], cu_seqlens=p["cu_seqlens"], initial_state=p["initial_state"],
                final_state=fin)
            torch.cuda.synchronize()
            u = bf16_ulps(out, out_ref[:, sl])
            if not u <= 1:
                errors.append(f"{name}, rank {rank}: out differs by {u:.1f} bf16 ulps")
            for n in owned:
                if fin_dtype == torch.bfloat16:
                    e = bf16_ulps(fin[n], fin_ref[n])
                    ok = e <= 1
                else:
                    e = ((fin[n] - fin_ref[n]).norm() / fin_ref[n].norm().clamp_min(1e-30)).item()
                    ok = e <= STATE_BAR
                print(f"{name}, rank {rank}, sequence {n}: final state {e:.2e}", flush=True)
                if not ok:
                    errors.append(f"{name}, rank {rank}: final state {n}: {e:.2e}")
    except Exception as e:
        errors.append(f"rank {rank}: {type(e).__name__}: {e}")
    finally:
        dist.destroy_process_group()
        with open(os.path.join(result_dir, f"rank{rank}.txt"), "w") as f:
            f.write("\n".join(errors))


def test_cp_fwd_on_two_gpus_equals_one_gpu():
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_run, args=(2, os.path.join(d, "init"), d), nprocs=2, join=True)
        errors = []
        for r in range(2):
            with open(os.path.join(d, f"rank{r}.txt")) as f:
                errors += [line for line in f.read().splitlines() if line]
    assert not errors, "\n".join(errors)
