"""Degenerate keys (kda_reference.DEGENERATE_CASES) against the float64 reference.

CPU tensors run the chunked fp32 CPU backend (the kernels' twin); CUDA tensors the
sm_90a kernels; decode runs the same class token by token. Bars: always finite; the CPU
backend within 1e-3 relative RMS (fp32 with a forward-substitution inverse; it agrees
to ~1e-6 on these sizes), the kernels within 1e-2 (the bar of the degenerate class) and
never worse than fla's Triton chunk_kda on the same input when fla is importable.
"""
from __future__ import annotations

import os

import pytest
import torch

import flash_kda
from gpu_skip import skip_reason
from kda_reference import DEGENERATE_CASES, fwd_kwargs, make_degenerate_problem, new_outputs, reference, rel_rms

CPU_BAR = 1e-3
GPU_BAR = 1e-2
CASE_IDS = [name for name, _ in DEGENERATE_CASES]
SHAPES = {
    "T300": dict(T=300, H=2),                              # a partial last chunk
    "varlen_gva": dict(seqlens=[37, 16, 130, 5], H=1, HV=2),
}


def _run(p):
    out, fs = new_outputs(p)
    flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, final_state=fs, **fwd_kwargs(p))
    return out, fs


def _errors(p, out, fs):
    ro, rs = reference(p)
    assert torch.isfinite(out).all(), "non-finite out"
    assert torch.isfinite(fs).all(), "non-finite final state"
    return rel_rms(out, ro), rel_rms(fs, rs)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("case", DEGENERATE_CASES, ids=CASE_IDS)
def test_cpu_backend(case, shape):
    p = make_degenerate_problem(**case[1], **SHAPES[shape], seed=61)
    eo, es = _errors(p, *_run(p))
    # out is bf16: judged after its rounding here, which alone is ~1.7e-3 relative on
    # random values, so the bar applies to the state and out gets the rounding floor on top.
    assert es <= CPU_BAR, f"{case[0]}: state {es:.3e}"
    assert eo <= CPU_BAR + 4e-3, f"{case[0]}: out {eo:.3e}"


def _decode_reference_problem(case, seed):
    """N = 3 sequences of 1, 37 and 16 tokens as a forward problem (the decode's oracle)."""
    return make_degenerate_problem(**case[1], seqlens=[1, 37, 16], H=2, seed=seed)


def _decode(p, device):
    q, k, v, g, beta = (p[n][0].to(device) for n in ("q", "k", "v", "g", "beta"))
    pool = p["initial_state"].clone().to(device)
    idx = torch.arange(pool.shape[0], dtype=torch.int32, device=device)
    out = flash_kda.decode(q, k, v, g, beta, p["A_log"].to(device), p["dt_bias"].to(device), pool, idx,
                           scale=p["scale"], lower_bound=p["lower_bound"], cu_seqlens=p["cu_seqlens"].to(device))
    return out[None], pool


@pytest.mark.parametrize("case", DEGENERATE_CASES, ids=CASE_IDS)
def test_cpu_decode(case):
    p = _decode_reference_problem(case, 62)
    out, pool = _decode(p, "cpu")
    eo, es = _errors(p, out, pool)
    assert es <= 1e-6 and eo <= 4e-3, f"{case[0]}: out {eo:.3e} state {es:.3e}"


# ---- CUDA ------------------------------------------------------------------------------

requires_gpu = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))


def _fla_errors(p, monkeypatch):
    """fla's own Triton chunk_kda (not its dispatch to flash_kda) on p: (out, state) errors,
    or None when fla is not importable."""
    try:
        from fla.ops.kda import chunk_kda
    except Exception:
        return None
    monkeypatch.setenv("FLA_FLASH_KDA", "0")
    with torch.inference_mode():
        o, s = chunk_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], scale=p["scale"],
                         initial_state=p["initial_state"], output_final_state=True,
                         use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                         safe_gate=True, lower_bound=p["lower_bound"], state_v_first=True,
                         cu_seqlens=p["cu_seqlens"], A_log=p["A_log"], dt_bias=p["dt_bias"].reshape(-1))
    torch.cuda.synchronize()
    ro, rs = reference(p)
    return rel_rms(o, ro), rel_rms(s, rs)


@requires_gpu
@pytest.mark.parametrize("shape", list(SHAPES) + ["T4096"])
@pytest.mark.parametrize("case", DEGENERATE_CASES, ids=CASE_IDS)
def test_gpu_kernels(case, shape, monkeypatch):
    dims = SHAPES.get(shape, dict(T=4096, H=1))
    p = make_degenerate_problem(**case[1], **dims, seed=63, device="cuda")
    eo, es = _errors(p, *_run(p))
    # fla on the two small shapes only: its Triton kernels compile and autotune per
    # shape, which took minutes for T = 4096 on the H200.
    fla = _fla_errors(p, monkeypatch) if shape in SHAPES else None
    print(f"{case[0]:34s} {shape:10s} flash-kda out {eo:.3e} state {es:.3e}"
          + (f" | fla out {fla[0]:.3e} state {fla[1]:.3e}" if fla else " | fla not run"))
    assert eo <= GPU_BAR and es <= GPU_BAR, f"{case[0]}: out {eo:.3e} state {es:.3e}"
    if fla is not None:
        assert eo <= fla[0] and es <= fla[1], f"{case[0]}: worse than fla ({fla[0]:.3e}, {fla[1]:.3e})"


@requires_gpu
def test_gpu_serving_regression_input():
    # The engine's regression input: T = 16384, H = 1, q = k = one vector, v = one 16-token
    # block repeated, gate -12, beta logit 8, zero fp32 initial state.
    p = make_degenerate_problem(keys="serving", zero_state=True, T=16384, H=1, seed=64, device="cuda")
    eo, es = _errors(p, *_run(p))
    assert eo <= GPU_BAR and es <= GPU_BAR, f"out {eo:.3e} state {es:.3e}"


@requires_gpu
@pytest.mark.parametrize("case", DEGENERATE_CASES[:3] + DEGENERATE_CASES[8:], ids=CASE_IDS[:3] + CASE_IDS[8:])
def test_gpu_decode(case):
    p = _decode_reference_problem(case, 65)
    out, pool = _decode(p, "cuda")
    eo, es = _errors({k: (v.to("cuda") if isinstance(v, torch.Tensor) else v) for k, v in p.items()}, out, pool)
    assert es <= 1e-5 and eo <= 4e-3, f"{case[0]}: out {eo:.3e} state {es:.3e}"
