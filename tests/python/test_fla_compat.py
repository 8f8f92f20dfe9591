"""flash_kda.chunk_kda, fla's entry point: the same numbers as flash_kda.fwd in fla's
layouts (state_v_first False and True, intermediate states every 64 tokens, a state pool
through initial_state_indices), and the unsupported flags refused by name. CPU tensors
here; the comparison with fla's own chunk_kda needs its Triton kernels (GPU)."""
from __future__ import annotations

import math

import pytest
import torch

import flash_kda
from kda_reference import make_problem

FLAGS = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
             safe_gate=True)


def direct(p, state_v_first):
    out = torch.empty_like(p["v"])
    fin = torch.empty_like(p["initial_state"])
    flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, A_log=p["A_log"],
                  dt_bias=p["dt_bias"], lower_bound=p["lower_bound"], initial_state=p["initial_state"],
                  final_state=fin, cu_seqlens=p["cu_seqlens"])
    return out, fin if state_v_first else fin.transpose(-1, -2)


@pytest.mark.parametrize("state_v_first", [False, True])
@pytest.mark.parametrize("varlen", [False, True])
def test_chunk_kda_is_fwd_in_flas_layout(state_v_first, varlen):
    p = make_problem(B=1 if varlen else 2, T=150, H=2, HV=4, K=32, seqlens=[150, 0, 70] if varlen else None,
                     seed=21)
    s0 = p["initial_state"] if state_v_first else p["initial_state"].transpose(-1, -2).contiguous()
    o, fs, h = flash_kda.chunk_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], scale=p["scale"], initial_state=s0,
                                   output_final_state=True, lower_bound=p["lower_bound"],
                                   return_intermediate_states=True, state_v_first=state_v_first,
                                   cu_seqlens=p["cu_seqlens"], A_log=p["A_log"], dt_bias=p["dt_bias"].flatten(),
                                   **FLAGS)
    o_ref, fs_ref = direct(p, state_v_first)
    assert torch.equal(o, o_ref) and fs.dtype == torch.float32 and torch.equal(fs, fs_ref)
    lengths = [150, 0, 70] if varlen else [150, 150]
    nt = sum(math.ceil(L / 64) for L in lengths)
    assert h.dtype == torch.bfloat16
    assert h.shape == ((1, nt) if varlen else (2, 3)) + ((4, 32, 32))
    # The first chunk's state of the first sequence is its initial state.
    first = p["initial_state"][0] if state_v_first else p["initial_state"][0].transpose(-1, -2)
    assert torch.equal(h.reshape(-1, 4, 32, 32)[0], first.bfloat16())


def test_chunk_kda_takes_cu_seqlens_cpu():
    # fla's host copy of the boundaries (int32 or int64) goes on as fwd's cu_seqlens_host.
    p = make_problem(B=1, H=2, K=32, seqlens=[150, 0, 70], seed=23)
    kw = dict(scale=p["scale"], initial_state=p["initial_state"], output_final_state=True, state_v_first=True,
              lower_bound=p["lower_bound"], cu_seqlens=p["cu_seqlens"], A_log=p["A_log"], dt_bias=p["dt_bias"],
              return_intermediate_states=True, **FLAGS)
    o, fs, h = flash_kda.chunk_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], **kw)
    for cpu in (p["cu_seqlens"].clone(), p["cu_seqlens"].to(torch.int32)):
        o2, fs2, h2 = flash_kda.chunk_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], cu_seqlens_cpu=cpu, **kw)
        assert torch.equal(o, o2) and torch.equal(fs, fs2) and torch.equal(h, h2)


def test_chunk_kda_on_a_state_pool():
    p = make_problem(B=1, H=1, K=32, seqlens=[40, 24], seed=22)
    pool = torch.zeros(3, 1, 32, 32)
    pool[2], pool[0] = p["initial_state"][0], p["initial_state"][1]
    idx = torch.tensor([2, 0])
    o, fs = flash_kda.chunk_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], initial_state=pool,
                                state_v_first=True, cu_seqlens=p["cu_seqlens"], A_log=p["A_log"],
                                dt_bias=p["dt_bias"], initial_state_indices=idx, **FLAGS)
    o_ref, fs_ref = direct(p, True)
    assert fs is None and torch.equal(o, o_ref)
    assert torch.equal(pool[2], fs_ref[0]) and torch.equal(pool[0], fs_ref[1])


@pytest.mark.parametrize("flag,value", [("use_qk_l2norm_in_kernel", False), ("use_gate_in_kernel", False),
                                        ("use_beta_sigmoid_in_kernel", False), ("safe_gate", False),
                                        ("allow_neg_eigval", True)])
def test_unsupported_flags_are_named(flag, value):
    p = make_problem(B=1, T=16, H=1, K=32, seed=23)
    kw = dict(FLAGS, A_log=p["A_log"], dt_bias=p["dt_bias"])
    kw[flag] = value
    with pytest.raises(NotImplementedError, match=flag):
        flash_kda.chunk_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], **kw)
    with pytest.raises(NotImplementedError, match="A_log and dt_bias"):
        flash_kda.chunk_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], **FLAGS)


def test_shapes_outside_flas_layout_are_named():
    """A head-first [B, H, T, K] call and a dt_bias of the wrong size get errors that name
    the argument, not a reshape failure."""
    p = make_problem(B=1, T=16, H=2, K=32, seed=24)
    kw = dict(FLAGS, A_log=p["A_log"], dt_bias=p["dt_bias"].flatten())
    head_first = [p[n].transpose(1, 2) for n in ("q", "k", "v", "g")]
    with pytest.raises(ValueError, match=r"dt_bias: expected shape \[HV \* K\] = \[512\]"):
        flash_kda.chunk_kda(*head_first, p["beta"].transpose(1, 2), **kw)
    with pytest.raises(ValueError, match=r"q: expected a tensor \[B, T, heads, dim\]"):
        flash_kda.chunk_kda(p["q"][0], p["k"][0], p["v"][0], p["g"][0], p["beta"][0], **kw)
    o, _ = flash_kda.chunk_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], **kw)
    assert o.shape == p["v"].shape

