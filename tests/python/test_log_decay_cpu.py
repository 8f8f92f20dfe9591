"""g as the log decay and beta as the probability (fla's use_gate_in_kernel=False and
use_beta_sigmoid_in_kernel=False, the form vLLM's Kimi Linear layer calls chunk_kda
with) on CPU tensors: fwd (both CPU backends), decode, segment_summaries, the custom
ops, chunk_kda and fused_recurrent_kda against the float64 reference of
kda_reference.py; the log decay of the safe gate computed outside gives the safe-gate
call; decays of -60 and -1000 a token stay finite and within the bars; a positive log
decay is a ValueError naming g; and fla's flags that flash_kda does not compute are
refused by name.

Bars as in test_cpu.py (relative RMS against float64): out 2e-3 (bf16 rounding ~1.66e-3
plus margin), fp32 state 1e-4, bf16 state 2e-3. The decode runs in float64 and rounds
what it stores once: out 2e-3, fp32 state 1e-6 (as test_fla_compat.py's bars for it).
"""
from __future__ import annotations

import pytest
import torch

import flash_kda
from kda_reference import (fwd_kwargs, make_log_decay_problem, make_problem, new_outputs, reference, rel_rms,
                           safe_gate_log_decay, softplus_gate)

OUT_BAR = 2e-3
STATE_BAR_FP32 = 1e-4
STATE_BAR_BF16 = 2e-3
DECODE_STATE_BAR_FP32 = 1e-6

LOG_DECAY = dict(use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False)
DTYPES = [torch.bfloat16, torch.float32]
BACKENDS = ["cpu", "reference"]
# Decays of e^-60 and e^-1000 a token on two key channels: a 16-token chunk of them
# spans far more than fp32's range.
STRONG = ((0, -60.0), (5, -1000.0))


def run_fwd(p, **extra):
    out, fs = new_outputs(p)
    kw = fwd_kwargs(p)
    kw.update(extra)
    flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, final_state=fs, **kw)
    return out, fs


def assert_bars(p, out, fs, out_bar=OUT_BAR, state_bar=None, label=""):
    assert not torch.isnan(out).any() and (fs is None or not torch.isnan(fs).any()), f"{label}: NaN"
    ref_out, ref_fs = reference(p)
    e_out = rel_rms(out, ref_out)
    assert e_out <= out_bar, f"{label}: out rel RMS {e_out:.3e} > {out_bar}"
    if fs is not None:
        bar = state_bar or (STATE_BAR_FP32 if fs.dtype == torch.float32 else STATE_BAR_BF16)
        e_fs = rel_rms(fs, ref_fs)
        assert e_fs <= bar, f"{label}: final_state rel RMS {e_fs:.3e} > {bar}"
    return ref_out, ref_fs


# ---- fwd -------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("beta_dtype", DTYPES)
@pytest.mark.parametrize("g_dtype", DTYPES)
def test_fwd_log_decay_and_probability_beta_match_the_reference(g_dtype, beta_dtype, backend):
    p = make_log_decay_problem(g_dtype=g_dtype, beta_dtype=beta_dtype, H=2, HV=4, K=32, seqlens=[70, 0, 33, 41],
                               seed=301)
    out, fs = run_fwd(p, backend=backend)
    assert_bars(p, out, fs, label=f"{g_dtype} g, {beta_dtype} beta, {backend}")


@pytest.mark.parametrize("state_dtype", [torch.bfloat16, None])
def test_fwd_log_decay_with_other_states_and_batches(state_dtype):
    # A bf16 state (its own bar), no initial state, and a batch of equal rows.
    p = make_log_decay_problem(B=3, T=50, H=1, HV=2, K=64, state_dtype=state_dtype, seed=302)
    out, fs = run_fwd(p)
    assert_bars(p, out, fs, label=f"state {state_dtype}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_log_decay_of_the_safe_gate_is_the_safe_gate_call(backend):
    """g = lower_bound * sigmoid(exp(A_log) * (g + dt_bias)) computed in fp32 torch and
    passed as the log decay gives the safe-gate call, and sigmoid(beta) passed as b gives
    the logit call: each within the bars of the float64 reference, and of one another."""
    p = make_problem(H=2, HV=4, K=32, seqlens=[90, 17, 64], seed=303)
    safe_out, safe_fs = run_fwd(p, backend=backend)
    assert_bars(p, safe_out, safe_fs, label="safe gate")
    a = safe_gate_log_decay(p)
    b = torch.sigmoid(p["beta"].float())
    for label, changes in [("log decay g", dict(g=a, use_gate_in_kernel=False)),
                           ("probability beta", dict(beta=b, use_beta_sigmoid_in_kernel=False)),
                           ("both", dict(g=a, beta=b, **LOG_DECAY))]:
        q = dict(p, **changes)
        out, fs = run_fwd(q, backend=backend)
        assert_bars(q, out, fs, label=label)
        assert rel_rms(out, safe_out) <= OUT_BAR, label
        assert rel_rms(fs, safe_fs) <= STATE_BAR_FP32, label


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("g_dtype", DTYPES)
@pytest.mark.parametrize("gate", ["safe", "softplus"])
def test_strong_decays_stay_finite_and_within_the_bars(gate, g_dtype, backend):
    p = make_log_decay_problem(g_dtype=g_dtype, gate=gate, strong=STRONG, H=2, K=32, seqlens=[100, 37], seed=304)
    assert p["g"].min().item() == -1000.0
    out, fs = run_fwd(p, backend=backend)
    assert_bars(p, out, fs, label=f"{gate} gate, {g_dtype} g, {backend}")
    # The strongly decayed key columns hold only what the last token wrote.
    assert fs[..., 5].abs().max().item() < 10.0


def test_fp32_beta_logits_with_the_in_kernel_sigmoid():
    p = make_problem(H=2, HV=4, K=32, seqlens=[60, 45], seed=305)
    p["beta"] = torch.randn(p["beta"].shape, generator=torch.Generator().manual_seed(306))
    assert p["beta"].dtype == torch.float32
    for backend in BACKENDS:
        out, fs = run_fwd(p, backend=backend)
        assert_bars(p, out, fs, label=backend)
    # The same logits rounded to bf16 are another input: the fp32 ones are read as given.
    bf = dict(p, beta=p["beta"].bfloat16())
    out_bf, _ = run_fwd(bf)
    assert_bars(bf, out_bf, None)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_zero_log_decay_is_taken_and_a_positive_one_is_named(backend):
    p = make_log_decay_problem(H=1, K=32, seqlens=[20, 12], seed=307)
    p["g"][0, 3, 0, 7] = 0.0
    p["g"][0, 4, 0, 8] = -0.0
    out, fs = run_fwd(p, backend=backend)
    assert_bars(p, out, fs)
    p["g"][0, 25, 0, 9] = 0.5
    with pytest.raises(ValueError, match=r"^g: "):
        run_fwd(p, backend=backend)


def test_gate_parameters_and_lower_bound_are_not_read_with_the_log_decay():
    p = make_log_decay_problem(H=2, K=32, seqlens=[40, 9], seed=308)
    out, fs = run_fwd(p)
    for kw in (dict(A_log=None, dt_bias=None), dict(lower_bound=-7.0),
               dict(A_log=torch.zeros(5), dt_bias=torch.zeros(3, dtype=torch.float64))):
        out2, fs2 = run_fwd(p, **kw)
        assert torch.equal(out2, out) and torch.equal(fs2, fs), kw
    assert flash_kda.workspace_size(p["q"], p["k"], p["v"], p["g"], p["beta"], None, out, **LOG_DECAY) == 0


def test_dlpack_path_reads_the_forms_as_the_torch_path():
    # fp32 g and beta read through DLPack (as any other array) give the same call.
    p = make_log_decay_problem(H=2, K=32, seqlens=[19, 30], seed=314)
    out, fs = run_fwd(p)
    previous = flash_kda._set_torch_fast_path(False)
    try:
        out2, fs2 = run_fwd(p)
    finally:
        flash_kda._set_torch_fast_path(previous)
    assert torch.equal(out2, out) and torch.equal(fs2, fs)


def test_dtypes_of_g_and_beta_are_named():
    p = make_log_decay_problem(H=1, K=32, seqlens=[8], seed=309)
    out = torch.empty_like(p["v"])
    args = (p["q"], p["k"], p["v"])
    with pytest.raises(TypeError, match=r"^g: expected dtype bfloat16 or float32 \(the log decay, "
                                        r"use_gate_in_kernel=False\), got float16"):
        flash_kda.fwd(*args, p["g"].half(), p["beta"], None, out, **LOG_DECAY)
    with pytest.raises(TypeError, match=r"^g: expected dtype bfloat16 \(the raw gate; the log decay, "
                                        r"use_gate_in_kernel=False, may be float32\), got float32"):
        flash_kda.fwd(*args, p["g"], p["beta"], None, out, A_log=p["A_log"], dt_bias=p["dt_bias"])
    with pytest.raises(TypeError, match=r"^beta: expected dtype bfloat16 or float32, got float64"):
        flash_kda.fwd(*args, p["g"], p["beta"].double(), None, out, **LOG_DECAY)
    with pytest.raises(TypeError, match=r"^A_log: expected a tensor, got None"):
        flash_kda.fwd(*args, p["g"].bfloat16(), p["beta"], None, out, use_beta_sigmoid_in_kernel=False)
    for name in ("use_gate_in_kernel", "use_beta_sigmoid_in_kernel"):
        with pytest.raises(TypeError, match=rf"^{name}: expected bool, got int 0"):
            flash_kda.fwd(*args, p["g"], p["beta"], None, out, **dict(LOG_DECAY, **{name: 0}))
        with pytest.raises(TypeError, match=rf"^{name}: expected bool, got NoneType"):
            flash_kda.decode(p["q"][0], p["k"][0], p["v"][0], p["g"][0], p["beta"][0], None, None,
                             torch.zeros(1, 1, 32, 32), torch.tensor([0]), cu_seqlens=p["cu_seqlens"],
                             **dict(LOG_DECAY, **{name: None}))


def test_state_pool_and_checkpoints_with_the_log_decay():
    # The serving prefill: final states into pool slots, checkpoints every 16 tokens.
    p = make_log_decay_problem(H=2, K=32, seqlens=[40, 23], strong=STRONG, seed=310)
    out_ref, fs_ref = run_fwd(p)
    pool = torch.zeros(4, 2, 32, 32)
    pool[3], pool[1] = p["initial_state"][0], p["initial_state"][1]
    ck = torch.zeros(3 + 2, 2, 32, 32)
    out = torch.empty_like(p["v"])
    flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, cu_seqlens=p["cu_seqlens"],
                  state_pool=pool, state_indices=torch.tensor([3, 1]), checkpoints=ck, checkpoint_interval=16,
                  checkpoints_value_major=True, **LOG_DECAY)
    assert torch.equal(out, out_ref) and torch.equal(pool[3], fs_ref[0]) and torch.equal(pool[1], fs_ref[1])
    assert torch.equal(ck[0], p["initial_state"][0]) and torch.equal(ck[3], p["initial_state"][1])
    prefix = dict(p, cu_seqlens=torch.tensor([0, 16]), initial_state=p["initial_state"][:1],
                  **{n: p[n][:, :16] for n in ("q", "k", "v", "g", "beta")})
    assert rel_rms(ck[1], reference(prefix)[1][0]) <= STATE_BAR_FP32


# ---- segment summaries and the custom ops -----------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_segment_summaries_of_the_log_decay_are_the_safe_gates(backend):
    # A slow safe gate (a ~ -3e-5 a token) keeps M away from 0; its log decay computed
    # outside gives the same summaries, and strong channels keep them finite.
    p = make_problem(H=1, HV=2, K=32, seqlens=[50, 30], seed=311)
    p["g"] = torch.full_like(p["g"], -12.0)
    p["A_log"], p["dt_bias"] = torch.zeros_like(p["A_log"]), torch.zeros_like(p["dt_bias"])
    seg = torch.tensor([[0, 20], [20, 50], [50, 80], [60, 60]])
    args = (p["q"], p["k"], p["v"])
    M, B = flash_kda.segment_summaries(*args, p["g"], p["beta"], p["A_log"], p["dt_bias"], seg,
                                       cu_seqlens=p["cu_seqlens"], backend=backend)
    a, b = safe_gate_log_decay(p), torch.sigmoid(p["beta"].float())
    M2, B2 = flash_kda.segment_summaries(*args, a, b, None, None, seg, cu_seqlens=p["cu_seqlens"], backend=backend,
                                         **LOG_DECAY)
    assert rel_rms(M2, M) <= 1e-5 and rel_rms(B2, B) <= 1e-5
    a[..., 0], a[..., 5] = -60.0, -1000.0
    M3, B3 = flash_kda.segment_summaries(*args, a, b, None, None, seg, cu_seqlens=p["cu_seqlens"], backend=backend,
                                         **LOG_DECAY)
    assert torch.isfinite(M3).all() and torch.isfinite(B3).all()
    # The composed summaries of a sequence map its initial state to the straight run's final state.
    q = dict(p, g=a, beta=b, **LOG_DECAY)
    _, fs_ref = reference(q)
    S = p["initial_state"][0].double() @ M3[0].double() + B3[0].double()
    S = S @ M3[1].double() + B3[1].double()
    assert rel_rms(S, fs_ref[0]) <= STATE_BAR_FP32


def test_custom_ops_take_the_log_decay():
    p = make_log_decay_problem(H=2, K=32, seqlens=[30, 11], seed=312)
    out_ref, fs_ref = run_fwd(p)
    o, s = flash_kda.kda_forward(p["q"], p["k"], p["v"], p["g"], p["beta"], None, None,
                                 initial_state=p["initial_state"], cu_seqlens=p["cu_seqlens"],
                                 output_final_state=True, **LOG_DECAY)
    assert torch.equal(o, out_ref) and torch.equal(s, fs_ref)
    pool = p["initial_state"].clone()
    o = flash_kda.kda_prefill(p["q"], p["k"], p["v"], p["g"], p["beta"], None, None, pool, torch.tensor([0, 1]),
                              cu_seqlens=p["cu_seqlens"], **LOG_DECAY)
    assert torch.equal(o, out_ref) and torch.equal(pool, fs_ref)
    pool = p["initial_state"].clone()
    o = flash_kda.kda_decode(p["q"][0], p["k"][0], p["v"][0], p["g"][0], p["beta"][0], None, None, pool,
                             torch.tensor([0, 1]), cu_seqlens=p["cu_seqlens"], **LOG_DECAY)
    assert rel_rms(o, out_ref[0]) <= OUT_BAR and rel_rms(pool, fs_ref) <= STATE_BAR_FP32
    with pytest.raises(TypeError, match=r"^A_log: expected a torch.Tensor, got NoneType"):
        flash_kda.kda_forward(p["q"], p["k"], p["v"], p["g"].bfloat16(), p["beta"], None, None)
    with pytest.raises(TypeError, match=r"^use_gate_in_kernel: expected a bool, got int"):
        flash_kda.kda_forward(p["q"], p["k"], p["v"], p["g"], p["beta"], None, None, use_gate_in_kernel=0)


@pytest.mark.skipif(not hasattr(torch.library, "opcheck"), reason="torch.library.opcheck needs torch >= 2.4")
def test_opcheck_with_the_log_decay():
    p = make_log_decay_problem(H=2, K=32, seqlens=[5, 11], seed=313)
    args = (p["q"], p["k"], p["v"], p["g"], p["beta"], None, None, p["initial_state"], p["cu_seqlens"],
            float(p["scale"]), -5.0, True, torch.float32, False, False)
    torch.library.opcheck(torch.ops.flash_kda.kda_forward.default, args)


# ---- decode --------------------------------------------------------------------------------

def decode_on_pool(p, slots, P=6, **kw):
    """flash_kda.decode of problem p ([1, T] tokens, cu_seqlens) with sequence n's initial
    state in slot slots[n] of a P-slot pool. Returns (out [1, T, HV, V], final states [N, ...])."""
    N, HV, V, K = p["N"], p["v"].shape[2], p["v"].shape[3], p["q"].shape[3]
    pool = torch.full((P, HV, V, K), 7.0, dtype=p["initial_state"].dtype)
    for n, s in enumerate(slots):
        pool[s] = p["initial_state"][n]
    out = flash_kda.decode(*(p[x][0] for x in ("q", "k", "v", "g", "beta")), p["A_log"], p["dt_bias"], pool,
                           torch.tensor(slots), scale=p["scale"], lower_bound=p["lower_bound"],
                           cu_seqlens=p["cu_seqlens"], **kw)
    return out[None], pool[torch.tensor(slots)]


@pytest.mark.parametrize("beta_dtype", DTYPES)
@pytest.mark.parametrize("g_dtype", DTYPES)
def test_decode_log_decay_and_probability_beta_match_the_reference(g_dtype, beta_dtype):
    p = make_log_decay_problem(g_dtype=g_dtype, beta_dtype=beta_dtype, H=2, HV=4, K=32, seqlens=[1, 3, 0, 2],
                               seed=320)
    out, fs = decode_on_pool(p, [4, 0, 2, 5], **LOG_DECAY)
    assert_bars(p, out, fs, state_bar=DECODE_STATE_BAR_FP32)
    # A and dt_bias given are not read.
    out2, fs2 = decode_on_pool(dict(p, A_log=None, dt_bias=None), [4, 0, 2, 5], **LOG_DECAY)
    assert torch.equal(out2, out) and torch.equal(fs2, fs)


def test_decode_strong_decays_fp32_beta_logits_and_a_positive_log_decay():
    p = make_log_decay_problem(gate="softplus", strong=STRONG, H=2, K=32, seqlens=[2, 5], seed=321)
    out, fs = decode_on_pool(p, [1, 3], **LOG_DECAY)
    assert_bars(p, out, fs, state_bar=DECODE_STATE_BAR_FP32)
    # fp32 logits with the in-kernel sigmoid.
    q = dict(make_problem(H=2, K=32, seqlens=[2, 5], seed=322))
    q["beta"] = torch.randn(q["beta"].shape, generator=torch.Generator().manual_seed(323))
    out, fs = decode_on_pool(q, [0, 2])
    assert_bars(q, out, fs, state_bar=DECODE_STATE_BAR_FP32)
    p["g"][0, 6, 1, 0] = 1e-3
    with pytest.raises(ValueError, match=r"^g: "):
        decode_on_pool(p, [1, 3], **LOG_DECAY)


# ---- fla's entry points ------------------------------------------------------------------

def fla_state(s, state_v_first):
    """A state [N, HV, V, K] in fla's layout."""
    return s if state_v_first else s.transpose(-1, -2).contiguous()


@pytest.mark.parametrize("entry", ["chunk_kda", "fused_recurrent_kda"])
@pytest.mark.parametrize("state_v_first", [False, True])
@pytest.mark.parametrize("g_dtype,beta_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                                (torch.float32, torch.bfloat16)])
def test_flas_entry_points_with_flas_default_forms(entry, state_v_first, g_dtype, beta_dtype):
    """fla's defaults, use_gate_in_kernel=False and use_beta_sigmoid_in_kernel=False, need
    no flag: only use_qk_l2norm_in_kernel=True."""
    p = make_log_decay_problem(g_dtype=g_dtype, beta_dtype=beta_dtype, H=2, HV=4, K=32, seqlens=[45, 0, 20],
                               seed=330)
    fn = getattr(flash_kda, entry)
    o, fs = fn(p["q"], p["k"], p["v"], p["g"], p["beta"], scale=p["scale"],
               initial_state=fla_state(p["initial_state"], state_v_first), output_final_state=True,
               use_qk_l2norm_in_kernel=True, state_v_first=state_v_first, cu_seqlens=p["cu_seqlens"])
    assert fs.dtype == torch.float32
    assert_bars(p, o, fs if state_v_first else fs.transpose(-1, -2),
                state_bar=STATE_BAR_FP32 if entry == "chunk_kda" else DECODE_STATE_BAR_FP32)


def test_flas_gate_arguments_are_not_read_with_the_log_decay():
    # fla reads A_log, dt_bias, lower_bound and safe_gate only for its in-kernel gate.
    p = make_log_decay_problem(H=2, K=32, seqlens=[30, 20], seed=331)
    args = (p["q"], p["k"], p["v"], p["g"], p["beta"])
    base = dict(initial_state=fla_state(p["initial_state"], False), output_final_state=True,
                use_qk_l2norm_in_kernel=True, cu_seqlens=p["cu_seqlens"])
    A = p["A_log"].clone().requires_grad_()
    for fn in (flash_kda.chunk_kda, flash_kda.fused_recurrent_kda):
        o, fs = fn(*args, **base)
        extra = dict(A_log=A, dt_bias=torch.ones(3), lower_bound=-9.0)
        if fn is flash_kda.chunk_kda:
            extra["safe_gate"] = True
        o2, fs2 = fn(*args, **base, **extra)
        assert torch.equal(o2, o) and torch.equal(fs2, fs), fn.__name__


@pytest.mark.parametrize("entry", ["chunk_kda", "fused_recurrent_kda"])
def test_flas_forms_mixed(entry):
    # The raw safe gate with beta as b, and the log decay with beta as logits.
    p = make_problem(H=2, K=32, seqlens=[33, 12], seed=332)
    fn = getattr(flash_kda, entry)
    kw = dict(scale=p["scale"], initial_state=p["initial_state"], output_final_state=True, state_v_first=True,
              use_qk_l2norm_in_kernel=True, cu_seqlens=p["cu_seqlens"])
    bar = STATE_BAR_FP32 if entry == "chunk_kda" else DECODE_STATE_BAR_FP32
    b = torch.sigmoid(p["beta"].float())
    o, fs = fn(p["q"], p["k"], p["v"], p["g"], b, A_log=p["A_log"], dt_bias=p["dt_bias"].flatten(),
               use_gate_in_kernel=True, lower_bound=-5.0, **kw)
    assert_bars(dict(p, beta=b, use_beta_sigmoid_in_kernel=False), o, fs, state_bar=bar)
    a = safe_gate_log_decay(p)
    o, fs = fn(p["q"], p["k"], p["v"], a, p["beta"], use_beta_sigmoid_in_kernel=True, **kw)
    assert_bars(dict(p, g=a, use_gate_in_kernel=False), o, fs, state_bar=bar)


@pytest.mark.parametrize("entry", ["chunk_kda", "fused_recurrent_kda"])
def test_positive_log_decay_through_flas_entry_points_is_named(entry):
    p = make_log_decay_problem(H=1, K=32, seqlens=[10, 6], seed=333)
    p["g"][0, 12, 0, 3] = 0.25
    with pytest.raises(ValueError, match=r"^g: "):
        getattr(flash_kda, entry)(p["q"], p["k"], p["v"], p["g"], p["beta"], use_qk_l2norm_in_kernel=True,
                                  cu_seqlens=p["cu_seqlens"])


@pytest.mark.parametrize("entry", ["chunk_kda", "fused_recurrent_kda"])
@pytest.mark.parametrize("kw,err,match", [
    (dict(use_qk_l2norm_in_kernel=False), NotImplementedError, r"requires use_qk_l2norm_in_kernel=True, got False"),
    (dict(allow_neg_eigval=True, use_beta_sigmoid_in_kernel=True), NotImplementedError,
     r"requires allow_neg_eigval=False, got True"),
    (dict(allow_neg_eigval=True), ValueError, r"^allow_neg_eigval: True requires use_beta_sigmoid_in_kernel=True"),
])
def test_what_flash_kda_does_not_compute_is_named(entry, kw, err, match):
    p = make_log_decay_problem(H=1, K=32, seqlens=[10], seed=334)
    args = dict(use_qk_l2norm_in_kernel=True, A_log=p["A_log"], dt_bias=p["dt_bias"], cu_seqlens=p["cu_seqlens"])
    args.update(kw)
    with pytest.raises(err, match=match):
        getattr(flash_kda, entry)(p["q"], p["k"], p["v"], p["g"], p["beta"], **args)


@pytest.mark.parametrize("entry", ["chunk_kda", "fused_recurrent_kda"])
@pytest.mark.parametrize("given", ["both", "neither"])
def test_fla_softplus_gate_is_formed_outside(entry, given):
    """fla's in-kernel gate without lower_bound, -exp(A_log) * softplus(g + dt_bias) (which no
    flash_kda kernel computes), is formed in torch and passed as the log decay: bitwise the call
    with that log decay given (a missing A_log and dt_bias are 0, as in fla's gate), and within
    the bars of the float64 reference of that gate."""
    p = make_log_decay_problem(gate="softplus", H=2, HV=4, K=32, seqlens=[21, 0, 40], seed=336)
    g_raw = p["g_raw"]
    A_log = p["A_log"] if given == "both" else None
    dt_bias = p["dt_bias"] if given == "both" else None
    a = softplus_gate(g_raw, A_log if A_log is not None else torch.zeros_like(p["A_log"]),
                      dt_bias if dt_bias is not None else torch.zeros_like(p["dt_bias"]))
    common = dict(use_qk_l2norm_in_kernel=True, cu_seqlens=p["cu_seqlens"])
    call = getattr(flash_kda, entry)
    with torch.inference_mode():
        o_raw, _ = call(p["q"], p["k"], p["v"], g_raw, p["beta"], use_gate_in_kernel=True, A_log=A_log,
                        dt_bias=dt_bias, **common)
        o_log, _ = call(p["q"], p["k"], p["v"], a, p["beta"], **common)
    assert torch.equal(o_raw, o_log)
    ref_out, _ = reference(dict(p, g=a, initial_state=None))  # the calls above start from zero
    assert rel_rms(o_raw, ref_out) <= OUT_BAR


@pytest.mark.parametrize("entry", ["chunk_kda", "fused_recurrent_kda"])
@pytest.mark.parametrize("name,value,err,match", [
    ("A_log", lambda p: p["A_log"][:, None], ValueError, r"^A_log: expected shape \[4\], got \[4, 1\]"),
    ("A_log", lambda p: p["A_log"][:1], ValueError, r"^A_log: expected shape \[4\], got \[1\]"),
    ("A_log", lambda p: p["A_log"].double(), TypeError, r"^A_log: expected dtype torch.float32"),
    ("dt_bias", lambda p: p["dt_bias"][:1], ValueError, r"^dt_bias: expected shape \[4, 32\], got \[1, 32\]"),
    ("g", lambda p: p["g_raw"].half(), TypeError, r"^g: expected dtype torch.bfloat16 or torch.float32"),
])
def test_fla_softplus_gate_operands_are_checked(entry, name, value, err, match):
    """The softplus gate is formed in torch, which would broadcast shapes fwd refuses: each
    operand's shape and dtype are checked first, naming it."""
    p = make_log_decay_problem(gate="softplus", H=2, HV=4, K=32, seqlens=[4], seed=337)
    args = dict(A_log=p["A_log"], dt_bias=p["dt_bias"], g=p["g_raw"])
    args[name] = value(p)
    g = args.pop("g")
    with pytest.raises(err, match=match):
        getattr(flash_kda, entry)(p["q"], p["k"], p["v"], g, p["beta"], use_qk_l2norm_in_kernel=True,
                                  use_gate_in_kernel=True, cu_seqlens=p["cu_seqlens"], **args)


# ---- vLLM's Kimi Linear calls ---------------------------------------------------------------

def kimi_linear_inputs(seqlens, seed, HV=4, H=2, K=32, P=8):
    """What vLLM's Kimi Linear layer holds before its chunk_kda call: the raw gate
    projection, A_log [HV] and dt_bias [HV * K] parameters, the beta projection b, int32
    query_start_loc, and an fp32 state pool [P, HV, K, V] (fla's layout) with the
    sequences' slots and whether each has a state yet."""
    p = make_problem(H=H, HV=HV, K=K, seqlens=seqlens, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    A_log = torch.log(1.0 + 15.0 * torch.rand(HV, generator=gen))  # Kimi Linear's A_log init: log U(1, 16)
    dt_bias = torch.rand(HV * K, generator=gen)
    pool = 0.1 * torch.randn(P, HV, K, K, generator=gen)
    slots = torch.randperm(P, generator=gen)[:len(seqlens)]
    has_state = torch.tensor([n % 3 != 1 for n in range(len(seqlens))])
    return p, A_log, dt_bias, pool, slots, has_state


def kimi_linear_reference(p, g1, beta, initial_state):
    """The float64 reference of the log-decay call; states [N, HV, V, K]."""
    return reference(dict(p, g=g1, beta=beta, initial_state=initial_state, use_gate_in_kernel=False,
                          use_beta_sigmoid_in_kernel=False))


def test_vllm_kimi_linear_prefill_call():
    """vLLM's call as it is: g1 = fused_kda_gate(g, A_log, dt_bias) (fp32, unbounded),
    beta = sigmoid(b.float()), the states gathered from the pool (zero where a sequence has
    none), int32 cu_seqlens, the final states scattered back."""
    seqlens = [37, 1, 0, 80, 16]
    p, A_log, dt_bias, pool, slots, has_state = kimi_linear_inputs(seqlens, seed=340)
    g1 = softplus_gate(p["g"], A_log, dt_bias)
    beta = p["beta"].float().sigmoid()
    cu = p["cu_seqlens"].to(torch.int32)
    initial_state = pool[slots].contiguous()
    initial_state[~has_state, ...] = 0
    with torch.inference_mode():
        o, last_state = flash_kda.chunk_kda(q=p["q"], k=p["k"], v=p["v"], g=g1, beta=beta,
                                            initial_state=initial_state, output_final_state=True,
                                            use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    ref_out, ref_fs = kimi_linear_reference(p, g1, beta, initial_state.transpose(-1, -2))
    assert o.shape == p["v"].shape and o.dtype == torch.bfloat16
    assert last_state.shape == initial_state.shape and last_state.dtype == torch.float32
    assert rel_rms(o, ref_out) <= OUT_BAR
    assert rel_rms(last_state, ref_fs.transpose(-1, -2)) <= STATE_BAR_FP32
    assert g1.min().item() < -20.0, "the softplus gate reaches strong decays"

    # The same on flash_kda's pool form: slots [P, HV, V, K] read and written in place.
    vpool = pool.transpose(-1, -2).contiguous()
    idx = torch.where(has_state, slots, -1)
    slot_o, _ = flash_kda.chunk_kda(q=p["q"], k=p["k"], v=p["v"], g=g1, beta=beta, initial_state=vpool,
                                    use_qk_l2norm_in_kernel=True, cu_seqlens=cu, state_v_first=True,
                                    initial_state_indices=idx)
    assert torch.equal(slot_o, o)
    for n, s in enumerate(slots.tolist()):
        if has_state[n]:
            assert torch.equal(vpool[s], last_state[n].transpose(-1, -2)), f"slot {s}"


def test_vllm_kimi_linear_decode_call():
    """The decode step (fla's serving fused_recurrent_kda): one token a sequence, the
    log decay and b, the pool's slots updated in place; a padding entry untouched."""
    seqlens = [1, 1, 1, 1]
    p, A_log, dt_bias, pool, slots, _ = kimi_linear_inputs(seqlens, seed=341)
    g1 = softplus_gate(p["g"], A_log, dt_bias)
    beta = p["beta"].float().sigmoid()
    vpool = pool.transpose(-1, -2).contiguous()
    before = vpool.clone()
    idx = slots.clone().to(torch.int32)
    idx[2] = -1
    o, fs = flash_kda.fused_recurrent_kda(q=p["q"], k=p["k"], v=p["v"], g=g1, beta=beta, initial_state=vpool,
                                          use_qk_l2norm_in_kernel=True, cu_seqlens=p["cu_seqlens"].to(torch.int32),
                                          ssm_state_indices=idx, inplace_final_state=True, state_v_first=True)
    assert fs is vpool
    s0 = before[slots]
    ref_out, ref_fs = kimi_linear_reference(p, g1, beta, s0)
    live = [0, 1, 3]
    assert rel_rms(o[0, live], ref_out[0, live]) <= OUT_BAR and torch.all(o[0, 2] == 0)
    assert rel_rms(vpool[slots[live]], ref_fs[live]) <= DECODE_STATE_BAR_FP32
    assert torch.equal(vpool[slots[2]], before[slots[2]])
