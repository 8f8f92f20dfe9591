"""``flash_kda::kda_forward``, ``flash_kda::kda_prefill`` and ``flash_kda::kda_decode``:
the KDA forward (dense states, or in place on a state pool with checkpoints) and the
decode step as torch.library custom ops.

Being a custom op (with a fake/meta implementation) is what lets torch.compile
trace through it with ``fullgraph=True`` and what keeps it one opaque node in the
graph; the real implementation allocates only through torch (capturable in a
CUDA graph) and launches on torch's current stream.
"""
# No `from __future__ import annotations`: torch.library.custom_op reads the real
# annotations to build the op schema (string annotations need a newer torch).
from typing import Optional, Tuple

import torch

from . import DEFAULT_LOWER_BOUND, _check_boundaries, _pdl_mode, _resolve_scalars, _type_name, decode, fwd

_STATE_DTYPES = (torch.float32, torch.bfloat16)


def _check_op_tensors(required, optional=()):
    """The ops' tensor arguments, named: each of `required` ((name, value) pairs) a
    torch.Tensor, each of `optional` one or None, and all on the device of the first.
    Checked before the op is called: torch sends a call with a tensor on another
    device (meta, say) to the fake implementation, which would return an unwritten
    out and leave the pool as it was, and a non-tensor gets the op's whole schema."""
    for name, x in required:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    for name, x in optional:
        if x is not None and not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor or None, got {type(x).__name__}")
    first, device = required[0][0], required[0][1].device
    for name, x in (*required, *optional):
        # cu_seqlens_host is a host copy by definition.
        if x is not None and name != "cu_seqlens_host" and x.device != device:
            raise ValueError(f"{name}: expected a tensor on the device of {first} ({device}), got {x.device}")


def _refuse_real_tensors_beside_meta(**named):
    """In a fake implementation: torch sends an op call here when any tensor is on the
    meta device, so a call from eager code with the other tensors real (cpu, cuda) would
    return an unwritten out and leave the pool as it was. Under torch.compile every
    tensor is a FakeTensor and an all-meta call only asks for shapes: both are fine."""
    from torch._subclasses.fake_tensor import FakeTensor

    tensors = [(n, x) for n, x in named.items() if isinstance(x, torch.Tensor) and n != "cu_seqlens_host"]
    meta = next((n for n, x in tensors if x.device.type == "meta" and not isinstance(x, FakeTensor)), None)
    if meta is None:
        return
    for name, x in tensors:
        if not isinstance(x, FakeTensor) and x.device.type != "meta":
            raise ValueError(f"{meta}: expected a tensor on the device of {name} ({x.device}), got meta")


def _token_args(q, k, v, g, beta, A_log, dt_bias, use_gate_in_kernel):
    # The (name, value) pairs every op starts with, for _check_op_tensors: (required,
    # optional). A_log and dt_bias are not read with the log decay (use_gate_in_kernel
    # False), and may then be None.
    tokens = (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta))
    gate = (("A_log", A_log), ("dt_bias", dt_bias))
    return (tokens + gate, ()) if use_gate_in_kernel else (tokens, gate)


def _check_forms(use_gate_in_kernel, use_beta_sigmoid_in_kernel):
    # Before the op: its schema's bool would take neither None nor an int by name.
    for name, x in (("use_gate_in_kernel", use_gate_in_kernel),
                    ("use_beta_sigmoid_in_kernel", use_beta_sigmoid_in_kernel)):
        if not isinstance(x, bool):
            raise TypeError(f"{name}: expected a bool, got {_type_name(x)} {x!r}")


def _num_seqs(q: torch.Tensor, cu_seqlens: Optional[torch.Tensor]):
    return cu_seqlens.shape[0] - 1 if cu_seqlens is not None else q.shape[0]


def _new_out(v, zeros=False):
    # A new dense out the shape of v (empty_like would copy a strided view's layout).
    # Decode leaves a padding entry's rows unwritten: zeros make them defined (as fla's
    # o), so an op's result never depends on what the allocator handed back.
    return (torch.zeros if zeros else torch.empty)(v.shape, dtype=v.dtype, device=v.device)


def _check_output_shapes(q, v, cu_seqlens):
    # kda_forward's outputs are allocated from these shapes: name what cannot give them.
    for name, x in (("q", q), ("v", v)):
        if x.ndim != 4:
            raise ValueError(f"{name}: expected a 4-d tensor, got shape {list(x.shape)}")
    _check_boundaries("cu_seqlens", cu_seqlens)


def _new_outputs(q, k, v, cu_seqlens, output_final_state, state_dtype):
    # Checked here too: the op may be called directly (torch.ops.flash_kda.kda_forward).
    _check_output_shapes(q, v, cu_seqlens)
    out = _new_out(v)
    if output_final_state:
        n = _num_seqs(q, cu_seqlens)
        final_state = torch.empty((n, v.shape[2], v.shape[3], q.shape[3]), dtype=state_dtype, device=q.device)
    else:
        # Custom ops return tensors only: an empty one stands for "no final state".
        final_state = torch.empty((0,), dtype=state_dtype, device=q.device)
    return out, final_state


@torch.library.custom_op("flash_kda::kda_forward", mutates_args=())
def _kda_forward_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    A_log: Optional[torch.Tensor],
    dt_bias: Optional[torch.Tensor],
    initial_state: Optional[torch.Tensor],
    cu_seqlens: Optional[torch.Tensor],
    scale: float,
    lower_bound: float,
    output_final_state: bool,
    state_dtype: torch.dtype,
    use_gate_in_kernel: bool = True,
    use_beta_sigmoid_in_kernel: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor]:
    out, final_state = _new_outputs(q, k, v, cu_seqlens, output_final_state, state_dtype)
    # The core takes one state dtype for both ends. Another state_dtype than the
    # initial state's runs in fp32: a bf16 initial state widens exactly, and an fp32
    # run's final state rounds to bf16 as the kernels' own bf16 store does.
    run_final = final_state
    if output_final_state and initial_state is not None and initial_state.dtype != state_dtype:
        if state_dtype == torch.float32:
            initial_state = initial_state.float()
        else:
            run_final = torch.empty(final_state.shape, dtype=torch.float32, device=final_state.device)
    fwd(q, k, v, g, beta, scale, out, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound,
        initial_state=initial_state, final_state=run_final if output_final_state else None,
        cu_seqlens=cu_seqlens, use_gate_in_kernel=use_gate_in_kernel,
        use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel)
    if run_final is not final_state:
        final_state.copy_(run_final)
    return out, final_state


@_kda_forward_op.register_fake
def _kda_forward_fake(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, scale, lower_bound,
                      output_final_state, state_dtype, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True):
    _refuse_real_tensors_beside_meta(q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias,
                                     initial_state=initial_state, cu_seqlens=cu_seqlens)
    return _new_outputs(q, k, v, cu_seqlens, output_final_state, state_dtype)


def kda_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    A_log: Optional[torch.Tensor],
    dt_bias: Optional[torch.Tensor],
    scale: Optional[float] = None,
    lower_bound: Optional[float] = DEFAULT_LOWER_BOUND,
    initial_state: Optional[torch.Tensor] = None,
    cu_seqlens: Optional[torch.Tensor] = None,
    output_final_state: bool = False,
    state_dtype: Optional[torch.dtype] = None,
    *,
    use_gate_in_kernel: bool = True,
    use_beta_sigmoid_in_kernel: bool = True,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Functional KDA forward: returns ``(out, final_state)``.

    Same tensors as :func:`flash_kda.fwd` (q, k ``[B,T,H,K]``, v ``[B,T,HV,V]``, g ``[B,T,HV,K]``,
    beta ``[B,T,HV]`` bf16; A_log ``[HV]``, dt_bias ``[HV,K]`` fp32; initial_state
    ``[N,HV,V,K]``; cu_seqlens int64 or int32 ``[N+1]``). ``out`` is new bf16 ``[B,T,HV,V]``;
    ``final_state`` is new ``[N,HV,V,K]`` of ``state_dtype`` (default: initial_state's
    dtype, else fp32) when ``output_final_state``, else None; a state_dtype other than
    initial_state's runs with fp32 states (a bf16 initial state widens exactly; a bf16
    final state is the fp32 one rounded). ``use_gate_in_kernel``, ``use_beta_sigmoid_in_kernel``:
    what g and beta hold, as for :func:`flash_kda.fwd` (False: the log decay, bf16 or fp32,
    with A_log and dt_bias not read and allowed None; b itself, bf16 or fp32). Forward only
    (no autograd).
    """
    _check_forms(use_gate_in_kernel, use_beta_sigmoid_in_kernel)
    required, gate = _token_args(q, k, v, g, beta, A_log, dt_bias, use_gate_in_kernel)
    _check_op_tensors(required, (*gate, ("initial_state", initial_state), ("cu_seqlens", cu_seqlens)))
    if not isinstance(output_final_state, bool):
        raise TypeError(f"output_final_state: expected a bool, got {_type_name(output_final_state)} "
                        f"{output_final_state!r}")
    scale, lower_bound = _resolve_scalars(q, scale, lower_bound)
    _check_output_shapes(q, v, cu_seqlens)
    if state_dtype is None:
        state_dtype = initial_state.dtype if initial_state is not None else torch.float32
        if state_dtype not in _STATE_DTYPES:
            raise TypeError(f"initial_state: expected dtype torch.float32 or torch.bfloat16, got {state_dtype}")
    if state_dtype not in _STATE_DTYPES:
        raise TypeError(f"state_dtype: expected torch.float32 or torch.bfloat16, got {state_dtype}")
    out, final_state = _kda_forward_op(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens,
                                       scale, lower_bound, bool(output_final_state), state_dtype,
                                       use_gate_in_kernel, use_beta_sigmoid_in_kernel)
    return out, (final_state if output_final_state else None)


@torch.library.custom_op("flash_kda::kda_prefill", mutates_args=("state_pool", "checkpoints"))
def _kda_prefill_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    A_log: Optional[torch.Tensor],
    dt_bias: Optional[torch.Tensor],
    state_pool: torch.Tensor,
    state_indices: torch.Tensor,
    has_initial_state: Optional[torch.Tensor],
    cu_seqlens: Optional[torch.Tensor],
    cu_seqlens_host: Optional[torch.Tensor],
    checkpoints: Optional[torch.Tensor],
    checkpoint_interval: int,
    checkpoints_value_major: bool,
    slot_checkpoint_offsets: Optional[torch.Tensor],
    slot_checkpoint_slots: Optional[torch.Tensor],
    scale: float,
    lower_bound: float,
    use_gate_in_kernel: bool = True,
    use_beta_sigmoid_in_kernel: bool = True,
) -> torch.Tensor:
    out = _new_out(v)
    fwd(q, k, v, g, beta, scale, out, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound,
        cu_seqlens=cu_seqlens, cu_seqlens_host=cu_seqlens_host, state_pool=state_pool,
        state_indices=state_indices, has_initial_state=has_initial_state, checkpoints=checkpoints,
        checkpoint_interval=checkpoint_interval, checkpoints_value_major=checkpoints_value_major,
        slot_checkpoint_offsets=slot_checkpoint_offsets, slot_checkpoint_slots=slot_checkpoint_slots,
        use_gate_in_kernel=use_gate_in_kernel, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel)
    return out


@_kda_prefill_op.register_fake
def _kda_prefill_fake(q, k, v, g, beta, A_log, dt_bias, state_pool, state_indices, has_initial_state, cu_seqlens,
                      cu_seqlens_host, checkpoints, checkpoint_interval, checkpoints_value_major,
                      slot_checkpoint_offsets, slot_checkpoint_slots, scale, lower_bound, use_gate_in_kernel=True,
                      use_beta_sigmoid_in_kernel=True):
    _refuse_real_tensors_beside_meta(q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias,
                                     state_pool=state_pool, state_indices=state_indices,
                                     has_initial_state=has_initial_state, cu_seqlens=cu_seqlens,
                                     cu_seqlens_host=cu_seqlens_host, checkpoints=checkpoints,
                                     slot_checkpoint_offsets=slot_checkpoint_offsets,
                                     slot_checkpoint_slots=slot_checkpoint_slots)
    return _new_out(v)


def kda_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    A_log: Optional[torch.Tensor],
    dt_bias: Optional[torch.Tensor],
    state_pool: torch.Tensor,
    state_indices: torch.Tensor,
    *,
    has_initial_state: Optional[torch.Tensor] = None,
    cu_seqlens: Optional[torch.Tensor] = None,
    cu_seqlens_host: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    lower_bound: Optional[float] = DEFAULT_LOWER_BOUND,
    checkpoints: Optional[torch.Tensor] = None,
    checkpoint_interval: int = 64,
    checkpoints_value_major: bool = False,
    slot_checkpoint_offsets: Optional[torch.Tensor] = None,
    slot_checkpoint_slots: Optional[torch.Tensor] = None,
    use_gate_in_kernel: bool = True,
    use_beta_sigmoid_in_kernel: bool = True,
) -> torch.Tensor:
    """A prefill on a state pool as a custom op: returns a new ``out``; ``state_pool`` (each
    sequence's final state back in its slot, and the states ``slot_checkpoint_*`` ask for)
    and ``checkpoints`` are written in place, as by :func:`flash_kda.fwd` with
    ``state_pool=``, whose tensors and rules these are (``state_indices`` int32/int64
    ``[N]``, a negative index reads and writes no slot; ``has_initial_state`` bool/uint8
    ``[N]``; ``cu_seqlens`` int32/int64; ``checkpoints`` every ``checkpoint_interval``
    tokens). Traceable by torch.compile (``fullgraph=True``): the op declares what it
    mutates, so a compiled engine step (prefill, then :func:`kda_decode` on the same pool)
    sees the pool's updates in order. ``use_gate_in_kernel``, ``use_beta_sigmoid_in_kernel``:
    what g and beta hold, as for :func:`flash_kda.fwd`. Forward only (no autograd).
    """
    _check_forms(use_gate_in_kernel, use_beta_sigmoid_in_kernel)
    required, gate = _token_args(q, k, v, g, beta, A_log, dt_bias, use_gate_in_kernel)
    _check_op_tensors((*required, ("state_pool", state_pool), ("state_indices", state_indices)),
                      (*gate, ("has_initial_state", has_initial_state), ("cu_seqlens", cu_seqlens),
                       ("cu_seqlens_host", cu_seqlens_host), ("checkpoints", checkpoints),
                       ("slot_checkpoint_offsets", slot_checkpoint_offsets),
                       ("slot_checkpoint_slots", slot_checkpoint_slots)))
    scale, lower_bound = _resolve_scalars(q, scale, lower_bound)
    if not isinstance(checkpoint_interval, int) or isinstance(checkpoint_interval, bool):
        raise TypeError(f"checkpoint_interval: expected an int, got {_type_name(checkpoint_interval)} "
                        f"{checkpoint_interval!r}")
    if not -2**63 <= checkpoint_interval < 2**63:  # the op's int is int64
        raise ValueError(f"checkpoint_interval: expected a multiple of 16 within int64, got {checkpoint_interval}")
    if not isinstance(checkpoints_value_major, bool):  # bool("False") would be True
        raise TypeError(f"checkpoints_value_major: expected a bool, got {_type_name(checkpoints_value_major)} "
                        f"{checkpoints_value_major!r}")
    return _kda_prefill_op(q, k, v, g, beta, A_log, dt_bias, state_pool, state_indices, has_initial_state,
                           cu_seqlens, cu_seqlens_host, checkpoints, checkpoint_interval,
                           bool(checkpoints_value_major), slot_checkpoint_offsets, slot_checkpoint_slots, scale,
                           lower_bound, use_gate_in_kernel, use_beta_sigmoid_in_kernel)


@torch.library.custom_op("flash_kda::kda_decode", mutates_args=("state_pool", "per_token_states"))
def _kda_decode_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    A_log: Optional[torch.Tensor],
    dt_bias: Optional[torch.Tensor],
    state_pool: torch.Tensor,
    state_indices: torch.Tensor,
    cu_seqlens: Optional[torch.Tensor],
    per_token_states: Optional[torch.Tensor],
    scale: float,
    lower_bound: float,
    pdl: Optional[bool],
    num_accepted_tokens: Optional[torch.Tensor] = None,
    use_gate_in_kernel: bool = True,
    use_beta_sigmoid_in_kernel: bool = True,
) -> torch.Tensor:
    out = _new_out(v, zeros=True)
    decode(q, k, v, g, beta, A_log, dt_bias, state_pool, state_indices, out=out, scale=scale,
           lower_bound=lower_bound, cu_seqlens=cu_seqlens, per_token_states=per_token_states, pdl=pdl,
           num_accepted_tokens=num_accepted_tokens, use_gate_in_kernel=use_gate_in_kernel,
           use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel)
    return out


@_kda_decode_op.register_fake
def _kda_decode_fake(q, k, v, g, beta, A_log, dt_bias, state_pool, state_indices, cu_seqlens, per_token_states,
                     scale, lower_bound, pdl, num_accepted_tokens=None, use_gate_in_kernel=True,
                     use_beta_sigmoid_in_kernel=True):
    _refuse_real_tensors_beside_meta(q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias,
                                     state_pool=state_pool, state_indices=state_indices, cu_seqlens=cu_seqlens,
                                     per_token_states=per_token_states, num_accepted_tokens=num_accepted_tokens)
    return _new_out(v)


def kda_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    A_log: Optional[torch.Tensor],
    dt_bias: Optional[torch.Tensor],
    state_pool: torch.Tensor,
    state_indices: torch.Tensor,
    scale: Optional[float] = None,
    lower_bound: Optional[float] = DEFAULT_LOWER_BOUND,
    cu_seqlens: Optional[torch.Tensor] = None,
    per_token_states: Optional[torch.Tensor] = None,
    pdl: Optional[bool] = None,
    num_accepted_tokens: Optional[torch.Tensor] = None,
    *,
    use_gate_in_kernel: bool = True,
    use_beta_sigmoid_in_kernel: bool = True,
) -> torch.Tensor:
    """One decode step as a custom op: returns a new ``out`` (zero-filled first, so a padding
    entry's rows read 0); ``state_pool`` (and
    ``per_token_states`` when given) are updated in place, as by :func:`flash_kda.decode`,
    whose tensors and rules these are (speculative verify too: ``state_indices``
    ``[N, 1 + S]`` with ``num_accepted_tokens``). Traceable by torch.compile (``fullgraph=True``):
    the op declares what it mutates, so compiled graphs see the pool's update.
    For a separate output pool use :func:`flash_kda.decode`. Forward only (no autograd).
    ``pdl``: None (default, auto: the measured choice, currently PDL at every size),
    True (on) or False (off); see :func:`flash_kda.decode`. ``use_gate_in_kernel``,
    ``use_beta_sigmoid_in_kernel``: what g and beta hold, as for :func:`flash_kda.decode`.
    """
    _pdl_mode(pdl)  # the TypeError naming pdl here, not from inside the op
    _check_forms(use_gate_in_kernel, use_beta_sigmoid_in_kernel)
    required, gate = _token_args(q, k, v, g, beta, A_log, dt_bias, use_gate_in_kernel)
    _check_op_tensors((*required, ("state_pool", state_pool), ("state_indices", state_indices)),
                      (*gate, ("cu_seqlens", cu_seqlens), ("per_token_states", per_token_states),
                       ("num_accepted_tokens", num_accepted_tokens)))
    scale, lower_bound = _resolve_scalars(q, scale, lower_bound)
    return _kda_decode_op(q, k, v, g, beta, A_log, dt_bias, state_pool, state_indices, cu_seqlens,
                          per_token_states, scale, lower_bound, pdl, num_accepted_tokens, use_gate_in_kernel,
                          use_beta_sigmoid_in_kernel)
