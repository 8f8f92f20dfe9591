"""q, k, v, g and beta as strided views of one fused projection (what engines pass):
bitwise the run on contiguous copies, on the CPU backends; batch views must space their
tokens evenly."""
from __future__ import annotations

import pytest
import torch

import flash_kda
from kda_reference import make_problem


def fused_views(p, H, HV, K, V):
    """One [B, T, width] tensor holding q | k | v | g | beta | pad per token, and the views."""
    B, T = p["q"].shape[:2]
    parts = [p["q"].reshape(B, T, H * K), p["k"].reshape(B, T, H * K), p["v"].reshape(B, T, HV * V),
             p["g"].reshape(B, T, HV * K), p["beta"], torch.zeros(B, T, 5, dtype=torch.bfloat16)]
    fused = torch.cat(parts, dim=-1)
    o = [0]
    for t in parts:
        o.append(o[-1] + t.shape[-1])
    views = dict(q=fused[..., o[0]:o[1]].view(B, T, H, K), k=fused[..., o[1]:o[2]].view(B, T, H, K),
                 v=fused[..., o[2]:o[3]].view(B, T, HV, V), g=fused[..., o[3]:o[4]].view(B, T, HV, K),
                 beta=fused[..., o[4]:o[5]])
    assert not any(t.is_contiguous() for t in views.values())
    return views


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("varlen", [False, True])
def test_fused_projection_views_are_bitwise_the_contiguous_run(backend, varlen):
    H, HV, K, V = 2, 4, 32, 16
    p = make_problem(B=1 if varlen else 2, T=40, H=H, HV=HV, K=K, V=V,
                     seqlens=[37, 0, 64, 21] if varlen else None, seed=11)
    views = fused_views(p, H, HV, K, V)
    kw = dict(A_log=p["A_log"], dt_bias=p["dt_bias"], lower_bound=p["lower_bound"],
              initial_state=p["initial_state"], cu_seqlens=p["cu_seqlens"], backend=backend)
    results = []
    for x in (p, views):
        out = torch.empty_like(p["v"])
        fin = torch.empty_like(p["initial_state"])
        flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], p["scale"], out, final_state=fin, **kw)
        results.append((out, fin))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_unevenly_spaced_batch_is_value_error():
    p = make_problem(B=2, T=8, H=1, K=32, seed=12)
    # Two batch rows that are not one evenly spaced token axis.
    q = torch.zeros(2, 16, 1, 32, dtype=torch.bfloat16)[:, :8]
    q.copy_(p["q"])
    with pytest.raises(ValueError, match=r"^q: expected evenly spaced tokens"):
        flash_kda.fwd(q, p["k"], p["v"], p["g"], p["beta"], p["scale"], torch.empty_like(p["v"]),
                      A_log=p["A_log"], dt_bias=p["dt_bias"])


@pytest.mark.parametrize("name,make", [
    ("q", lambda p: p["q"][:, :1].expand(p["q"].shape)),                       # one token for all
    ("k", lambda p: p["k"][:, :, :1].expand(p["k"].shape)),                    # one head for all
    ("g", lambda p: p["g"][:1, :1].expand(p["g"].shape)),                      # over batch and tokens
    ("beta", lambda p: p["beta"][..., :1].expand(p["beta"].shape)),            # one beta for all heads
])
def test_broadcast_views_are_value_errors(name, make):
    # A stride of 0 (expand()) is not a tensor of that shape in memory: ForwardArgs
    # reads a stride of 0 as "dense", so such a view was read as a dense tensor, past
    # its storage. Refused by name.
    p = make_problem(B=2, T=24, H=2, HV=2, K=32, seed=13)
    x = dict(p)
    x[name] = make(p)
    assert 0 in x[name].stride()
    with pytest.raises(ValueError, match=rf"^{name}: expected non-zero strides"):
        flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], p["scale"], torch.empty_like(p["v"]),
                      A_log=p["A_log"], dt_bias=p["dt_bias"])


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_one_token_per_batch_row_views_are_the_contiguous_run(backend):
    # buf[:, -1:] (each row's last token, as a decode-like forward takes it): T == 1,
    # so stride(1) says nothing and the rows are spaced by stride(0).
    p = make_problem(B=3, T=5, H=2, HV=4, K=32, seed=14)
    views = {n: p[n][:, -1:] for n in ("q", "k", "v", "g", "beta")}
    dense = {n: t.contiguous() for n, t in views.items()}
    assert not views["q"].is_contiguous()
    results = []
    for x in (dense, views):
        out = torch.empty_like(dense["v"])
        fin = torch.empty_like(p["initial_state"])
        flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], p["scale"], out, A_log=p["A_log"],
                      dt_bias=p["dt_bias"], initial_state=p["initial_state"], final_state=fin, backend=backend)
        results.append((out, fin))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
