"""flash_kda.distributed.cp_fwd on CUDA tensors over NCCL, two processes on two GPUs
of one host, against the single-GPU forward of the whole batch: each rank's out and
the final states it owns within the single-GPU forward's own bars (spec section 2),
printed. Not to fp32 rounding: the CUDA kernels round the state to bf16 as a
tensor-core operand inside each chunk, so pieces that start elsewhere (and their
summaries) round elsewhere and the two results differ at up to the level of the
kernel's own error, as two segment plans of one GPU do. (On the CPU backends,
test_distributed.py, they agree to fp32 rounding; the split calls on CUDA are held
to the float64 recurrence in test_engine_gpu.py and test_segment_scan_gpu.cpp.) The
cases of test_distributed.py at K = V = 128.

Skipped, with the reason, without two CUDA devices, NCCL or a usable CUDA backend."""
from __future__ import annotations

import datetime
import os
import tempfile

import pytest
import torch

import flash_kda
import flash_kda.distributed
from kda_reference import make_problem, rel_rms

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
OUT_BAR = 3.5e-3
STATE_BAR = 2.5e-3
BF16_STATE_BAR = 6e-3


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
            checks = [("out", out, out_ref[:, sl], OUT_BAR)]
            state_bar = BF16_STATE_BAR if fin_dtype == torch.bfloat16 else STATE_BAR
            checks += [(f"final state {n}", fin[n], fin_ref[n], state_bar) for n in owned]
            for what, got, one_gpu, bar in checks:
                d = rel_rms(got, one_gpu)
                print(f"{name}, rank {rank}, {what}: {d:.2e} from one GPU", flush=True)
                if not d <= bar:
                    errors.append(f"{name}, rank {rank}, {what}: {d:.2e} from one GPU (bar {bar:.1e})")
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
