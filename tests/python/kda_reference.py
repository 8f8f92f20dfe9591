"""Test helpers: random KDA problems (spec section 2's distribution) and an
independent float64 reference that follows spec section 1 token by token.

Written for these tests with plain torch ops; it shares no code with the
library (neither the C++ oracle nor the chunked algorithm).
"""
from __future__ import annotations

import math

import torch


def make_problem(B=1, T=64, H=2, K=128, V=None, HV=None, seqlens=None, state_dtype=torch.float32,
                 final_dtype="same", device="cpu", seed=0):
    """Inputs drawn as in spec section 2: q, k = L2-normalised N(0,1); v, g, beta ~ N(0,1);
    A_log, dt_bias ~ U(0,1); lower_bound = -5; scale = K^-0.5; initial state 0.1 N(0,1).

    seqlens: a list of lengths (varlen; B = 1, T = their sum). state_dtype: dtype of the
    initial state (None: no initial state). final_dtype: 'same' (state_dtype, fp32 when
    there is no initial state), a dtype, or None (no final state).
    """
    V = K if V is None else V
    HV = H if HV is None else HV
    gen = torch.Generator().manual_seed(seed)
    cu = None
    if seqlens is not None:
        B, T = 1, int(sum(seqlens))
        cu = torch.tensor([0] + list(seqlens), dtype=torch.int64).cumsum(0)
    N = len(seqlens) if seqlens is not None else B

    def normal(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32)

    def l2n(x):
        return x / x.norm(dim=-1, keepdim=True)

    p = dict(
        q=l2n(normal(B, T, H, K)).bfloat16(),
        k=l2n(normal(B, T, H, K)).bfloat16(),
        v=normal(B, T, HV, V).bfloat16(),
        g=normal(B, T, HV, K).bfloat16(),
        beta=normal(B, T, HV).bfloat16(),
        A_log=torch.rand(HV, generator=gen, dtype=torch.float32),
        dt_bias=torch.rand(HV, K, generator=gen, dtype=torch.float32),
        scale=K ** -0.5,
        lower_bound=-5.0,
        initial_state=None if state_dtype is None else (0.1 * normal(N, HV, V, K)).to(state_dtype),
        cu_seqlens=cu,
    )
    if final_dtype == "same":
        final_dtype = state_dtype if state_dtype is not None else torch.float32
    p["final_dtype"] = final_dtype
    p["N"] = N
    for key, val in p.items():
        if isinstance(val, torch.Tensor):
            p[key] = val.to(device)
    return p


def new_outputs(p):
    """Fresh (out, final_state) buffers for problem p, filled with NaN so that any
    element the forward fails to write shows up."""
    v, q = p["v"], p["q"]
    out = torch.full_like(v, float("nan"))
    fs = None
    if p["final_dtype"] is not None:
        fs = torch.full((p["N"], v.shape[2], v.shape[3], q.shape[3]), float("nan"),
                        dtype=p["final_dtype"], device=q.device)
    return out, fs


def reference(p):
    """float64 token-by-token recurrence of spec section 1. Returns (out, final_state)
    in float64, final_state [N, HV, V, K] (always returned)."""
    q, k, v, g, beta = (p[n].double() for n in ("q", "k", "v", "g", "beta"))
    A_log, dt_bias = p["A_log"].double(), p["dt_bias"].double()
    scale, lb = float(p["scale"]), float(p["lower_bound"])
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    rep = HV // H
    # 1. L2 normalisation with eps inside the root; value head hv reads q/k head hv // rep.
    qn = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
    kn = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    qn = qn.repeat_interleave(rep, dim=2)
    kn = kn.repeat_interleave(rep, dim=2)
    # 2. a = lower_bound * sigmoid(exp(A_log) * (g + dt_bias)); decay exp(a).
    a = lb * torch.sigmoid(torch.exp(A_log)[:, None] * (g + dt_bias))
    decay = torch.exp(a)
    # 3. b = sigmoid(beta).
    b = torch.sigmoid(beta)

    if p["cu_seqlens"] is not None:
        cu = p["cu_seqlens"].cpu().tolist()
        seqs = [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]
    else:
        seqs = [(r, 0, T) for r in range(B)]
    out = torch.zeros(B, T, HV, V, dtype=torch.float64, device=q.device)
    final = torch.zeros(len(seqs), HV, V, K, dtype=torch.float64, device=q.device)
    s0 = p["initial_state"]
    for n, (row, start, end) in enumerate(seqs):
        S = s0[n].double().clone() if s0 is not None else torch.zeros(HV, V, K, dtype=torch.float64,
                                                                        device=q.device)
        for t in range(start, end):
            kt, qt = kn[row, t], qn[row, t]                             # [HV, K]
            S = S * decay[row, t][:, None, :]                            # 4. decay every key column
            Sk = torch.einsum("hvk,hk->hv", S, kt)
            S = S + b[row, t][:, None, None] * (v[row, t] - Sk)[:, :, None] * kt[:, None, :]  # 5. delta write
            out[row, t] = scale * torch.einsum("hvk,hk->hv", S, qt)    # 6. read the updated state
        final[n] = S
    return out, final


def rel_rms(x, ref):
    """||x - ref||_2 / ||ref||_2 in float64 (NaN anywhere gives NaN, which fails any bar)."""
    x, ref = x.double(), ref.double()
    num = torch.linalg.vector_norm(x - ref).item()
    den = torch.linalg.vector_norm(ref).item()
    return num / den if den > 0 else num


def fwd_kwargs(p):
    """The keyword arguments of flash_kda.fwd for problem p (without out/final_state)."""
    return dict(A_log=p["A_log"], dt_bias=p["dt_bias"], lower_bound=p["lower_bound"],
                initial_state=p["initial_state"], cu_seqlens=p["cu_seqlens"])


def bf16_rounding_floor():
    """Relative RMS error that rounding to bf16 alone gives (8 significant bits, so an
    absolute error uniform in +-ulp/2 with ulp = 2^-7 of the binade): 2^-7/sqrt(12)
    times sqrt(E[1/m^2]) = 0.736 for a log-uniform mantissa m in [1, 2): ~1.66e-3."""
    return 2.0 ** -7 / math.sqrt(12.0) * math.sqrt(0.375 / math.log(2.0))
