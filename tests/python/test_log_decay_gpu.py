"""g as the log decay and beta as the probability (fla's use_gate_in_kernel=False and
use_beta_sigmoid_in_kernel=False) on CUDA tensors: fwd, decode, chunk_kda and
fused_recurrent_kda against the float64 reference of kda_reference.py, strong decays,
a positive log decay reported by check_device_faults, vLLM's Kimi Linear call, and fla's
own chunk_kda and fused_recurrent_kda on the same inputs when fla is importable.

Skipped, with the reason, without a CUDA device or when the CUDA backend of flash_kda
cannot run. Bars as in test_gpu.py: out 3.5e-3, fp32 state 2.5e-3, bf16 state 3.5e-3
(relative RMS against float64); two results each within them differ by at most sqrt(2)
times them.
"""
from __future__ import annotations

import pytest
import torch

import flash_kda
from gpu_skip import requires_cuda_backend
from kda_reference import (fwd_kwargs, make_log_decay_problem, make_problem, new_outputs, reference, rel_rms,
                           safe_gate_log_decay, softplus_gate)

OUT_BAR = 3.5e-3
STATE_BAR_FP32 = 2.5e-3
STATE_BAR_BF16 = 3.5e-3

pytestmark = requires_cuda_backend

LOG_DECAY = dict(use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False)
DTYPES = [torch.bfloat16, torch.float32]
STRONG = ((0, -60.0), (5, -1000.0))
SEQLENS = [300, 17, 0, 129]


def run_fwd(p, **extra):
    out, fs = new_outputs(p)
    kw = fwd_kwargs(p)
    kw.update(extra)
    flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, final_state=fs, **kw)
    torch.cuda.synchronize()
    return out, fs


def assert_bars(p, out, fs, label=""):
    torch.cuda.synchronize()
    assert not torch.isnan(out).any() and (fs is None or not torch.isnan(fs).any()), f"{label}: NaN"
    ref_out, ref_fs = reference(p)
    e_out = rel_rms(out, ref_out)
    e_fs = rel_rms(fs, ref_fs) if fs is not None else 0.0
    bar_fs = STATE_BAR_FP32 if fs is None or fs.dtype == torch.float32 else STATE_BAR_BF16
    print(f"{label}: out {e_out:.3e} state {e_fs:.3e}")
    assert e_out <= OUT_BAR, f"{label}: out rel RMS {e_out:.3e} > {OUT_BAR}"
    assert e_fs <= bar_fs, f"{label}: final_state rel RMS {e_fs:.3e} > {bar_fs}"
    return ref_out, ref_fs


@pytest.fixture(autouse=True)
def no_device_faults_left():
    # A test that leaves a fault recorded would fail the next check_device_faults elsewhere.
    yield
    try:
        flash_kda.check_device_faults()
    except ValueError:
        pass


# ---- fwd ---------------------------------------------------------------------------------

@pytest.mark.parametrize("K", [128, 64])
@pytest.mark.parametrize("beta_dtype", DTYPES)
@pytest.mark.parametrize("g_dtype", DTYPES)
def test_fwd_log_decay_and_probability_beta_match_the_reference(g_dtype, beta_dtype, K):
    p = make_log_decay_problem(g_dtype=g_dtype, beta_dtype=beta_dtype, H=2, HV=4, K=K, seqlens=SEQLENS, seed=401,
                               device="cuda")
    out, fs = run_fwd(p)
    assert_bars(p, out, fs, label=f"K={K} {g_dtype} g, {beta_dtype} beta")


def test_fwd_log_decay_one_long_sequence_and_bf16_states():
    # One long sequence at few heads (the launch cuts it into segments) and a bf16 state.
    p = make_log_decay_problem(H=1, HV=2, seqlens=[6000], state_dtype=torch.bfloat16, seed=402, device="cuda")
    out, fs = run_fwd(p)
    assert_bars(p, out, fs, label="long sequence, bf16 state")


def test_log_decay_of_the_safe_gate_is_the_safe_gate_call():
    p = make_problem(H=2, HV=4, seqlens=SEQLENS, seed=403, device="cuda")
    safe_out, safe_fs = run_fwd(p)
    assert_bars(p, safe_out, safe_fs, label="safe gate")
    a = safe_gate_log_decay(p)
    b = torch.sigmoid(p["beta"].float())
    for label, changes in [("log decay g", dict(g=a, use_gate_in_kernel=False)),
                           ("probability beta", dict(beta=b, use_beta_sigmoid_in_kernel=False)),
                           ("both", dict(g=a, beta=b, **LOG_DECAY))]:
        q = dict(p, **changes)
        out, fs = run_fwd(q)
        assert_bars(q, out, fs, label=label)
        assert rel_rms(out, safe_out) <= 2 ** 0.5 * OUT_BAR, label
        assert rel_rms(fs, safe_fs) <= 2 ** 0.5 * STATE_BAR_FP32, label


@pytest.mark.parametrize("g_dtype", DTYPES)
@pytest.mark.parametrize("gate", ["safe", "softplus"])
def test_strong_decays_stay_finite_and_within_the_bars(gate, g_dtype):
    p = make_log_decay_problem(g_dtype=g_dtype, gate=gate, strong=STRONG, H=2, HV=4, seqlens=SEQLENS, seed=404,
                               device="cuda")
    out, fs = run_fwd(p)
    assert_bars(p, out, fs, label=f"{gate} gate, {g_dtype} g, strong channels")
    flash_kda.check_device_faults()


def test_fp32_beta_logits_with_the_in_kernel_sigmoid():
    p = make_problem(H=2, HV=4, seqlens=SEQLENS, seed=405, device="cuda")
    p["beta"] = torch.randn(p["beta"].shape, generator=torch.Generator().manual_seed(406)).cuda()
    out, fs = run_fwd(p)
    assert_bars(p, out, fs, label="fp32 beta logits")


def test_a_positive_log_decay_is_reported_by_check_device_faults():
    flash_kda.check_device_faults()
    p = make_log_decay_problem(H=1, seqlens=[40, 30], seed=407, device="cuda")
    p["g"][0, 50, 0, 3] = 0.5
    run_fwd(p)
    with pytest.raises(ValueError, match=r"g \(forward"):
        flash_kda.check_device_faults()
    pool = torch.zeros(2, 1, 128, 128, device="cuda")
    flash_kda.decode(*(p[x][0] for x in ("q", "k", "v", "g", "beta")), None, None, pool,
                     torch.tensor([0, 1], device="cuda"), cu_seqlens=p["cu_seqlens"], **LOG_DECAY)
    with pytest.raises(ValueError, match=r"g \(decode"):
        flash_kda.check_device_faults()


# ---- decode --------------------------------------------------------------------------------

@pytest.mark.parametrize("K", [128, 64])
@pytest.mark.parametrize("beta_dtype", DTYPES)
@pytest.mark.parametrize("g_dtype", DTYPES)
def test_decode_log_decay_matches_the_reference(g_dtype, beta_dtype, K):
    p = make_log_decay_problem(g_dtype=g_dtype, beta_dtype=beta_dtype, gate="softplus", strong=STRONG, H=2, HV=4,
                               K=K, seqlens=[1, 3, 0, 2, 1], seed=410, device="cuda")
    slots = torch.tensor([4, 0, 2, 5, 6], device="cuda")
    pool = torch.zeros(8, 4, K, K, device="cuda")
    pool[slots] = p["initial_state"]
    out = flash_kda.decode(*(p[x][0] for x in ("q", "k", "v", "g", "beta")), None, None, pool, slots,
                           cu_seqlens=p["cu_seqlens"], **LOG_DECAY)
    assert_bars(p, out[None], pool[slots], label=f"decode K={K} {g_dtype} g, {beta_dtype} beta")
    # The CPU decode (float64) on the same inputs: the same step.
    cpu_pool = torch.zeros(8, 4, K, K)
    cpu_pool[slots.cpu()] = p["initial_state"].cpu()
    cpu_out = flash_kda.decode(*(p[x][0].cpu() for x in ("q", "k", "v", "g", "beta")), None, None, cpu_pool,
                               slots.cpu(), cu_seqlens=p["cu_seqlens"].cpu(), **LOG_DECAY)
    assert rel_rms(out.cpu(), cpu_out) <= OUT_BAR and rel_rms(pool.cpu(), cpu_pool) <= STATE_BAR_FP32
    flash_kda.check_device_faults()


# ---- fla's entry points and vLLM's calls -----------------------------------------------------

@pytest.mark.parametrize("entry", ["chunk_kda", "fused_recurrent_kda"])
@pytest.mark.parametrize("state_v_first", [False, True])
def test_flas_entry_points_with_flas_default_forms(entry, state_v_first):
    seqlens = SEQLENS if entry == "chunk_kda" else [1, 3, 0, 2]
    p = make_log_decay_problem(gate="softplus", H=2, HV=4, seqlens=seqlens, seed=420, device="cuda")
    s0 = p["initial_state"] if state_v_first else p["initial_state"].transpose(-1, -2).contiguous()
    with torch.inference_mode():
        o, fs = getattr(flash_kda, entry)(p["q"], p["k"], p["v"], p["g"], p["beta"], scale=p["scale"],
                                          initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                                          state_v_first=state_v_first, cu_seqlens=p["cu_seqlens"])
    assert_bars(p, o, fs if state_v_first else fs.transpose(-1, -2), label=f"{entry} state_v_first={state_v_first}")


def kimi_linear(seqlens, seed, K=128, HV=4, H=2, P=8, decay_rate_max=16.0):
    """vLLM's Kimi Linear inputs: the raw gate g, A_log ~ log U(1, decay_rate_max) (16: Kimi
    Linear's initialisation), dt_bias [HV * K], the beta projection, an fp32 state pool
    [P, HV, K, V] with slots; g1 and beta as the layer computes them."""
    p = make_problem(H=H, HV=HV, K=K, seqlens=seqlens, seed=seed, device="cuda")
    gen = torch.Generator().manual_seed(seed + 1)
    A_log = torch.log(1.0 + (decay_rate_max - 1.0) * torch.rand(HV, generator=gen)).cuda()
    dt_bias = torch.rand(HV * K, generator=gen).cuda()
    pool = (0.1 * torch.randn(P, HV, K, K, generator=gen)).cuda()
    slots = torch.randperm(P, generator=gen)[:len(seqlens)].cuda()
    g1 = softplus_gate(p["g"], A_log, dt_bias)
    beta = p["beta"].float().sigmoid()
    return p, g1, beta, pool, slots


def test_vllm_kimi_linear_prefill_and_decode_calls():
    p, g1, beta, pool, slots = kimi_linear([37, 1, 0, 500, 16], seed=430)
    cu = p["cu_seqlens"].to(torch.int32)
    initial_state = pool[slots].contiguous()
    with torch.inference_mode():
        o, last_state = flash_kda.chunk_kda(q=p["q"], k=p["k"], v=p["v"], g=g1, beta=beta,
                                            initial_state=initial_state, output_final_state=True,
                                            use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    q = dict(p, g=g1, beta=beta, initial_state=initial_state.transpose(-1, -2), **LOG_DECAY)
    ref_out, ref_fs = reference(q)
    assert rel_rms(o, ref_out) <= OUT_BAR and rel_rms(last_state, ref_fs.transpose(-1, -2)) <= STATE_BAR_FP32

    # The pool form: slots [P, HV, V, K] read and written in place.
    vpool = pool.transpose(-1, -2).contiguous()
    o2, _ = flash_kda.chunk_kda(q=p["q"], k=p["k"], v=p["v"], g=g1, beta=beta, initial_state=vpool,
                                use_qk_l2norm_in_kernel=True, cu_seqlens=cu, state_v_first=True,
                                initial_state_indices=slots)
    torch.cuda.synchronize()
    assert rel_rms(o2, ref_out) <= OUT_BAR and rel_rms(vpool[slots], ref_fs) <= STATE_BAR_FP32

    # A decode step on that pool: one token a sequence.
    d, g1d, beta_d, _, _ = kimi_linear([1] * 5, seed=431)
    before = vpool.clone()
    od, fsd = flash_kda.fused_recurrent_kda(q=d["q"], k=d["k"], v=d["v"], g=g1d, beta=beta_d, initial_state=vpool,
                                            use_qk_l2norm_in_kernel=True, cu_seqlens=d["cu_seqlens"].to(torch.int32),
                                            ssm_state_indices=slots.to(torch.int32), inplace_final_state=True,
                                            state_v_first=True)
    assert fsd is vpool
    ref_od, ref_fsd = reference(dict(d, g=g1d, beta=beta_d, initial_state=before[slots], **LOG_DECAY))
    assert rel_rms(od, ref_od) <= OUT_BAR and rel_rms(vpool[slots], ref_fsd) <= STATE_BAR_FP32
    flash_kda.check_device_faults()


# ---- fla's own kernels -------------------------------------------------------------------------

def _fla_kda():
    try:
        from fla.ops.kda import chunk_kda, fused_recurrent_kda
    except Exception as e:  # fla missing or broken: say why
        pytest.skip(f"fla not importable: {type(e).__name__}: {e}")
    return chunk_kda, fused_recurrent_kda


@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("entry", ["chunk_kda", "fused_recurrent_kda"])
def test_agrees_with_flas_own_kernels_on_the_log_decay(entry, head_dim, monkeypatch):
    """fla's chunk_kda / fused_recurrent_kda with use_gate_in_kernel=False (vLLM's call:
    fused_kda_gate's output as g, sigmoid(b) as beta) and ours on the same CUDA inputs:
    both within the bars of the float64 reference."""
    fla_chunk_kda, fla_fused_recurrent_kda = _fla_kda()
    monkeypatch.setenv("FLA_FLASH_KDA", "0")  # fla's own Triton kernels, not a dispatch to us
    seqlens = [100, 17, 139] if entry == "chunk_kda" else [1, 3, 2, 4]
    # Decay rates exp(A_log) up to 2: fla's chunked kernels scale keys by the inverse of the
    # decay a 16-token block accumulates (exp(C - G_j)), which leaves fp32 from ~7 a token on
    # average; flash_kda's own strong decays are checked against float64 above.
    p, g1, beta, _, _ = kimi_linear(seqlens, seed=440, K=head_dim, decay_rate_max=2.0)
    s0 = p["initial_state"].transpose(-1, -2).contiguous()  # fla's [N, HV, K, V], fp32
    kw = dict(scale=p["scale"], initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True,
              cu_seqlens=p["cu_seqlens"])
    fla_fn = fla_chunk_kda if entry == "chunk_kda" else fla_fused_recurrent_kda
    with torch.inference_mode():
        o_fla, s_fla = fla_fn(p["q"], p["k"], p["v"], g1, beta, **kw)
        o, s = getattr(flash_kda, entry)(p["q"], p["k"], p["v"], g1, beta, **kw)
    torch.cuda.synchronize()
    ref_out, ref_fs = reference(dict(p, g=g1, beta=beta, **LOG_DECAY))
    ref_fs = ref_fs.transpose(-1, -2)
    e_ours, e_fla = (rel_rms(o, ref_out), rel_rms(s, ref_fs)), (rel_rms(o_fla, ref_out), rel_rms(s_fla, ref_fs))
    print(f"{entry} K={head_dim}, log decay vs float64: ours out {e_ours[0]:.3e} state {e_ours[1]:.3e}; "
          f"fla out {e_fla[0]:.3e} state {e_fla[1]:.3e}")
    assert o.shape == o_fla.shape and s.shape == s_fla.shape and s.dtype == s_fla.dtype
    assert e_ours[0] <= OUT_BAR and e_ours[1] <= STATE_BAR_FP32
    assert rel_rms(o, o_fla) <= 2 ** 0.5 * OUT_BAR
    assert rel_rms(s, s_fla) <= 2 ** 0.5 * STATE_BAR_FP32
