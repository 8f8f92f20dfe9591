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
    in float64, final_state [N, HV, V, K] (always returned).

    p["use_gate_in_kernel"] False (default True): g is the log decay a itself (fla's
    use_gate_in_kernel=False; A_log, dt_bias and lower_bound are not read).
    p["use_beta_sigmoid_in_kernel"] False (default True): beta is b itself."""
    q, k, v, g, beta = (p[n].double() for n in ("q", "k", "v", "g", "beta"))
    scale = float(p["scale"])
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    rep = HV // H
    # 1. L2 normalisation with eps inside the root; value head hv reads q/k head hv // rep.
    qn = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
    kn = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    qn = qn.repeat_interleave(rep, dim=2)
    kn = kn.repeat_interleave(rep, dim=2)
    # 2. a = lower_bound * sigmoid(exp(A_log) * (g + dt_bias)), or g itself; decay exp(a).
    if p.get("use_gate_in_kernel", True):
        A_log, dt_bias, lb = p["A_log"].double(), p["dt_bias"].double(), float(p["lower_bound"])
        a = lb * torch.sigmoid(torch.exp(A_log)[:, None] * (g + dt_bias))
    else:
        a = g
    decay = torch.exp(a)
    # 3. b = sigmoid(beta), or beta itself.
    b = torch.sigmoid(beta) if p.get("use_beta_sigmoid_in_kernel", True) else beta

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
    kw = dict(A_log=p["A_log"], dt_bias=p["dt_bias"], lower_bound=p["lower_bound"],
              initial_state=p["initial_state"], cu_seqlens=p["cu_seqlens"])
    for flag in ("use_gate_in_kernel", "use_beta_sigmoid_in_kernel"):
        if flag in p:
            kw[flag] = p[flag]
    return kw


def safe_gate_log_decay(p):
    """The safe gate of problem p computed outside, in fp32: lower_bound *
    sigmoid(exp(A_log) * (g + dt_bias)), the log decay the kernel computes inside."""
    g = p["g"].float()
    return p["lower_bound"] * torch.sigmoid(torch.exp(p["A_log"])[:, None] * (g + p["dt_bias"]))


def softplus_gate(g_raw, A_log, dt_bias):
    """fla's fused_kda_gate without lower_bound, in fp32 torch (what vLLM's Kimi Linear
    layer passes chunk_kda): -exp(A_log) * softplus(g_raw + dt_bias)."""
    HV, K = g_raw.shape[-2:]
    x = g_raw.float() + dt_bias.float().reshape(HV, K)
    return -torch.exp(A_log.float())[:, None] * torch.nn.functional.softplus(x)


def make_log_decay_problem(g_dtype=torch.float32, beta_dtype=torch.float32, gate="safe", strong=(), **shape):
    """make_problem(**shape) with g the log decay (use_gate_in_kernel=False) in g_dtype and
    beta the probability b (use_beta_sigmoid_in_kernel=False) in beta_dtype.

    gate: 'safe' (lower_bound * sigmoid(exp(A_log) * (g + dt_bias)), in [-5, 0)) or
    'softplus' (fla's fused_kda_gate, -exp(A_log) * softplus(g + dt_bias), unbounded below,
    with A_log ~ log U(1, 16) as Kimi Linear initialises it). strong: (channel, log decay)
    pairs written into every token and head, e.g. ((0, -60.0), (5, -1000.0)).
    The reference reads the tensors as given (the flags are in the problem)."""
    device = shape.pop("device", "cpu")
    p = make_problem(device="cpu", **shape)
    if gate == "safe":
        a = safe_gate_log_decay(p)
    elif gate == "softplus":
        gen = torch.Generator().manual_seed(shape.get("seed", 0) + 101)
        p["A_log"] = torch.log(1.0 + 15.0 * torch.rand(p["A_log"].shape, generator=gen))
        a = softplus_gate(p["g"], p["A_log"], p["dt_bias"])
    else:
        raise ValueError(f"gate: expected 'safe' or 'softplus', got {gate!r}")
    for channel, value in strong:
        a[..., channel] = value
    p["g_raw"] = p["g"]
    p["g"] = a.to(g_dtype)
    p["beta_logit"] = p["beta"]
    p["beta"] = torch.sigmoid(p["beta"].float()).to(beta_dtype)
    p["use_gate_in_kernel"] = False
    p["use_beta_sigmoid_in_kernel"] = False
    for key, val in p.items():
        if isinstance(val, torch.Tensor):
            p[key] = val.to(device)
    return p


def bf16_rounding_floor():
    """Relative RMS error that rounding to bf16 alone gives (8 significant bits, so an
    absolute error uniform in +-ulp/2 with ulp = 2^-7 of the binade): 2^-7/sqrt(12)
    times sqrt(E[1/m^2]) = 0.736 for a log-uniform mantissa m in [1, 2): ~1.66e-3."""
    return 2.0 ** -7 / math.sqrt(12.0) * math.sqrt(0.375 / math.log(2.0))


# ---- degenerate keys ---------------------------------------------------------------------
#
# Inputs a model produces on repeated tokens, where the chunked algorithm's 16x16 inverse
# (I + L)^-1 is at its worst: inside a chunk L_ij = b_i (k_i . k_j) 2^(G_i - G_j) tends to
# +-1 when keys are (nearly) parallel or anti-parallel, b = sigmoid(beta) -> 1 and the gate
# barely decays. (The C++ tests draw the same class: tests/common/degenerate_problem.h.)

#: (name, keyword arguments of make_degenerate_problem): the class the tests sweep.
DEGENERATE_CASES = [
    ("collinear eps=0 b=1 slow", dict(keys="collinear", eps=0.0)),
    ("collinear eps=1e-3 b=1 slow", dict(keys="collinear", eps=1e-3)),
    ("collinear eps=1e-2 b=1 slow", dict(keys="collinear", eps=1e-2)),
    ("collinear eps=0.1 b=1 slow", dict(keys="collinear", eps=0.1)),
    ("collinear eps=0.3 b=1 slow", dict(keys="collinear", eps=0.3)),
    ("collinear eps=0 b=0.5 slow", dict(keys="collinear", eps=0.0, beta_logit=0.0)),
    ("collinear eps=1e-2 b=0.5 slow", dict(keys="collinear", eps=1e-2, beta_logit=0.0)),
    ("collinear eps=0 b=1 spec-decay", dict(keys="collinear", eps=0.0, slow_decay=False)),
    ("anti-aligned eps=0 b=1 slow", dict(keys="anti", eps=0.0)),
    ("anti-aligned eps=1e-2 b=0.5 slow", dict(keys="anti", eps=1e-2, beta_logit=0.0)),
    ("mixed-chunk b=1 slow", dict(keys="mixed")),
    ("serving-repeat", dict(keys="serving", zero_state=True)),
]

SLOW_GATE = -12.0  # with A_log = 0, dt_bias = 0: a = -5 sigmoid(-12) ~ -3e-5 per token


def make_degenerate_problem(keys="collinear", eps=0.0, beta_logit=8.0, slow_decay=True, zero_state=False,
                            device="cpu", seed=0, **shape):
    """make_problem(**shape), then keys, gates and betas overwritten by the pattern:
    collinear (k_t = d_h + eps noise), anti (+-d_h alternating, + eps noise), mixed (even
    tokens d_h, odd tokens random), serving (q = k = d_h for every token, v = one 16-token
    block repeated: the serving engine's regression input). beta = beta_logit everywhere;
    slow_decay: gate -12, A_log 0, dt_bias 0; zero_state: a zero initial state."""
    p = make_problem(device="cpu", seed=seed, **shape)
    gen = torch.Generator().manual_seed(seed * 7919 + 17)
    q, k, v = p["q"].float(), p["k"].float(), p["v"].float()
    B, T, H, K = k.shape
    d = torch.randn(H, K, generator=gen)
    d = d / d.norm(dim=-1, keepdim=True)
    kk = d.expand(B, T, H, K).clone()
    t = torch.arange(T)
    if keys == "anti":
        kk = kk * torch.where(t % 2 == 1, -1.0, 1.0)[None, :, None, None]
    if eps > 0:
        kk = kk + eps / K ** 0.5 * torch.randn(B, T, H, K, generator=gen)
    if keys == "mixed":
        fresh = torch.randn(B, T, H, K, generator=gen) / K ** 0.5
        kk = torch.where((t % 2 == 1)[None, :, None, None], fresh, kk)
    if keys == "serving":
        q = kk
        block = torch.randn(16, v.shape[2], v.shape[3], generator=gen)
        v = block[t % 16].expand(B, T, v.shape[2], v.shape[3])
    p["k"], p["q"], p["v"] = kk.bfloat16(), q.bfloat16(), v.bfloat16()
    p["beta"] = torch.full_like(p["beta"], beta_logit)
    if slow_decay:
        p["g"] = torch.full_like(p["g"], SLOW_GATE)
        p["A_log"] = torch.zeros_like(p["A_log"])
        p["dt_bias"] = torch.zeros_like(p["dt_bias"])
    if zero_state and p["initial_state"] is not None:
        p["initial_state"] = torch.zeros_like(p["initial_state"])
    for key, val in p.items():
        if isinstance(val, torch.Tensor):
            p[key] = val.to(device)
    return p
