"""``chunk_kda``: fla's entry point (``fla.ops.kda.chunk_kda``) on flash_kda.

A call site written for fla's Triton path switches by changing one import. The
arguments are fla's, for what flash_kda computes: the gate, the q/k L2 norm and the
beta sigmoid inside the kernel (``use_gate_in_kernel``, ``use_qk_l2norm_in_kernel``,
``use_beta_sigmoid_in_kernel`` all True) with the safe gate (``safe_gate=True``,
``lower_bound`` in [-5, 0), default -5). Anything else raises NotImplementedError
naming the argument. States follow fla's ``state_v_first``: ``[N, HV, K, V]`` by
default (transposed copies in and out), ``[N, HV, V, K]`` with ``state_v_first=True``
(flash_kda's own layout, no copy).
"""
from __future__ import annotations

import math

import torch

from . import fwd

CHUNK = 64  # fla's chunk size: the interval of its intermediate states


def _require(flag, name, want):
    if flag != want:
        raise NotImplementedError(f"chunk_kda: flash_kda requires {name}={want!r}, got {flag!r}")


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
              allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False,
              return_intermediate_states=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
              cp_context=None, use_graph=False, max_num_seqs=None, *, A_log=None, dt_bias=None,
              initial_state_indices=None, **kwargs):
    """fla's ``chunk_kda`` computed by flash_kda (forward only, no autograd).

    Returns ``(o, final_state)``, or ``(o, final_state, h)`` with
    ``return_intermediate_states=True``: ``h`` holds each sequence's state at the start
    of every 64-token chunk, ``[B, NT, HV, K, V]`` (``[.., V, K]`` with state_v_first) in
    bf16, as fla's. ``final_state`` is fp32, or None without ``output_final_state``.

    ``initial_state_indices`` (int32/int64 ``[N]``, an extension): ``initial_state`` is
    then an engine's state pool ``[P, HV, V, K]`` (requires ``state_v_first=True``);
    sequence n starts from slot ``initial_state_indices[n]`` (zero for a negative index)
    and its final state is written back to that slot in place; ``final_state`` is None.
    """
    _require(use_qk_l2norm_in_kernel, "use_qk_l2norm_in_kernel", True)
    _require(use_gate_in_kernel, "use_gate_in_kernel", True)
    _require(use_beta_sigmoid_in_kernel, "use_beta_sigmoid_in_kernel", True)
    _require(safe_gate, "safe_gate", True)
    _require(allow_neg_eigval, "allow_neg_eigval", False)
    _require(cp_context, "cp_context", None)
    if A_log is None or dt_bias is None:
        raise NotImplementedError("chunk_kda: flash_kda requires A_log and dt_bias (the in-kernel gate)")
    if kwargs:
        raise TypeError(f"chunk_kda: unexpected arguments {sorted(kwargs)}")
    # disable_recompute, use_graph and max_num_seqs are about fla's own kernels
    # (training memory, its varlen chunk list): nothing to do here. cu_seqlens_cpu is
    # passed on as fwd's cu_seqlens_host: the host then checks the boundaries and the
    # checkpoint capacity, and the CUDA launch plan splits long sequences by the
    # real lengths on the host (without them, the device plans the split).
    # fla's layout is [B, T, H, K] (no head-first form): name a tensor of another rank,
    # and dt_bias of another size, before the shapes are unpacked from them.
    for name, x in (("q", q), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
        if x.ndim != 4:
            raise ValueError(f"{name}: expected a tensor [B, T, heads, dim], got shape {list(x.shape)}")
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    N = len(cu_seqlens) - 1 if cu_seqlens is not None else B
    if dt_bias.ndim == 1:
        if dt_bias.numel() != HV * K:
            raise ValueError(f"dt_bias: expected shape [HV * K] = [{HV * K}] (or [HV, K]), "
                             f"got {list(dt_bias.shape)}")
        dt_bias = dt_bias.reshape(HV, K)
    out = torch.empty_like(v)
    extra = {}
    if cu_seqlens is not None and cu_seqlens_cpu is not None:
        extra["cu_seqlens_host"] = cu_seqlens_cpu.to(device="cpu", dtype=torch.int64)
    if cu_seqlens is not None and not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"cu_seqlens: expected a torch.Tensor, got {type(cu_seqlens).__name__}")
    if return_intermediate_states:
        if cu_seqlens is not None:
            lengths = (cu_seqlens_cpu if cu_seqlens_cpu is not None else cu_seqlens).tolist()
            if any(b < a for a, b in zip(lengths[:-1], lengths[1:])):
                raise ValueError(f"cu_seqlens: expected non-decreasing values, got {lengths}")
            nt = sum(math.ceil((b - a) / CHUNK) for a, b in zip(lengths[:-1], lengths[1:]))
            shape = (1, nt)
        else:
            shape = (B, math.ceil(T / CHUNK))
        entry = (HV, V, K) if state_v_first else (HV, K, V)
        h = torch.empty(*shape, *entry, dtype=torch.bfloat16, device=q.device)
        extra.update(checkpoints=h, checkpoint_interval=CHUNK, checkpoints_value_major=state_v_first)

    final_state = None
    if initial_state_indices is not None:
        if initial_state is None:
            raise ValueError("initial_state: required with initial_state_indices (the state pool [P, HV, V, K])")
        if not state_v_first:
            raise NotImplementedError("chunk_kda: a state pool (initial_state_indices) needs state_v_first=True "
                                      "([P, HV, V, K] slots, flash_kda's layout)")
        fwd(q, k, v, g, beta, scale, out, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound,
            cu_seqlens=cu_seqlens, state_pool=initial_state, state_indices=initial_state_indices, **extra)
    else:
        s0 = initial_state
        if s0 is not None and not state_v_first:
            if not isinstance(s0, torch.Tensor) or s0.ndim != 4:
                raise ValueError(f"initial_state: expected a tensor [N, HV, K, V], got "
                                 f"{list(s0.shape) if isinstance(s0, torch.Tensor) else type(s0).__name__}")
            s0 = s0.transpose(-1, -2).contiguous()
        if output_final_state:
            # fla returns an fp32 final state whatever the initial one's dtype; a bf16
            # initial state is widened (exactly) so that both are fp32.
            if s0 is not None and s0.dtype != torch.float32:
                s0 = s0.float()
            final_state = torch.empty(N, HV, V, K, dtype=torch.float32, device=q.device)
        fwd(q, k, v, g, beta, scale, out, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound,
            initial_state=s0, final_state=final_state, cu_seqlens=cu_seqlens, **extra)
        if final_state is not None and not state_v_first:
            final_state = final_state.transpose(-1, -2).contiguous()
    if return_intermediate_states:
        return out, final_state, extra["checkpoints"]
    return out, final_state
