"""Device-resident arguments that break the rules (cu_seqlens values, decode's
state_indices): the kernels touch nothing outside the given tensors, and
flash_kda.check_device_faults() raises ValueError naming the argument, once."""
from __future__ import annotations

import pytest
import torch

import flash_kda
from gpu_skip import skip_reason
from kda_reference import fwd_kwargs, make_problem

requires_gpu = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))
SENTINEL = 0x5A
GUARD = 1 << 16


def test_check_without_a_gpu_kernel_is_quiet():
    # No CUDA kernel ran in this process (or the CPU backend ran): nothing to report.
    if skip_reason() is None:
        torch.cuda.synchronize()
    flash_kda.check_device_faults()


def test_check_names_a_non_cuda_device():
    with pytest.raises(ValueError, match="device: expected a CUDA device"):
        flash_kda.check_device_faults(device=torch.device("cpu"))
    with pytest.raises(ValueError, match="device: expected a CUDA device"):
        flash_kda.check_device_faults(device=torch.zeros(1))


def _guarded(shape, dtype, device="cuda"):
    """A tensor of `shape` inside a byte buffer with GUARD sentinel bytes on each side."""
    n = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    raw = torch.full((n + 2 * GUARD,), SENTINEL, dtype=torch.uint8, device=device)
    view = raw[GUARD:GUARD + n].view(dtype).view(shape)
    return raw, view, n


def _intact(raw, n):
    return bool((raw[:GUARD] == SENTINEL).all()) and bool((raw[GUARD + n:] == SENTINEL).all())


@requires_gpu
@pytest.mark.parametrize("bad", ["last_past_T", "decreasing", "first_not_zero", "huge"])
def test_forward_cu_seqlens(bad):
    flash_kda.check_device_faults()  # start clean
    p = make_problem(seqlens=[37, 16, 130, 5], H=2, seed=71, device="cuda")
    cu = p["cu_seqlens"].clone()
    T = int(cu[-1])
    if bad == "last_past_T":
        cu[-1] = T + 1000
    elif bad == "decreasing":
        cu[2] = cu[1] - 10
    elif bad == "first_not_zero":
        cu[0] = 7
    else:
        cu[2] = 1 << 40
    raw_out, out, n_out = _guarded(p["v"].shape, torch.bfloat16)
    raw_fs, fs, n_fs = _guarded((4, 2, 128, 128), torch.float32)
    kw = fwd_kwargs(p)
    kw["cu_seqlens"] = cu
    flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, final_state=fs, **kw)
    torch.cuda.synchronize()
    assert _intact(raw_out, n_out), "out's guard bands were written"
    assert _intact(raw_fs, n_fs), "final_state's guard bands were written"
    with pytest.raises(ValueError, match=r"cu_seqlens \(forward\)"):
        flash_kda.check_device_faults()
    flash_kda.check_device_faults()  # cleared by the check


@requires_gpu
def test_decode_state_index_past_the_pool():
    flash_kda.check_device_faults()
    N, H, K = 4, 2, 128
    gen = torch.Generator(device="cuda").manual_seed(72)
    q, k, g = (torch.randn(N, H, K, generator=gen, device="cuda").bfloat16() for _ in range(3))
    v = torch.randn(N, H, K, generator=gen, device="cuda").bfloat16()
    beta = torch.randn(N, H, generator=gen, device="cuda").bfloat16()
    A_log = torch.rand(H, device="cuda")
    dt_bias = torch.rand(H, K, device="cuda")
    raw_pool, pool, n_pool = _guarded((6, H, K, K), torch.float32)
    pool.normal_()
    idx = torch.tensor([0, 9, 2, 2 ** 31 - 1], dtype=torch.int32, device="cuda")
    flash_kda.decode(q, k, v, g, beta, A_log, dt_bias, pool, idx)
    torch.cuda.synchronize()
    assert _intact(raw_pool, n_pool), "the pool's guard bands were written"
    with pytest.raises(ValueError, match=r"state_indices \(decode\).*first at sequence 1\."):
        flash_kda.check_device_faults()
    flash_kda.check_device_faults()
