"""The two ways the binding reads a tensor argument agree: torch.Tensor / nn.Parameter
objects through their own attributes (the fast path, the default) and any array
through DLPack (flash_kda._set_torch_fast_path(False), as every non-torch array).

Each case runs once per path and must end the same way: the same exception type
and message, or the same results bit for bit. CPU tensors (the CPU backends), plus
fake CUDA tensors that are rejected before any memory is touched; the GPU suites
run the fast path on real CUDA tensors.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

import flash_kda
from dlpack_fake import DL_CUDA, FakeDeviceTensor
from kda_reference import fwd_kwargs, make_problem, new_outputs
from test_decode_cpu import call_with, make_decode


@contextlib.contextmanager
def torch_fast_path(enabled):
    previous = flash_kda._set_torch_fast_path(enabled)
    try:
        yield
    finally:
        flash_kda._set_torch_fast_path(previous)


def outcome(fn):
    """('ok', result) or (exception type, message)."""
    try:
        return "ok", fn()
    except Exception as e:  # noqa: BLE001 - comparing whatever each path raises
        return type(e), str(e)


def both_paths(fn):
    """Runs fn with the fast path and with DLPack; returns the two outcomes."""
    with torch_fast_path(True):
        fast = outcome(fn)
    with torch_fast_path(False):
        slow = outcome(fn)
    return fast, slow


def assert_same_error(fn, exc_type):
    fast, slow = both_paths(fn)
    assert fast == slow, f"fast path: {fast!r}\nDLPack path: {slow!r}"
    assert fast[0] is exc_type, fast


def test_fast_path_is_on_by_default():
    assert flash_kda._C.torch_fast_path()


def test_fast_path_does_not_export_through_dlpack(monkeypatch):
    calls = []
    real = torch.Tensor.__dlpack__

    def counting(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "__dlpack__", counting)
    p = make_problem(T=8, H=2, K=32, seed=1)
    out, fs = new_outputs(p)
    flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, final_state=fs, **fwd_kwargs(p))
    d = make_decode(N=2, H=2, K=32, P=3, seed=2)
    flash_kda.decode(d["q"], d["k"], d["v"], d["g"], d["beta"], d["A_log"], d["dt_bias"], d["pool"].clone(),
                     d["indices"], out=torch.empty_like(d["v"]))
    assert not calls
    with torch_fast_path(False):
        flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, final_state=fs, **fwd_kwargs(p))
    # q k v g beta out A_log dt_bias initial_state final_state (a producer may be asked twice per tensor)
    assert len(calls) >= 10


# ---- the same results ---------------------------------------------------------------

def _fwd_result(p, **extra):
    def run():
        out, fs = new_outputs(p)
        kw = fwd_kwargs(p)
        kw.update(extra)
        flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, final_state=fs, **kw)
        return out, fs
    return run


@pytest.mark.parametrize("problem", [
    dict(B=2, T=20, H=2, K=32),
    dict(seqlens=[7, 0, 12], H=2, K=32),
    dict(T=9, H=1, HV=2, K=16, V=8, state_dtype=torch.bfloat16),
    dict(B=1, T=0, H=2, K=32),
])
def test_fwd_results_are_identical(problem):
    p = make_problem(seed=3, **problem)
    fast, slow = both_paths(_fwd_result(p))
    assert fast[0] == "ok" and slow[0] == "ok"
    assert torch.equal(fast[1][0], slow[1][0]) and torch.equal(fast[1][1], slow[1][1])


def test_views_with_a_storage_offset_are_read_at_their_first_element():
    # data_ptr() includes the storage offset, as DLPack's data + byte_offset does.
    p = make_problem(B=2, T=10, H=2, K=32, seed=4)
    big = {n: torch.cat([torch.zeros_like(p[n][:1]), p[n]]) for n in ("q", "k", "v", "g", "beta")}
    shifted = dict(p)
    for n in big:
        shifted[n] = big[n][1:]
        assert shifted[n].storage_offset() > 0
    fast, slow = both_paths(_fwd_result(shifted))
    ref = _fwd_result(p)()
    assert torch.equal(fast[1][0], ref[0]) and torch.equal(slow[1][0], ref[0])


def test_parameters_and_tensors_that_require_grad_as_inputs():
    p = make_problem(T=12, H=2, K=32, seed=5)
    ref = _fwd_result(p)()
    q = p["q"].clone().requires_grad_()
    grad = dict(p, q=q, A_log=torch.nn.Parameter(p["A_log"].clone()), dt_bias=torch.nn.Parameter(p["dt_bias"].clone()))
    fast, slow = both_paths(_fwd_result(grad))
    assert torch.equal(fast[1][0], ref[0]) and torch.equal(slow[1][0], ref[0])
    assert torch.equal(fast[1][1], ref[1]) and torch.equal(slow[1][1], ref[1])


def test_outputs_that_require_grad_are_written_in_place():
    # Outside autograd either way: the tensors' storage is written, as for a detached view.
    p = make_problem(T=12, H=2, K=32, seed=10)
    ref = _fwd_result(p)()

    def run():
        out = torch.zeros_like(p["v"]).requires_grad_()
        fs = torch.zeros(1, 2, 32, 32, requires_grad=True)
        flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, final_state=fs, **fwd_kwargs(p))
        return out.detach(), fs.detach()

    fast, slow = both_paths(run)
    for res in (fast, slow):
        assert res[0] == "ok" and torch.equal(res[1][0], ref[0]) and torch.equal(res[1][1], ref[1])


def test_tensor_subclass_goes_through_dlpack():
    class Marked(torch.Tensor):
        pass

    p = make_problem(T=12, H=2, K=32, seed=6)
    ref = _fwd_result(p)()
    sub = dict(p, q=p["q"].as_subclass(Marked))
    out, fs = _fwd_result(sub)()
    assert torch.equal(out, ref[0]) and torch.equal(fs, ref[1])


def test_decode_results_are_identical():
    d = make_decode(seqlens=[2, 1, 3], H=2, K=32, P=5, indices=[4, -1, 0], state_dtype=torch.bfloat16, seed=7)

    def run():
        pool = d["pool"].clone()
        per_tok = torch.zeros(6, 2, 32, 32, dtype=torch.bfloat16)
        out = flash_kda.decode(d["q"], d["k"], d["v"], d["g"], d["beta"], d["A_log"], d["dt_bias"], pool,
                               d["indices"], out=torch.zeros_like(d["v"]), cu_seqlens=d["cu_seqlens"],
                               per_token_states=per_tok)
        return out, pool, per_tok

    fast, slow = both_paths(run)
    assert fast[0] == "ok" and slow[0] == "ok"
    for a, b in zip(fast[1], slow[1]):
        assert torch.equal(a, b)


# ---- the same errors ------------------------------------------------------------------

@pytest.fixture(scope="module")
def small():
    return make_problem(B=1, T=8, H=2, K=32, seed=8)


def fwd_with(p, **override):
    """A callable running fwd on problem p with some arguments replaced."""
    def run():
        o, f = new_outputs(p)
        args = dict(q=p["q"], k=p["k"], v=p["v"], g=p["g"], beta=p["beta"], scale=p["scale"], out=o)
        kw = fwd_kwargs(p)
        kw["final_state"] = f
        for name, val in override.items():
            (args if name in args else kw)[name] = val
        return flash_kda.fwd(*args.values(), **kw)
    return run


def non_contiguous(t):
    return t.transpose(0, -1).contiguous().transpose(0, -1)


FWD_TYPE_ERRORS = {
    "q float32": lambda p: dict(q=p["q"].float()),
    "q complex64": lambda p: dict(q=p["q"].to(torch.complex64)),
    "q bool": lambda p: dict(q=p["q"] > 0),
    "q int16": lambda p: dict(q=p["q"].to(torch.int16)),
    "q float8": lambda p: dict(q=p["q"].to(torch.float8_e4m3fn)),
    "k None": lambda p: dict(k=None),
    "k list": lambda p: dict(k=[1, 2, 3]),
    "A_log fp64 parameter": lambda p: dict(A_log=torch.nn.Parameter(p["A_log"].double())),
    "A_log complex parameter": lambda p: dict(A_log=torch.nn.Parameter(p["A_log"].to(torch.complex64))),
    "final_state bf16 vs initial fp32": lambda p: dict(final_state=torch.zeros(1, 2, 32, 32, dtype=torch.bfloat16)),
    "cu_seqlens int16": lambda p: dict(cu_seqlens=torch.tensor([0, 8], dtype=torch.int16)),
    "sparse q": lambda p: dict(q=p["q"].float().to_sparse().to(torch.bfloat16)),
}


@pytest.mark.parametrize("case", list(FWD_TYPE_ERRORS))
def test_fwd_type_errors_are_identical(small, case):
    assert_same_error(fwd_with(small, **FWD_TYPE_ERRORS[case](small)), TypeError)


FWD_VALUE_ERRORS = {
    "k shape": lambda p: dict(k=torch.zeros(1, 8, 2, 16, dtype=torch.bfloat16)),
    "q rank 3": lambda p: dict(q=p["q"][0]),
    "q rank 8": lambda p: dict(q=p["q"].reshape(1, 1, 1, 1, 1, 8, 2, 32)),
    "beta rank 4": lambda p: dict(beta=torch.zeros(1, 8, 2, 1, dtype=torch.bfloat16)),
    "dt_bias flat": lambda p: dict(dt_bias=p["dt_bias"].reshape(-1)),
    "initial_state N": lambda p: dict(initial_state=torch.zeros(2, 2, 32, 32)),
    "q non-contiguous": lambda p: dict(q=non_contiguous(p["q"])),
    "out non-contiguous": lambda p: dict(out=non_contiguous(torch.empty_like(p["v"]))),
    "final_state transposed": lambda p: dict(final_state=torch.zeros(1, 2, 32, 32).transpose(2, 3)),
    "dt_bias expanded (stride 0)": lambda p: dict(dt_bias=p["dt_bias"][:1].expand(2, 32)),
    "k on fake cuda:0": lambda p: dict(k=FakeDeviceTensor(p["k"].shape, "bfloat16", DL_CUDA, 0)),
    "out on fake cuda:0": lambda p: dict(out=FakeDeviceTensor(p["v"].shape, "bfloat16", DL_CUDA, 0)),
    "q on meta": lambda p: dict(q=torch.empty(p["q"].shape, dtype=torch.bfloat16, device="meta")),
    "lower_bound 0.5": lambda p: dict(lower_bound=0.5),
    "scale nan": lambda p: dict(scale=float("nan")),
    "cu_seqlens decreasing": lambda p: dict(cu_seqlens=torch.tensor([0, 6, 3, 8]), final_state=None,
                                            initial_state=None),
    "cu_seqlens_host without cu_seqlens": lambda p: dict(cu_seqlens_host=torch.tensor([0, 8])),
    "backend cuda on cpu tensors": lambda p: dict(backend="cuda"),
}


@pytest.mark.parametrize("case", list(FWD_VALUE_ERRORS))
def test_fwd_value_errors_are_identical(small, case):
    override = FWD_VALUE_ERRORS[case](small)
    fast, slow = both_paths(fwd_with(small, **override))
    assert fast == slow, f"fast path: {fast!r}\nDLPack path: {slow!r}"
    # A meta tensor cannot be exported through DLPack at all: both paths name its device
    # (a ValueError, as for any tensor on a device no backend reads).
    assert fast[0] is ValueError, fast
    if case == "q on meta":
        assert fast[1].startswith("q: expected a tensor in CPU or CUDA memory, got one on device meta"), fast


def test_fwd_error_messages_name_the_argument(small):
    # Spot checks of the messages themselves (the identity above covers the rest).
    fast, _ = both_paths(fwd_with(small, **FWD_TYPE_ERRORS["q complex64"](small)))
    assert fast == (TypeError, "q: expected dtype bfloat16, got complex64")
    fast, _ = both_paths(fwd_with(small, **FWD_TYPE_ERRORS["q bool"](small)))
    assert fast == (TypeError, "q: expected dtype bfloat16, got bool")
    fast, _ = both_paths(fwd_with(small, k=[1, 2, 3]))
    assert fast == (TypeError, "k: expected a tensor supporting DLPack (torch.Tensor, CuPy or NumPy array), "
                               "got list")
    fast, _ = both_paths(fwd_with(small, **FWD_VALUE_ERRORS["q rank 8"](small)))
    assert fast == (ValueError, "q: expected a 4-d tensor [B, T, H, K], got shape [1, 1, 1, 1, 1, 8, 2, 32]")
    fast, _ = both_paths(fwd_with(small, **FWD_VALUE_ERRORS["dt_bias expanded (stride 0)"](small)))
    assert fast == (ValueError, "dt_bias: expected a C-contiguous (dense row-major) tensor, got shape [2, 32] "
                                "with strides [0, 1] (call .contiguous())")


def test_workspace_size_errors_are_identical(small):
    def ws(**override):
        def run():
            o, f = new_outputs(small)
            kw = fwd_kwargs(small)
            kw.update(override)
            return flash_kda.workspace_size(small["q"], small["k"], small["v"], small["g"], small["beta"],
                                            small["scale"], o, final_state=f, **kw)
        return run

    fast, slow = both_paths(ws())
    assert fast == slow == ("ok", 0)
    assert_same_error(ws(A_log=small["A_log"].double()), TypeError)
    assert_same_error(ws(dt_bias=non_contiguous(small["dt_bias"])), ValueError)


@pytest.fixture(scope="module")
def dec():
    return make_decode(N=2, t=1, H=2, K=32, P=6, indices=[3, 1], seed=9)


DECODE_ERRORS = {
    "state_pool float16": (TypeError, lambda d: dict(state_pool=d["pool"].half())),
    "state_indices int16": (TypeError, lambda d: dict(state_indices=d["indices"].to(torch.int16))),
    "per_token_states bf16": (TypeError, lambda d: dict(per_token_states=torch.zeros(2, 2, 32, 32,
                                                                                     dtype=torch.bfloat16))),
    "q rank 2": (ValueError, lambda d: dict(q=d["q"][0])),
    "k shape": (ValueError, lambda d: dict(k=torch.zeros(2, 3, 32, dtype=torch.bfloat16))),
    "pool transposed slots": (ValueError, lambda d: dict(state_pool=d["pool"].clone().transpose(2, 3))),
    "pool overlapping slots": (ValueError, lambda d: dict(
        state_pool=torch.zeros(6 * 2048).as_strided((6, 2, 32, 32), (1024, 1024, 32, 1)))),
    "index past the pool": (ValueError, lambda d: dict(state_indices=torch.tensor([0, 6], dtype=torch.int32))),
    "out on fake cuda:0": (ValueError, lambda d: dict(out=FakeDeviceTensor(d["v"].shape, "bfloat16", DL_CUDA, 0))),
    "lower_bound 0": (ValueError, lambda d: dict(lower_bound=0.0)),
}


@pytest.mark.parametrize("case", list(DECODE_ERRORS))
def test_decode_errors_are_identical(dec, case):
    exc, override = DECODE_ERRORS[case]
    assert_same_error(lambda: call_with(dec, **override(dec)), exc)


def test_strided_pool_reads_the_slot_stride(dec):
    # The decode pool's slot stride comes from stride(0) on both paths.
    per_slot = 2 * 32 * 32

    def run():
        big = torch.full((6, 2 * per_slot), 7.0)
        pool = big[:, per_slot:].view(6, 2, 32, 32)
        pool.copy_(dec["pool"])
        out = flash_kda.decode(dec["q"], dec["k"], dec["v"], dec["g"], dec["beta"], dec["A_log"], dec["dt_bias"],
                               pool, dec["indices"], out=torch.empty_like(dec["v"]))
        return out, big

    fast, slow = both_paths(run)
    assert torch.equal(fast[1][0], slow[1][0]) and torch.equal(fast[1][1], slow[1][1])
    assert torch.all(fast[1][1][:, :per_slot] == 7)
