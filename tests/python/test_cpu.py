"""flash_kda on CPU tensors (the chunked fp32 CPU backend): API, every error
case, accuracy against the float64 reference of kda_reference.py, varlen,
in-place semantics, and the kda_forward custom op.

Bars (relative RMS against the float64 reference on the spec's distribution):
  out           <= 2e-3. `out` is bf16: rounding a value to bf16 alone costs
                ~1.66e-3 relative RMS (kda_reference.bf16_rounding_floor), while
                the fp32 chunked computation before the rounding agrees with
                float64 to ~1e-6 (the C++ suite checks 1e-4 on the unrounded
                out). 2e-3 is the rounding floor plus ~20% margin for the
                statistical spread on small problems; a real bug (a wrong decay,
                a missing token) is off by orders of magnitude more.
  fp32 state    <= 1e-4 (fp32 arithmetic end to end; measured ~1e-7).
  bf16 state    <= 2e-3 (the same rounding floor as out).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import flash_kda
from dlpack_fake import DL_CPU, DL_CUDA, DL_VULKAN, FakeDeviceTensor
from kda_reference import bf16_rounding_floor, fwd_kwargs, make_problem, new_outputs, reference, rel_rms

OUT_BAR = 2e-3
STATE_BAR_FP32 = 1e-4
STATE_BAR_BF16 = 2e-3


def run(p, **extra):
    out, fs = new_outputs(p)
    kw = fwd_kwargs(p)
    kw.update(extra)
    ret = flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, final_state=fs, **kw)
    assert ret is None
    return out, fs


def check(p, out, fs):
    ref_out, ref_fs = reference(p)
    e_out = rel_rms(out, ref_out)
    assert e_out <= OUT_BAR, f"out rel RMS {e_out:.3e} > {OUT_BAR}"
    if fs is not None:
        bar = STATE_BAR_FP32 if fs.dtype == torch.float32 else STATE_BAR_BF16
        e_fs = rel_rms(fs, ref_fs)
        assert e_fs <= bar, f"final_state ({fs.dtype}) rel RMS {e_fs:.3e} > {bar}"
    return ref_out, ref_fs


def test_bar_is_above_the_bf16_rounding_floor():
    floor = bf16_rounding_floor()
    assert 1.5e-3 < floor < 1.8e-3
    assert OUT_BAR >= 1.15 * floor


# ---- accuracy ------------------------------------------------------------------

@pytest.mark.parametrize("B,T,H,K", [(1, 1, 1, 128), (2, 50, 2, 64), (1, 100, 2, 128), (1, 37, 3, 32)])
def test_matches_reference(B, T, H, K):
    p = make_problem(B=B, T=T, H=H, K=K, seed=T + K)
    check(p, *run(p))


@pytest.mark.parametrize("state", [torch.float32, torch.bfloat16, None])
def test_state_dtypes(state):
    p = make_problem(B=2, T=40, H=2, K=64, state_dtype=state, seed=3)
    out, fs = run(p)
    assert fs.dtype == (state or torch.float32)
    check(p, out, fs)


def test_no_final_state():
    p = make_problem(T=33, H=2, K=64, final_dtype=None, seed=4)
    out, fs = run(p)
    assert fs is None
    check(p, out, None)


def test_gva_more_value_heads():
    p = make_problem(T=40, H=2, HV=4, K=64, V=32, seed=5)
    check(p, *run(p))


def test_varlen_with_zero_length_sequence():
    p = make_problem(seqlens=[13, 0, 40, 1], H=2, K=64, seed=6)
    out, fs = run(p)
    check(p, out, fs)
    # A zero-length sequence leaves its state unchanged, bit for bit.
    assert torch.equal(fs[1], p["initial_state"][1])


def test_varlen_zero_length_without_initial_state_gives_zero():
    p = make_problem(seqlens=[0, 20], H=1, K=32, state_dtype=None, seed=7)
    out, fs = run(p)
    check(p, out, fs)
    assert torch.count_nonzero(fs[0]) == 0


def test_varlen_equals_separate_calls():
    seqlens = [9, 30, 16]
    p = make_problem(seqlens=seqlens, H=2, K=64, seed=8)
    out, fs = run(p)
    cu = p["cu_seqlens"].tolist()
    for n in range(len(seqlens)):
        s, e = cu[n], cu[n + 1]
        sub = dict(p)
        for name in ("q", "k", "v", "g", "beta"):
            sub[name] = p[name][:, s:e].contiguous()
        sub["initial_state"] = p["initial_state"][n:n + 1].contiguous()
        sub["cu_seqlens"] = None
        sub["N"] = 1
        o1, f1 = run(sub)
        torch.testing.assert_close(o1, out[:, s:e], rtol=0, atol=0)
        torch.testing.assert_close(f1[0], fs[n], rtol=1e-6, atol=1e-7)


def test_reference_backend_agrees():
    p = make_problem(T=30, H=2, K=32, seed=9)
    out, fs = run(p, backend="reference")
    check(p, out, fs)


def test_scale_and_lower_bound_defaults():
    p = make_problem(T=24, H=2, K=64, seed=10)
    out_a, fs_a = run(p)
    out_b, fs_b = new_outputs(p)
    kw = fwd_kwargs(p)
    kw["lower_bound"] = None  # -> -5.0
    flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], None, out_b, final_state=fs_b, **kw)  # scale -> K^-0.5
    assert torch.equal(out_a, out_b) and torch.equal(fs_a, fs_b)


def test_positional_flashkda_signature():
    # FlashKDA's order: q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound,
    # initial_state, final_state, cu_seqlens.
    p = make_problem(T=20, H=2, K=32, seed=11)
    out, fs = new_outputs(p)
    flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, p["A_log"], p["dt_bias"],
                  p["lower_bound"], p["initial_state"], fs, None)
    check(p, out, fs)


def test_fla_style_call_under_inference_mode_with_parameters():
    # What fla's backend does: keywords, nn.Parameters for A_log / dt_bias (requires_grad,
    # which DLPack refuses unless detached), inference_mode.
    p = make_problem(T=20, H=2, K=64, seed=12)
    A_log = torch.nn.Parameter(p["A_log"].clone())
    dt_bias = torch.nn.Parameter(p["dt_bias"].clone())
    with torch.inference_mode():
        out = torch.empty_like(p["v"])
        fs = torch.empty(1, 2, 64, 64, dtype=torch.float32)
        flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, A_log=A_log, dt_bias=dt_bias,
                      lower_bound=-5.0, initial_state=p["initial_state"], final_state=fs, cu_seqlens=None)
    check(p, out, fs)


# ---- in place -------------------------------------------------------------------

def test_in_place_writes_the_callers_storage():
    p = make_problem(B=2, T=20, H=2, K=32, seed=13)
    out_big = torch.full((4,) + tuple(p["v"].shape[1:]), 7.0, dtype=torch.bfloat16)
    out = out_big[1:3]  # a contiguous view into a bigger buffer
    fs_big = torch.full((3, 2, 32, 32), 7.0)
    fs = fs_big[1:]
    ptr_out, ptr_fs = out.data_ptr(), fs.data_ptr()
    kw = fwd_kwargs(p)
    flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, final_state=fs, **kw)
    assert out.data_ptr() == ptr_out and fs.data_ptr() == ptr_fs
    check(p, out_big[1:3], fs_big[1:])
    # Untouched around the views.
    assert torch.all(out_big[0] == 7) and torch.all(out_big[3] == 7) and torch.all(fs_big[0] == 7)


def test_final_state_may_alias_initial_state():
    # In-place state update (decode-style): same buffer as initial and final state.
    p = make_problem(T=16, H=2, K=32, seed=14)
    ref_out, ref_fs = reference(p)
    s = p["initial_state"].clone()
    out = torch.empty_like(p["v"])
    kw = fwd_kwargs(p)
    kw["initial_state"] = s
    flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, final_state=s, **kw)
    assert rel_rms(out, ref_out) <= OUT_BAR and rel_rms(s, ref_fs) <= STATE_BAR_FP32


def test_workspace_size_is_zero_on_cpu():
    p = make_problem(T=20, H=2, K=32, seed=15)
    out, fs = new_outputs(p)
    assert flash_kda.workspace_size(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out,
                                    final_state=fs, **fwd_kwargs(p)) == 0


def test_cuda_status_reports_a_reason():
    ok, why = flash_kda.cuda_status()
    assert ok == flash_kda.cuda_available()
    if not ok:
        assert why.startswith("backend kCuda")


def test_t_zero_is_a_no_op_on_state():
    p = make_problem(B=2, T=0, H=2, K=32, seed=16)
    out, fs = run(p)
    assert out.numel() == 0
    assert torch.equal(fs, p["initial_state"])


# ---- errors: TypeError for dtypes ---------------------------------------------

ARG_ORDER = ["q", "k", "v", "g", "beta", "scale", "out"]


def call_with(p, out=None, fs="new", **override):
    """Calls fwd with problem p and some arguments replaced."""
    o, f = new_outputs(p)
    args = dict(q=p["q"], k=p["k"], v=p["v"], g=p["g"], beta=p["beta"], scale=p["scale"],
                out=o if out is None else out)
    kw = fwd_kwargs(p)
    kw["final_state"] = f if isinstance(fs, str) else fs
    for name, val in override.items():
        if name in args:
            args[name] = val
        else:
            kw[name] = val
    return flash_kda.fwd(*[args[n] for n in ARG_ORDER], **kw)


@pytest.fixture(scope="module")
def small():
    return make_problem(B=1, T=8, H=2, K=32, seed=17)


@pytest.mark.parametrize("name,dtype", [
    ("q", torch.float32), ("k", torch.float16), ("v", torch.float32), ("g", torch.float32),
    ("beta", torch.float16), ("out", torch.float32), ("A_log", torch.int32), ("dt_bias", torch.float64),
    ("initial_state", torch.float16), ("final_state", torch.float64), ("cu_seqlens", torch.int16),
])
def test_wrong_dtype_is_type_error_naming_the_argument(small, name, dtype):
    p = dict(small)
    if name == "cu_seqlens":
        val = torch.tensor([0, 8], dtype=dtype)
    elif name == "final_state":
        val = torch.zeros(1, 2, 32, 32, dtype=dtype)
    elif name == "out":
        val = torch.zeros_like(p["v"], dtype=dtype)
    else:
        val = p[name].to(dtype)
    with pytest.raises(TypeError, match=rf"^{name}: expected dtype"):
        call_with(p, **{name: val})


def test_state_dtype_mismatch_is_type_error(small):
    with pytest.raises(TypeError, match=r"^final_state: expected the same dtype as initial_state \(float32\)"):
        call_with(small, fs=torch.zeros(1, 2, 32, 32, dtype=torch.bfloat16))


@pytest.mark.parametrize("bad", [[1, 2, 3], None, 3.0])
def test_not_a_tensor_is_type_error(small, bad):
    with pytest.raises(TypeError, match=r"^k: expected a tensor"):
        call_with(small, k=bad)


def test_python_layer_errors_name_the_argument(small):
    # What the Python wrappers read before the extension checks anything: a bad
    # value there is a TypeError / ValueError naming it, not an AttributeError,
    # IndexError or ZeroDivisionError from inside the wrapper.
    p = small
    with pytest.raises(TypeError, match=r"^scale: expected a float"):
        call_with(p, scale="x")
    with pytest.raises(TypeError, match=r"^lower_bound: expected a float"):
        call_with(p, lower_bound=[1])
    with pytest.raises(TypeError, match=r"^q: expected a tensor"):
        call_with(p, q=None, scale=None)
    with pytest.raises(TypeError, match=r"^segments: expected a tensor"):
        flash_kda.segment_summaries(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"], [[0, 4]])
    with pytest.raises(ValueError, match=r"^segments: expected a contiguous int64 tensor \[S, 2\]"):
        flash_kda.segment_summaries(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"],
                                    torch.zeros(3, 3, dtype=torch.int64))
    M, B = torch.zeros(1, 2, 32, 32), torch.zeros(1, 2, 32, 32)
    with pytest.raises(TypeError, match=r"^out: expected a pair \(M, B\)"):
        flash_kda.compose_summaries(M, B, M, B, out=M)
    with pytest.raises(TypeError, match=r"^q: expected a torch.Tensor"):
        flash_kda.kda_forward(None, p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"])
    with pytest.raises(ValueError, match=r"^v: expected a 4-d tensor"):
        flash_kda.kda_forward(p["q"], p["k"], p["v"][0], p["g"], p["beta"], p["A_log"], p["dt_bias"])
    with pytest.raises(TypeError, match=r"^q: expected a torch.Tensor"):
        flash_kda.chunk_kda([1], p["k"], p["v"], p["g"], p["beta"], A_log=p["A_log"], dt_bias=p["dt_bias"],
                            use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                            safe_gate=True)
    with pytest.raises(ValueError, match=r"^device: expected a CUDA device"):
        flash_kda.check_device_faults("cpu")
    # Parameters the extension converts before it checks anything: named, not a dump
    # of the whole signature.
    for kw, match in ((dict(backend=None), r"^backend: expected str, got NoneType"),
                      (dict(checkpoint_interval=64.0), r"^checkpoint_interval: expected int, got float"),
                      (dict(checkpoints_value_major="yes"), r"^checkpoints_value_major: expected bool"),
                      (dict(resume_from_summaries=1), r"^resume_from_summaries: expected bool")):
        with pytest.raises(TypeError, match=match):
            call_with(p, **kw)
        with pytest.raises(TypeError, match=match):
            flash_kda.workspace_size(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], torch.empty_like(p["v"]),
                                     A_log=p["A_log"], dt_bias=p["dt_bias"], **kw)
    with pytest.raises(ValueError, match=r"^checkpoint_interval: expected a value that fits int64"):
        call_with(p, checkpoint_interval=2 ** 64)
    with pytest.raises(TypeError, match=r"^backend: expected str"):
        flash_kda.compose_summaries(M, B, M, B, backend=0)
    # On the CPU backends cu_seqlens itself is read on the host: a host copy must be it.
    v = make_problem(seqlens=[3, 5], H=2, K=32, seed=18)
    with pytest.raises(ValueError, match=r"^cu_seqlens_host: expected a copy of cu_seqlens, but "
                                         r"cu_seqlens_host\[1\]=4 where cu_seqlens\[1\]=3"):
        call_with(v, cu_seqlens_host=torch.tensor([0, 4, 8]))


def test_missing_A_log_is_type_error(small):
    with pytest.raises(TypeError, match=r"^A_log: expected a tensor, got None"):
        call_with(small, A_log=None)


# ---- errors: ValueError for shapes / strides / devices ---------------------------

@pytest.mark.parametrize("name,shape", [
    ("k", (1, 8, 2, 16)), ("k", (1, 8, 3, 32)), ("v", (1, 7, 2, 32)), ("g", (1, 8, 2, 16)),
    ("beta", (1, 8, 3)), ("beta", (1, 8, 2, 1)), ("out", (1, 8, 2, 16)), ("A_log", (3,)), ("dt_bias", (2, 16)),
    ("dt_bias", (64,)), ("initial_state", (2, 2, 32, 32)), ("final_state", (1, 2, 32, 16)),
])
def test_wrong_shape_is_value_error_naming_the_argument(small, name, shape):
    dtype = {"A_log": torch.float32, "dt_bias": torch.float32, "initial_state": torch.float32,
             "final_state": torch.float32}.get(name, torch.bfloat16)
    val = torch.zeros(shape, dtype=dtype)
    kw = {"fs": val} if name == "final_state" else {name: val}
    with pytest.raises(ValueError, match=rf"^{name}: expected shape"):
        call_with(small, **kw)


def test_wrong_rank_of_q_is_value_error(small):
    with pytest.raises(ValueError, match=r"^q: expected a 4-d tensor"):
        call_with(small, q=small["q"][0])


@pytest.mark.parametrize("name", ["out", "dt_bias", "initial_state"])
def test_non_contiguous_is_value_error(small, name):
    t = small[name] if name != "out" else torch.empty_like(small["v"])
    # Same shape, transposed memory layout.
    nc = t.transpose(0, -1).contiguous().transpose(0, -1)
    assert nc.shape == t.shape and not nc.is_contiguous()
    kw = {name: nc}
    with pytest.raises(ValueError, match=rf"^{name}: expected a C-contiguous"):
        call_with(small, **kw)


# q, k, v, g may be strided views with a contiguous last dimension (test_strided_inputs.py);
# a transposed last dimension is refused by name.
@pytest.mark.parametrize("name", ["q", "k", "v", "g"])
def test_non_contiguous_last_dim_is_value_error(small, name):
    nc = small[name].transpose(0, -1).contiguous().transpose(0, -1)
    assert nc.shape == small[name].shape and not nc.is_contiguous()
    with pytest.raises(ValueError, match=rf"^{name}: expected the last dimension contiguous"):
        call_with(small, **{name: nc})


def test_non_contiguous_final_state_is_value_error(small):
    fs = torch.zeros(1, 2, 32, 32).transpose(2, 3)
    with pytest.raises(ValueError, match=r"^final_state: expected a C-contiguous"):
        call_with(small, fs=fs)


@pytest.mark.parametrize("name", ["k", "v", "g", "beta", "out", "A_log", "dt_bias"])
def test_mixed_devices_is_value_error(small, name):
    # A DLPack tensor that claims to live on cuda:0 (never dereferenced).
    shape = small["v"].shape if name == "out" else small[name].shape
    dtype = "float32" if name in ("A_log", "dt_bias") else "bfloat16"
    fake = FakeDeviceTensor(shape, dtype, DL_CUDA, 0)
    with pytest.raises(ValueError, match=rf"^{name}: expected a tensor on the same device as q \(cpu\), got cuda:0"):
        call_with(small, **{name: fake})


def test_different_cuda_devices_is_value_error(small):
    # All "CUDA" (fake, never dereferenced): q on cuda:0, v on cuda:1.
    fakes = {n: FakeDeviceTensor(small[n].shape, "bfloat16", DL_CUDA, 0) for n in ("q", "k", "g", "beta")}
    fakes["v"] = FakeDeviceTensor(small["v"].shape, "bfloat16", DL_CUDA, 1)
    out = FakeDeviceTensor(small["v"].shape, "bfloat16", DL_CUDA, 0)
    A_log = FakeDeviceTensor((2,), "float32", DL_CUDA, 0)
    dt_bias = FakeDeviceTensor((2, 32), "float32", DL_CUDA, 0)
    with pytest.raises(ValueError, match=r"^v: expected a tensor on the same device as q \(cuda:0\), got cuda:1"):
        flash_kda._C.fwd(fakes["q"], fakes["k"], fakes["v"], fakes["g"], fakes["beta"], 1.0, out, A_log, dt_bias,
                         -5.0)


def test_unsupported_device_is_value_error(small):
    fake = FakeDeviceTensor(small["q"].shape, "bfloat16", DL_VULKAN, 0)
    with pytest.raises(ValueError, match=r"^q: expected a CPU or CUDA tensor, got DLPack device type 7"):
        call_with(small, q=fake)


@pytest.mark.parametrize("name", ["cu_seqlens", "cu_seqlens_host", "has_initial_state"])
def test_null_data_pointer_is_value_error_naming_the_argument(name):
    # A DLPack array with elements but no memory is an error, not an argument left out
    # (a null cu_seqlens ran the varlen batch as one sequence).
    p = make_problem(seqlens=[3, 5], H=2, K=32, seed=17)
    pool = torch.zeros(4, 2, 32, 32)
    on_pool = dict(state_pool=pool, state_indices=torch.tensor([2, 0]), initial_state=None, fs=None)
    shape, dtype, extra = {"cu_seqlens": ((3,), "int64", {}), "cu_seqlens_host": ((3,), "int64", {}),
                           "has_initial_state": ((2,), "uint8", on_pool)}[name]
    with pytest.raises(ValueError, match=rf"^{name}: null pointer for a tensor of shape \[{shape[0]}\]"):
        call_with(p, **extra, **{name: FakeDeviceTensor(shape, dtype, DL_CPU, 0, null=True)})
    assert not pool.any()


@pytest.mark.skipif(flash_kda.cuda_available(), reason="checks the no-GPU path")
def test_cuda_tensors_without_usable_cuda_backend_raise_not_implemented(small):
    fakes = {n: FakeDeviceTensor(small[n].shape, "bfloat16") for n in ("q", "k", "v", "g", "beta")}
    fakes["out"] = FakeDeviceTensor(small["v"].shape, "bfloat16")
    fakes["A_log"] = FakeDeviceTensor((2,), "float32")
    fakes["dt_bias"] = FakeDeviceTensor((2, 32), "float32")
    with pytest.raises(NotImplementedError, match=r"^backend kCuda"):
        flash_kda.fwd(fakes["q"], fakes["k"], fakes["v"], fakes["g"], fakes["beta"], 1.0, fakes["out"],
                      fakes["A_log"], fakes["dt_bias"], -5.0, stream=0)


@pytest.mark.parametrize("name,value", [("scale", "0.1"), ("scale", b"0.1"), ("scale", True),
                                        ("lower_bound", "-1"), ("lower_bound", False),
                                        ("lower_bound", torch.tensor(True)), ("scale", torch.tensor(True).numpy())])
def test_scale_and_lower_bound_refuse_strings_and_bools(small, name, value):
    # float() parses a string and reads a bool as 0 or 1: neither is taken for a number.
    with pytest.raises(TypeError, match=rf"^{name}: expected a float"):
        call_with(small, **{name: value})


def test_scale_and_lower_bound_take_numbers_of_any_type(small):
    ref = torch.empty_like(small["v"])
    call_with(small, out=ref, scale=0.5, lower_bound=-5.0)
    for scale, lower_bound in ((torch.tensor(0.5), -5), (torch.tensor(0.5).numpy()[()], torch.tensor(-5.0).numpy())):
        out = torch.empty_like(small["v"])
        call_with(small, out=out, scale=scale, lower_bound=lower_bound)
        assert torch.equal(out, ref)


# ---- errors: ValueError from the C++ validation (message verbatim) --------------

@pytest.mark.parametrize("lb", [0.5, 0.0, -5.5, float("nan"), float("inf")])
def test_bad_lower_bound_is_value_error_with_the_cpp_message(small, lb):
    with pytest.raises(ValueError, match=r"^lower_bound: expected a finite value in \[-5, 0\), got "):
        call_with(small, lower_bound=lb)


def test_bad_scale_is_value_error(small):
    with pytest.raises(ValueError, match=r"^scale: expected a finite value"):
        call_with(small, scale=float("nan"))


def test_cu_seqlens_values_are_validated(small):
    with pytest.raises(ValueError, match=r"^cu_seqlens: expected non-decreasing values"):
        call_with(small, cu_seqlens=torch.tensor([0, 6, 3, 8]), fs=None, initial_state=None)
    with pytest.raises(ValueError, match=r"^cu_seqlens: expected cu_seqlens\[num_seqs=1\] == seqlen=8, got 7"):
        call_with(small, cu_seqlens=torch.tensor([0, 7]), fs=None)
    with pytest.raises(ValueError, match=r"^cu_seqlens: expected cu_seqlens\[0\] == 0"):
        call_with(small, cu_seqlens=torch.tensor([1, 8]), fs=None)


def test_cu_seqlens_shape_and_batch(small):
    with pytest.raises(ValueError, match=r"^cu_seqlens: expected a 1-d tensor \[N\+1\] with N >= 1"):
        call_with(small, cu_seqlens=torch.tensor([0]), fs=None, initial_state=None)
    p = make_problem(B=2, T=8, H=2, K=32, seed=18)
    with pytest.raises(ValueError, match=r"^cu_seqlens: requires B == 1"):
        call_with(p, cu_seqlens=torch.tensor([0, 8]), fs=None, initial_state=None)


def test_empty_dimensions_other_than_t_name_the_tensor():
    def call(B, H, HV, K, V):
        q = torch.zeros(B, 4, H, K, dtype=torch.bfloat16)
        v = torch.zeros(B, 4, HV, V, dtype=torch.bfloat16)
        g = torch.zeros(B, 4, HV, K, dtype=torch.bfloat16)
        beta = torch.zeros(B, 4, HV, dtype=torch.bfloat16)
        flash_kda.fwd(q, q, v, g, beta, 1.0, torch.empty_like(v), A_log=torch.zeros(HV),
                      dt_bias=torch.zeros(HV, K), lower_bound=-5.0)

    for B, H, K in [(0, 2, 32), (1, 0, 32), (1, 2, 0)]:
        with pytest.raises(ValueError, match=r"^q: expected B, H and K of at least 1 in \[B, T, H, K\]"):
            call(B, H, H, K, 32)
    with pytest.raises(ValueError, match=r"^v: expected HV and V of at least 1 in \[B, T, HV, V\]"):
        call(1, 2, 2, 32, 0)


def test_head_dim_over_cpu_limit_is_not_implemented():
    # A valid shape the CPU backends do not run: NotImplementedError, as on CUDA.
    p = make_problem(T=2, H=1, K=300, V=8, seed=19)
    with pytest.raises(NotImplementedError, match=r"^head_dim_k: backend kCpuChunked runs head dims in \[1, 256\], got 300"):
        run(p)


def test_backend_argument(small):
    with pytest.raises(ValueError, match=r"^backend: 'cuda' runs on CUDA tensors, got tensors on cpu"):
        call_with(small, backend="cuda")
    with pytest.raises(ValueError, match=r"^backend: expected 'auto'"):
        call_with(small, backend="gpu")


def test_gva_head_count_must_divide(small):
    p = make_problem(T=8, H=2, HV=3, K=32, seed=20)
    with pytest.raises(ValueError,
                       match=r"^v: expected its heads \(HV = 3\) to be a positive multiple of q's heads \(H = 2\)"):
        run(p)



@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("where", ["v", "k", "q"])
def test_a_non_finite_input_stays_in_its_sequence_and_head(backend, where):
    """A NaN in one element of one token (of one head of one sequence): every other head
    and sequence stays finite, and so does every token before the NaN's 16-token chunk
    (the chunked backend: a NaN in U reaches the chunk's earlier rows through the zeros
    of Mqk, 0 * NaN) or before the token itself (the float64 token recurrence). From
    there that head's out is non-finite to the end of its sequence, and so is its final
    state; a NaN in q reaches its own token's out only (q never enters the state)."""
    p = make_problem(H=2, K=32, seqlens=[37, 43], seed=31)
    bad_t, bad_h, seq0_last = 21, 1, 36
    p[where][0, bad_t, bad_h, 7] = float("nan")
    out, fs = run(p, backend=backend)
    bad = ~torch.isfinite(out.float()).all(dim=-1)[0]  # [T, HV]
    first = bad_t if backend == "reference" or where == "q" else bad_t // 16 * 16
    last = bad_t if where == "q" else seq0_last
    expect = torch.zeros_like(bad)
    expect[first:last + 1, bad_h] = True
    assert torch.equal(bad, expect)
    fs_bad = ~torch.isfinite(fs).all(dim=-1).all(dim=-1)  # [N, HV]
    expect_fs = torch.zeros_like(fs_bad)
    expect_fs[0, bad_h] = where != "q"
    assert torch.equal(fs_bad, expect_fs)


# ---- kda_forward: the torch.library custom op ---------------------------------

def test_kda_forward_matches_fwd():
    p = make_problem(B=2, T=30, H=2, K=64, seed=21)
    out, fs = run(p)
    o2, f2 = flash_kda.kda_forward(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"],
                                   scale=p["scale"], lower_bound=p["lower_bound"],
                                   initial_state=p["initial_state"], output_final_state=True)
    assert torch.equal(o2, out) and torch.equal(f2, fs)
    o3, f3 = flash_kda.kda_forward(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"])
    assert f3 is None and o3.shape == out.shape


def test_kda_forward_varlen_and_state_dtype():
    p = make_problem(seqlens=[5, 0, 19], H=2, K=32, state_dtype=None, seed=22)
    o, f = flash_kda.kda_forward(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"],
                                 cu_seqlens=p["cu_seqlens"], output_final_state=True, state_dtype=torch.bfloat16)
    assert f.dtype == torch.bfloat16 and f.shape == (3, 2, 32, 32)
    check(p, o, f)


@pytest.mark.parametrize("initial,final", [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)])
def test_kda_forward_state_dtype_other_than_the_initial_states(initial, final):
    # One state dtype at each end: the call runs with fp32 states. A bf16 initial
    # state widens exactly, so its fp32 final state is the fp32 call's bit for bit;
    # a bf16 final state from an fp32 initial one is the fp32 call's, rounded.
    p = make_problem(seqlens=[21, 0, 40], H=2, K=32, state_dtype=initial, seed=23)
    args = (p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"])
    kw = dict(scale=p["scale"], lower_bound=p["lower_bound"], cu_seqlens=p["cu_seqlens"], output_final_state=True)
    o, f = flash_kda.kda_forward(*args, initial_state=p["initial_state"], state_dtype=final, **kw)
    o32, f32 = flash_kda.kda_forward(*args, initial_state=p["initial_state"].float(), state_dtype=torch.float32, **kw)
    assert f.dtype == final and f.shape == f32.shape
    assert torch.equal(o, o32)
    assert torch.equal(f, f32.to(final))


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_half_precision_gate_parameters_widen_exactly(half):
    # fla's dispatch hands fwd a model's A_log and dt_bias as it holds them: a model
    # cast to half precision gives bf16 or fp16 ones, which fwd takes widened.
    p = make_problem(seqlens=[19, 40], H=2, K=32, seed=24)
    A16, dt16 = p["A_log"].to(half), p["dt_bias"].to(half)
    outs = []
    for A, dt in ((A16, dt16), (A16.float(), dt16.float())):
        out = torch.empty_like(p["v"])
        flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, A_log=A, dt_bias=dt,
                      lower_bound=p["lower_bound"], cu_seqlens=p["cu_seqlens"])
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    with pytest.raises(TypeError, match=r"^A_log: expected dtype float32"):
        flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], torch.empty_like(p["v"]),
                      A_log=p["A_log"].double(), dt_bias=p["dt_bias"], cu_seqlens=p["cu_seqlens"])


def test_kda_forward_is_a_registered_custom_op():
    op = torch.ops.flash_kda.kda_forward
    assert op.default._schema.name == "flash_kda::kda_forward"


def _op_args(p, output_final_state=True):
    return (p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"], p["initial_state"],
            p["cu_seqlens"], float(p["scale"]), float(p["lower_bound"]), output_final_state, torch.float32)


@pytest.mark.skipif(not hasattr(torch.library, "opcheck"), reason="torch.library.opcheck needs torch >= 2.4")
@pytest.mark.parametrize("varlen", [False, True])
def test_opcheck(varlen):
    p = make_problem(seqlens=[5, 11] if varlen else None, T=12, H=2, K=32, seed=23)
    torch.library.opcheck(torch.ops.flash_kda.kda_forward.default, _op_args(p))


def test_kda_forward_op_names_what_cannot_size_its_outputs():
    # The op allocates out and final_state from q, v and cu_seqlens before fwd checks
    # anything, also when called directly rather than through kda_forward.
    p = make_problem(seqlens=[5, 7], H=2, K=32, seed=23)
    args = list(_op_args(p))
    args[0] = p["q"][0]
    with pytest.raises(ValueError, match=r"^q: expected a 4-d tensor, got shape \[12, 2, 32\]"):
        torch.ops.flash_kda.kda_forward(*args)
    args = list(_op_args(p))
    args[7], args[8] = None, torch.tensor([], dtype=torch.int64)
    empty = r"^cu_seqlens: expected a 1-d tensor \[N\+1\] with N >= 1, got \[0\]"
    with pytest.raises(ValueError, match=empty):
        torch.ops.flash_kda.kda_forward(*args)
    with pytest.raises(ValueError, match=empty):
        flash_kda.kda_forward(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"],
                              cu_seqlens=args[8], output_final_state=True)


def test_torch_compile_fullgraph_cpu():
    p = make_problem(T=20, H=2, K=32, seed=24)

    def f(q, k, v, g, beta, A_log, dt_bias, s0):
        o, s = flash_kda.kda_forward(q, k, v, g, beta, A_log, dt_bias, initial_state=s0, output_final_state=True)
        return o.float() * 2, s

    args = (p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"], p["initial_state"])
    eager = f(*args)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(*args)
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])


def test_outputs_sharing_memory_with_inputs_or_outputs_are_value_errors_naming_both():
    """An output over an input or another output would give a result that depends on the
    order of the call's work: refused, naming both. The final state over the initial
    state itself is the in-place update, and inputs may share memory."""
    p = make_problem(T=40, H=2, K=32, seed=9)
    out, fs = new_outputs(p)
    q, k, v, g, beta = (p[n] for n in ("q", "k", "v", "g", "beta"))
    kw = fwd_kwargs(p)
    flash_kda.fwd(q, k, v, g, beta, p["scale"], out, final_state=fs, **kw)  # apart: fine
    both = torch.cat([k.flatten(), k.flatten()])
    k2, out2 = both[:k.numel()].view(k.shape), both[16:16 + v.numel()].view(v.shape)
    with pytest.raises(ValueError, match="out: shares memory with k"):
        flash_kda.fwd(q, k2, v, g, beta, p["scale"], out2, final_state=fs, **kw)
    with pytest.raises(ValueError, match="out: shares memory with q"):
        flash_kda.fwd(q, k, v, g, beta, p["scale"], q, final_state=fs, **kw)
    init = kw.pop("initial_state")
    two = torch.cat([init.flatten(), init.flatten()])
    with pytest.raises(ValueError, match="final_state: shares memory with initial_state"):
        flash_kda.fwd(q, k, v, g, beta, p["scale"], out, initial_state=two[:init.numel()].view(init.shape),
                      final_state=two[8:8 + init.numel()].view(init.shape), **kw)
    state = init.clone()
    flash_kda.fwd(q, k, v, g, beta, p["scale"], out, initial_state=state, final_state=state, **kw)
    flash_kda.fwd(q, q, v, g, beta, p["scale"], out, initial_state=init, final_state=fs, **kw)


def test_tensors_that_refuse_dlpack_say_why():
    p = make_problem(T=8, H=1, K=32, seed=20)
    ro = p["A_log"].numpy().copy()
    ro.flags.writeable = False
    why = r"^A_log: expected a tensor supporting DLPack .*, got ndarray \(its __dlpack__ failed: "
    with pytest.raises(TypeError, match=why):
        call_with(p, A_log=ro)


def test_tensors_in_memory_no_backend_reads_are_value_errors():
    """A torch tensor on the meta device is the right kind of argument on the wrong
    device: a ValueError naming it and the device, as for a CUDA tensor among CPU ones."""
    p = make_problem(seqlens=[5, 7], H=2, K=32, seed=25)
    for name in ("q", "cu_seqlens", "A_log"):
        with pytest.raises(ValueError, match=rf"^{name}: expected a tensor in CPU or CUDA memory, got one on "
                                             r"device meta"):
            call_with(p, **{name: p[name].to("meta")})


def test_workspace_and_stream_are_checked_where_the_call_does_not_use_them(small):
    """The CPU backends need no scratch and no stream; a value the same call on CUDA
    tensors would refuse is refused here too, naming the argument."""
    p = small
    with pytest.raises(TypeError, match=r"^workspace: expected a tensor"):
        call_with(p, workspace="scratch")
    with pytest.raises(TypeError, match=r"^workspace: expected dtype uint8"):
        call_with(p, workspace=torch.zeros(64))
    with pytest.raises(ValueError, match=r"^workspace: expected a 1-d uint8 tensor"):
        call_with(p, workspace=torch.zeros(2, 64, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"^workspace: expected a C-contiguous"):
        call_with(p, workspace=torch.zeros(128, dtype=torch.uint8)[::2])
    call_with(p, workspace=torch.zeros(64, dtype=torch.uint8))  # a valid one is accepted (and unused)
    for bad, err, match in (("bogus", TypeError, r"^stream: expected a cudaStream_t as an int"),
                            (1.5, TypeError, r"^stream: expected a cudaStream_t as an int"),
                            (True, TypeError, r"^stream: expected a cudaStream_t as an int, or None, got bool"),
                            (-1, ValueError, r"^stream: expected a cudaStream_t, an int in \[0, 2\*\*64\)"),
                            (2 ** 64, ValueError, r"^stream: expected a cudaStream_t")):
        with pytest.raises(err, match=match):
            call_with(p, stream=bad)
        M, B = torch.zeros(1, 2, 32, 32), torch.zeros(1, 2, 32, 32)
        with pytest.raises(err, match=match):
            flash_kda.compose_summaries(M, B, M, B, stream=bad)
    call_with(p, stream=np.int64(0))  # any integer type


def test_numpy_bools_are_named_as_numpy(small):
    """numpy.bool is not a Python bool (nanobind and torch's schemas refuse it); the
    message says which bool it is."""
    with pytest.raises(TypeError, match=r"^use_gate_in_kernel: expected bool, got numpy\.bool"):
        call_with(small, use_gate_in_kernel=np.True_)
    p = small
    with pytest.raises(TypeError, match=r"^output_final_state: expected a bool, got numpy\.bool"):
        flash_kda.kda_forward(p["q"], p["k"], p["v"], p["g"], p["beta"], p["A_log"], p["dt_bias"],
                              output_final_state=np.True_)


def test_raw_ops_refuse_a_meta_tensor_beside_real_ones():
    """Torch sends an op call with any meta tensor to the fake implementation: with the
    other tensors real, it would return an unwritten out. Refused, naming the argument;
    an all-meta call (shapes only) still gives meta outputs."""
    p = make_problem(seqlens=[5, 7], H=2, K=32, seed=24)
    args = list(_op_args(p))
    args[8] = p["cu_seqlens"].to("meta")
    with pytest.raises(ValueError, match=r"^cu_seqlens: expected a tensor on the device of q \(cpu\), got meta"):
        torch.ops.flash_kda.kda_forward(*args)
    meta = [x.to("meta") if isinstance(x, torch.Tensor) else x for x in _op_args(p)]
    out, fs = torch.ops.flash_kda.kda_forward(*meta)
    assert out.device.type == "meta" and out.shape == p["v"].shape
