"""fwd(states_key_major=True): initial_state / final_state as [N, HV, K, V] (fla's
layout), read and written as they are: bitwise the value-major call on transposed
states (fp32 and bf16, either state alone, K != V on the CPU), and what chunk_kda
passes for fla's default layout (no transposed copies; a transposed view still
works); bad combinations named. CPU tensors (the CUDA case is in test_gpu.py)."""
from __future__ import annotations

import pytest
import torch

import flash_kda
from kda_reference import make_problem

FLAGS = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
             safe_gate=True)


def run(p, s0, fin, key_major, backend="cpu"):
    out = torch.empty_like(p["v"])
    flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, A_log=p["A_log"],
                  dt_bias=p["dt_bias"], lower_bound=p["lower_bound"], initial_state=s0, final_state=fin,
                  cu_seqlens=p["cu_seqlens"], states_key_major=key_major, backend=backend)
    return out


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("which", ["both", "initial", "final"])
def test_key_major_states_are_the_value_major_call_transposed(backend, dtype, which):
    # K = 32, V = 48: the two layouts differ in shape too.
    p = make_problem(B=1, H=2, HV=4, K=32, V=48, seqlens=[37, 0, 50], state_dtype=dtype, seed=61)
    s0 = p["initial_state"] if which != "final" else None
    fin_vm = torch.full((3, 4, 48, 32), 7.0, dtype=dtype) if which != "initial" else None
    out_vm = run(p, s0, fin_vm, False, backend)
    s0_km = s0.transpose(-1, -2).contiguous() if s0 is not None else None
    fin_km = torch.full((3, 4, 32, 48), 9.0, dtype=dtype) if which != "initial" else None
    out_km = run(p, s0_km, fin_km, True, backend)
    assert torch.equal(out_km, out_vm)
    if fin_vm is not None:
        assert torch.equal(fin_km, fin_vm.transpose(-1, -2))


def test_workspace_size_takes_the_flag():
    p = make_problem(B=2, T=20, H=1, K=32, seed=62)
    s0 = p["initial_state"].transpose(-1, -2).contiguous()
    out = torch.empty_like(p["v"])
    n = flash_kda.workspace_size(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, A_log=p["A_log"],
                                 dt_bias=p["dt_bias"], initial_state=s0, states_key_major=True)
    assert n == 0  # the CPU backends need none


def test_bad_combinations_are_named():
    p = make_problem(B=1, H=2, K=32, V=48, seqlens=[20, 12], seed=63)
    out = torch.empty_like(p["v"])
    kw = dict(A_log=p["A_log"], dt_bias=p["dt_bias"], cu_seqlens=p["cu_seqlens"])
    args = (p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out)
    # A value-major state where the flag says key-major: the expected shape is named.
    with pytest.raises(ValueError, match=r"initial_state: .*\[N, HV, K, V\] \(states_key_major\)"):
        flash_kda.fwd(*args, initial_state=p["initial_state"], states_key_major=True, **kw)
    with pytest.raises(ValueError, match=r"final_state: .*\[N, HV, K, V\] \(states_key_major\)"):
        flash_kda.fwd(*args, final_state=torch.empty(2, 2, 48, 32), states_key_major=True, **kw)
    # A pool's slots are [HV, V, K] whatever the flag.
    pool = torch.zeros(3, 2, 48, 32)
    with pytest.raises(ValueError, match="states_key_major"):
        flash_kda.fwd(*args, state_pool=pool, state_indices=torch.tensor([0, 1], dtype=torch.int32),
                      states_key_major=True, **kw)
    with pytest.raises(TypeError, match="states_key_major: expected bool"):
        flash_kda.fwd(*args, states_key_major="yes", **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunk_kda_reads_flas_layout_in_place(dtype):
    """chunk_kda with fla's default layout passes the caller's [N, HV, K, V] state to the
    kernels as it is; a transposed view (non-contiguous) and a bf16 state (widened to
    fp32, fla's final dtype) give the same numbers."""
    p = make_problem(B=1, H=2, HV=4, K=32, seqlens=[70, 0, 33], state_dtype=torch.float32, seed=64)
    kw = dict(scale=p["scale"], output_final_state=True, lower_bound=p["lower_bound"], cu_seqlens=p["cu_seqlens"],
              A_log=p["A_log"], dt_bias=p["dt_bias"].flatten(), **FLAGS)
    s_vk = p["initial_state"].to(dtype)                 # [N, HV, V, K]
    s_kv = s_vk.transpose(-1, -2).contiguous()          # fla's [N, HV, K, V]
    o1, f1 = flash_kda.chunk_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], initial_state=s_kv, **kw)
    o2, f2 = flash_kda.chunk_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], initial_state=s_vk.transpose(-1, -2),
                                 **kw)
    o3, f3 = flash_kda.chunk_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], initial_state=s_vk, state_v_first=True,
                                 **kw)
    assert f1.dtype == torch.float32 and f1.shape == (3, 4, 32, 32) and f1.is_contiguous()
    assert torch.equal(o1, o2) and torch.equal(f1, f2)
    assert torch.equal(o1, o3) and torch.equal(f1, f3.transpose(-1, -2))
