"""``chunk_kda`` and ``fused_recurrent_kda``: fla's entry points
(``fla.ops.kda.chunk_kda``, ``fla.ops.kda.fused_recurrent_kda``) on flash_kda.

A call site written for fla's Triton path switches by changing one import. The
arguments are fla's, with fla's defaults, for what flash_kda computes: the q/k L2 norm
inside the kernel (``use_qk_l2norm_in_kernel=True``), and for g and beta either form
fla's flags name:

- ``use_gate_in_kernel=False`` (fla's default): g is the log decay itself, bf16 or fp32
  (e.g. ``fused_kda_gate``'s output), any strength; ``A_log``, ``dt_bias``, ``lower_bound``
  and ``safe_gate`` are then not read. ``True``: g is the raw gate of the safe gate
  ``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`` (``lower_bound`` given, or
  ``safe_gate=True`` for -5; one outside [-5, 0) is fwd's ValueError).
- ``use_beta_sigmoid_in_kernel=False`` (fla's default): beta is b itself (bf16 or fp32);
  ``True``: the logit, ``b = sigmoid(beta)``.

So vLLM's Kimi Linear call, ``chunk_kda(q, k, v, g=fused_kda_gate(...), beta=b.float().sigmoid(),
initial_state=..., output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=...)``,
runs as it is. fla's in-kernel softplus gate (``use_gate_in_kernel=True`` without
``lower_bound``: ``-exp(A_log) * softplus(g + dt_bias)``, which no flash_kda kernel
computes) is formed here in fp32 torch and passed on as the log decay: one elementwise
pass more than fla's fused gate, the same function. What flash_kda does not compute
raises NotImplementedError naming the argument: ``use_qk_l2norm_in_kernel=False`` and
``allow_neg_eigval=True`` (with ``use_beta_sigmoid_in_kernel=False`` it is fla's
ValueError); so do chunk_kda's inputs that require grad under autograd (forward only;
fused_recurrent_kda, like fla's, is no autograd function and reads them as they are).

States follow fla's ``state_v_first``: ``[N, HV, K, V]`` by
default, ``[N, HV, V, K]`` with ``state_v_first=True`` (flash_kda's own layout). chunk_kda
reads and writes either in place (``fwd(states_key_major=)``); fused_recurrent_kda's
dense ``[N, HV, K, V]`` states are transposed copies in and out (decode runs on a pool,
whose slots are ``[HV, V, K]``).
"""
from __future__ import annotations

import math

import torch

from . import _check_boundaries, _widened, decode, fwd

CHUNK = 64  # fla's chunk size: the interval of its intermediate states


def _require(flag, name, want, entry="chunk_kda"):
    if flag != want:
        raise NotImplementedError(f"{entry}: flash_kda requires {name}={want!r}, got {flag!r}")


def _forms(entry, use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
           lower_bound, safe_gate=False):
    """(fwd's and decode's keyword arguments for what fla's flags say g and beta hold,
    whether g is the raw input of fla's softplus gate, which the caller forms first:
    _softplus_log_decay); NotImplementedError naming the flag for what flash_kda does not
    compute, and fla's own ValueError where fla raises one."""
    _require(use_qk_l2norm_in_kernel, "use_qk_l2norm_in_kernel", True, entry)
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        # fla's own check: the factor 2 scales sigmoid(beta), so it needs the in-kernel sigmoid.
        raise ValueError("allow_neg_eigval: True requires use_beta_sigmoid_in_kernel=True")
    _require(allow_neg_eigval, "allow_neg_eigval", False, entry)
    # fla's in-kernel gate is lower_bound·sigmoid(...) whenever lower_bound is given
    # (chunk_kda: safe_gate only picks its kernels); without it, -exp(A_log)·softplus(...).
    softplus = bool(use_gate_in_kernel) and lower_bound is None and not safe_gate
    return (dict(use_gate_in_kernel=bool(use_gate_in_kernel) and not softplus,
                 use_beta_sigmoid_in_kernel=bool(use_beta_sigmoid_in_kernel)), softplus)


def _softplus_log_decay(g, A_log, dt_bias, HV, K):
    """fla's in-kernel gate without lower_bound, -exp(A_log) * softplus(g + dt_bias), as
    the log decay (fp32, g's shape [..., HV, K]); a missing A_log is 0 and a missing
    dt_bias 0, as in fla's gate. The three are checked here, since torch would broadcast
    shapes fwd refuses: g bf16 or fp32 [..., HV, K], A_log [HV] and dt_bias [HV, K] (or
    [HV * K]) in fp32, bf16 or fp16."""
    A_log, dt_bias = _gate_parameters(A_log, dt_bias, g, HV, K, dict(use_gate_in_kernel=True))
    for name, x, dtypes, shape in (("g", g, (torch.bfloat16, torch.float32), None),
                                   ("A_log", A_log, (torch.float32,), (HV,)),
                                   ("dt_bias", dt_bias, (torch.float32,), (HV, K))):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in dtypes:
            raise TypeError(f"{name}: expected dtype {' or '.join(str(d) for d in dtypes)} (or bf16 / fp16, "
                            f"widened, for A_log and dt_bias), got {x.dtype}")
        if shape is not None and tuple(x.shape) != shape:
            raise ValueError(f"{name}: expected shape {list(shape)}, got {list(x.shape)}")
        if x.device != g.device:
            raise ValueError(f"{name}: expected a tensor on {g.device} (g's device), got {x.device}")
    if g.shape[-2:] != (HV, K):
        raise ValueError(f"g: expected shape [..., HV, K] = [..., {HV}, {K}], got {list(g.shape)}")
    return -torch.exp(A_log)[:, None] * torch.nn.functional.softplus(g.float() + dt_bias)


def _gate_parameters(A_log, dt_bias, q, HV, K, forms):
    """A_log [HV] and dt_bias [HV, K] as fwd and decode take them (fp32). As in fla's
    gate, a missing A_log is a factor of 1 (A_log = 0) and a missing dt_bias is 0; a
    bf16 or fp16 one (a model cast to half precision) widens exactly. With the log
    decay (use_gate_in_kernel=False) neither is read, as fla reads neither: None."""
    if not forms["use_gate_in_kernel"]:
        return None, None
    if A_log is None:
        A_log = torch.zeros(HV, dtype=torch.float32, device=q.device)
    if dt_bias is None:
        dt_bias = torch.zeros(HV, K, dtype=torch.float32, device=q.device)
    return _widened(A_log), _dt_bias_2d(_widened(dt_bias), HV, K)


def _state_v_first(state_v_first, kwargs):
    """state_v_first, or fla's deprecated name for it (taken out of kwargs)."""
    if "transpose_state_layout" not in kwargs:
        return state_v_first
    if state_v_first:
        raise ValueError("state_v_first: cannot pass both state_v_first and the deprecated transpose_state_layout")
    return bool(kwargs.pop("transpose_state_layout"))


def _refuse_autograd(entry, **tensors):
    """flash_kda runs the forward only: an output without a gradient where fla's has
    one would train silently without it (fla's own flash_kda backend falls back to
    Triton whenever gradients are on)."""
    if not torch.is_grad_enabled():
        return
    for name, x in tensors.items():
        if isinstance(x, torch.Tensor) and x.requires_grad:
            raise NotImplementedError(
                f"{entry}: flash_kda computes the forward only, and {name} requires grad: call it under "
                f"torch.no_grad() or torch.inference_mode(), or use fla's {entry} for training")


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
              allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False,
              return_intermediate_states=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
              cp_context=None, use_graph=False, max_num_seqs=None, *, A_log=None, dt_bias=None,
              initial_state_indices=None, **kwargs):
    """fla's ``chunk_kda`` computed by flash_kda (forward only: with gradients enabled
    and an input that requires grad it raises NotImplementedError, where fla's own
    flash_kda backend falls back to Triton).

    Returns ``(o, final_state)``, or ``(o, final_state, h)`` with
    ``return_intermediate_states=True``: ``h`` holds each sequence's state at the start
    of every ``chunk_size``-token chunk (64, or 32), ``[B, NT, HV, K, V]`` (``[.., V, K]``
    with state_v_first) in bf16, as fla's; with ``use_graph`` and cu_seqlens, NT is fla's
    fixed ``ceil(T / chunk_size) + max_num_seqs - 1`` (the rows past the sequences'
    chunks left as they were) and the lengths are not read on the host.
    ``final_state`` is fp32, or None without ``output_final_state``. g and beta as the
    module docstring says: with ``use_gate_in_kernel=False`` (fla's default) g is the log
    decay (bf16 or fp32) and A_log, dt_bias, lower_bound and safe_gate are not read; with
    ``use_beta_sigmoid_in_kernel=False`` (fla's default) beta is b itself (bf16 or fp32).
    With ``use_gate_in_kernel=True``, as in fla's gate, ``lower_bound`` selects the safe
    gate whatever ``safe_gate`` says (``safe_gate=True`` without it takes -5; with neither,
    fla's softplus gate, formed in torch: the module docstring), a missing ``A_log`` is 0
    and a missing ``dt_bias`` 0.
    ``initial_state`` may be fp32, bf16 or fp16 (fp16 is widened exactly, as is bf16 when
    a final state is returned); other dtypes are a TypeError naming it. fwd's errors name
    chunk_kda's arguments (``cu_seqlens_cpu``, ``initial_state_indices``, ...).

    ``initial_state_indices`` (int32/int64 ``[N]``, an extension): ``initial_state`` is
    then an engine's state pool ``[P, HV, V, K]`` (requires ``state_v_first=True``);
    sequence n starts from slot ``initial_state_indices[n]`` (zero for a negative index)
    and its final state is written back to that slot in place; ``final_state`` is None.
    """
    forms, softplus = _forms("chunk_kda", use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
                             allow_neg_eigval, lower_bound, safe_gate)
    _require(cp_context, "cp_context", None)
    gate_parameters = dict(A_log=A_log, dt_bias=dt_bias) if use_gate_in_kernel else {}
    _refuse_autograd("chunk_kda", q=q, k=k, v=v, g=g, beta=beta, **gate_parameters, initial_state=initial_state)
    if not forms["use_gate_in_kernel"]:
        lower_bound = None  # not read with the log decay (fla reads it only for its in-kernel gate)
    state_v_first = _state_v_first(state_v_first, kwargs)
    chunk_size = kwargs.pop("chunk_size", CHUNK)
    if chunk_size not in (32, 64):
        raise ValueError(f"chunk_size: expected 32 or 64 (the interval of h), got {chunk_size!r}")
    if kwargs:
        raise TypeError(f"chunk_kda: unexpected arguments {sorted(kwargs)}")
    # disable_recompute, use_graph and max_num_seqs are about fla's own kernels
    # (training memory, its varlen chunk list): nothing to do here. cu_seqlens_cpu is
    # passed on as fwd's cu_seqlens_host: the host then checks the boundaries and the
    # checkpoint capacity, and the CUDA launch plan splits long sequences by the
    # real lengths on the host (without them, the device plans the split).
    B, T, H, K, HV, V = _fla_shapes(q, v)
    _check_boundaries("cu_seqlens", cu_seqlens)
    _check_boundaries("cu_seqlens_cpu", cu_seqlens_cpu)
    if cu_seqlens_cpu is not None:
        # Without cu_seqlens the batch would run as B whole sequences, whatever the copy says.
        if cu_seqlens is None:
            raise ValueError("cu_seqlens_cpu: given without cu_seqlens")
        # It goes on as int64: a float copy would be truncated into another, silently.
        if cu_seqlens_cpu.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"cu_seqlens_cpu: expected dtype int64 or int32, got {cu_seqlens_cpu.dtype}")
    if cu_seqlens is not None and B != 1:
        raise ValueError(f"q: expected batch size 1 with cu_seqlens (flattened sequences), got {B}")
    N = len(cu_seqlens) - 1 if cu_seqlens is not None else B
    if softplus:
        g = _softplus_log_decay(g, A_log, dt_bias, HV, K)
    A_log, dt_bias = _gate_parameters(A_log, dt_bias, q, HV, K, forms)
    graph = use_graph and cu_seqlens is not None
    if graph:
        if max_num_seqs is None:
            max_num_seqs = N
        if N != max_num_seqs:
            raise ValueError(f"max_num_seqs: expected cu_seqlens padded with empty sequences to max_num_seqs + 1 = "
                             f"{max_num_seqs + 1} entries (use_graph), got {N + 1}")
    # Dense whatever v's strides (empty_like keeps a permuted view's).
    out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    extra = {}
    if cu_seqlens is not None and cu_seqlens_cpu is not None:
        extra["cu_seqlens_host"] = cu_seqlens_cpu.to(device="cpu", dtype=torch.int64)
    if return_intermediate_states:
        if graph:
            # fla's fixed chunk list: its size from the shapes alone (nothing read on
            # the host); the sequences' entries come first, in the same order.
            shape = (1, math.ceil(T / chunk_size) + max_num_seqs - 1)
        elif cu_seqlens is not None:
            lengths = (cu_seqlens_cpu if cu_seqlens_cpu is not None else cu_seqlens).tolist()
            # Checked before sizing the buffer from them (fwd checks them again).
            if lengths[0] != 0 or lengths[-1] != T or any(b < a for a, b in zip(lengths[:-1], lengths[1:])):
                raise ValueError(f"cu_seqlens: expected 0 = cu_seqlens[0] <= ... <= cu_seqlens[N] = T = {T}, "
                                 f"got {lengths}")
            nt = sum(math.ceil((b - a) / chunk_size) for a, b in zip(lengths[:-1], lengths[1:]))
            shape = (1, nt)
        else:
            shape = (B, math.ceil(T / chunk_size))
        entry = (HV, V, K) if state_v_first else (HV, K, V)
        h = torch.empty(*shape, *entry, dtype=torch.bfloat16, device=q.device)
        if h.numel():  # no tokens, no entries: fla returns the empty h
            extra.update(checkpoints=h, checkpoint_interval=chunk_size, checkpoints_value_major=state_v_first)

    final_state = None
    if initial_state_indices is not None:
        if initial_state is None:
            raise ValueError("initial_state: required with initial_state_indices (the state pool [P, HV, V, K])")
        if not state_v_first:
            raise NotImplementedError("chunk_kda: a state pool (initial_state_indices) needs state_v_first=True "
                                      "([P, HV, V, K] slots, flash_kda's layout)")
        _call_named(fwd, _CHUNK_KDA_NAMES, q, k, v, g, beta, scale, out, A_log=A_log, dt_bias=dt_bias,
                    lower_bound=lower_bound, cu_seqlens=cu_seqlens, state_pool=initial_state,
                    state_indices=initial_state_indices, **forms, **extra)
    else:
        # fla's default layout, [N, HV, K, V], is read and written as it is
        # (states_key_major): no transposed copies in and out.
        _check_state_dtype(initial_state)
        s0 = initial_state
        # fla returns an fp32 final state whatever the initial one's dtype, so with one a
        # bf16 initial state is widened (exactly) too; fp16, which fwd does not read, always.
        if isinstance(s0, torch.Tensor) and (s0.dtype == torch.float16 or
                                             (output_final_state and s0.dtype != torch.float32)):
            s0 = s0.to(torch.float32, memory_format=torch.contiguous_format)
        if output_final_state:
            final_state = torch.empty(N, HV, V if state_v_first else K, K if state_v_first else V,
                                      dtype=torch.float32, device=q.device)
        if isinstance(s0, torch.Tensor) and not s0.is_contiguous():  # e.g. a transposed view
            s0 = s0.contiguous()
        _call_named(fwd, _CHUNK_KDA_NAMES, q, k, v, g, beta, scale, out, A_log=A_log, dt_bias=dt_bias,
                    lower_bound=lower_bound, initial_state=s0, final_state=final_state, cu_seqlens=cu_seqlens,
                    states_key_major=not state_v_first, **forms, **extra)
    if return_intermediate_states:
        return out, final_state, h
    return out, final_state


def _fla_shapes(q, v):
    """(B, T, H, K, HV, V) of fla's [B, T, heads, dim] layout (there is no head-first
    form), naming a tensor of another kind or rank before unpacking it."""
    for name, x in (("q", q), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
        if x.ndim != 4:
            raise ValueError(f"{name}: expected a tensor [B, T, heads, dim], got shape {list(x.shape)}")
    return (*q.shape, v.shape[2], v.shape[3])


# fla's kernels read a state of any float dtype into fp32. These are the ones that
# widen exactly: a float64 state would be rounded, and an integer one is a mistake.
_STATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check_state_dtype(initial_state):
    if isinstance(initial_state, torch.Tensor) and initial_state.dtype not in _STATE_DTYPES:
        raise TypeError(f"initial_state: expected dtype float32, bfloat16 or float16 (widened exactly), "
                        f"got {initial_state.dtype}")


# fwd's and decode's names for what the caller passed under fla's names, as the
# errors of chunk_kda and fused_recurrent_kda's serving form name them.
_CHUNK_KDA_NAMES = (("state_indices", "initial_state_indices"), ("state_pool", "initial_state"),
                    ("cu_seqlens_host", "cu_seqlens_cpu"), ("(states_key_major)", "(fla's layout, state_v_first=False)"))
_SERVING_NAMES = (("state_indices", "ssm_state_indices"), ("state_pool", "initial_state"))


def _call_named(fn, names, *args, **kwargs):
    """fn(*args, **kwargs), its argument errors naming the caller's arguments (`names`:
    pairs of fn's name and the caller's) where fn names its own."""
    try:
        return fn(*args, **kwargs)
    except (TypeError, ValueError) as e:
        message = str(e)
        for ours, theirs in names:
            message = message.replace(ours, theirs)
        if message == str(e):
            raise
        raise type(e)(message) from None


def _dt_bias_2d(dt_bias, HV, K):
    if not isinstance(dt_bias, torch.Tensor):
        raise TypeError(f"dt_bias: expected a torch.Tensor, got {type(dt_bias).__name__}")
    if dt_bias.ndim == 1:
        if dt_bias.numel() != HV * K:
            raise ValueError(f"dt_bias: expected shape [HV * K] = [{HV * K}] (or [HV, K]), "
                             f"got {list(dt_bias.shape)}")
        return dt_bias.reshape(HV, K)
    return dt_bias


def fused_recurrent_kda(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, initial_state=None,
                        output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                        use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None,
                        state_v_first=False, cu_seqlens=None, *, ssm_state_indices=None, num_accepted_tokens=None,
                        inplace_final_state=False, **kwargs):
    """fla's ``fused_recurrent_kda`` computed by flash_kda's decode (forward only, no autograd).

    The token-by-token form, for decode steps of a few tokens per sequence (any
    number works). Returns ``(o, final_state)``: ``o`` like v; ``final_state`` fp32
    ``[N, HV, K, V]`` (``[N, HV, V, K]`` with state_v_first), or None without
    ``output_final_state``; ``initial_state`` is left as it was. The arguments are
    fla's, for what flash_kda computes (the module docstring): the q/k L2 norm inside
    (``use_qk_l2norm_in_kernel=True``); g the log decay (``use_gate_in_kernel=False``,
    fla's default; A_log, dt_bias and lower_bound not read) or the raw gate of the safe
    gate (``use_gate_in_kernel=True`` with ``lower_bound`` in [-5, 0); without it fla's
    softplus gate, formed in torch; as in fla's gate, a missing ``A_log`` is 0 and a
    missing ``dt_bias`` 0); beta b itself (``use_beta_sigmoid_in_kernel=False``, fla's default)
    or its logit. Anything else raises NotImplementedError naming the argument.

    The serving form of fla's ``fused_recurrent_kda_fwd`` (extensions):
    ``ssm_state_indices`` (int32/int64 ``[N]``, or ``[N, 1 + S]`` for speculative
    verify with ``num_accepted_tokens [N]``) picks each sequence's slot of
    ``initial_state``, an engine's pool ``[P, HV, V, K]`` (requires
    ``state_v_first=True`` and ``inplace_final_state=True``): the final states, and
    with verify the state after each token, go to the slots in place, as
    :func:`flash_kda.decode` writes them; ``final_state`` is the pool itself.
    """
    state_v_first = _state_v_first(state_v_first, kwargs)
    if kwargs:
        raise TypeError(f"fused_recurrent_kda: unexpected arguments {sorted(kwargs)}")
    forms, softplus = _forms("fused_recurrent_kda", use_qk_l2norm_in_kernel, use_gate_in_kernel,
                             use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound)
    if not forms["use_gate_in_kernel"]:
        lower_bound = None  # not read with the log decay, as in fla
    B, T, H, K, HV, V = _fla_shapes(q, v)
    if softplus:
        g = _softplus_log_decay(g, A_log, dt_bias, HV, K)
    _check_boundaries("cu_seqlens", cu_seqlens)
    if cu_seqlens is not None and B != 1:
        raise ValueError(f"q: expected batch size 1 with cu_seqlens (flattened sequences), got {B}")
    N = len(cu_seqlens) - 1 if cu_seqlens is not None else B
    if cu_seqlens is None and T == 0 and B > 0:
        # No tokens: each batch row a sequence of none, whose state comes back as it
        # went in (fla's loop of no steps). The decode's [N, t] form needs t >= 1.
        cu_seqlens = torch.zeros(B + 1, dtype=torch.int32, device=q.device)
    A_log, dt_bias = _gate_parameters(A_log, dt_bias, q, HV, K, forms)
    # Zeros, as fla's: a padding entry's rows (a negative slot) are not written.
    out = torch.zeros(v.shape, dtype=v.dtype, device=v.device)
    common = dict(out=out, scale=scale, lower_bound=lower_bound, cu_seqlens=cu_seqlens, **forms)

    if ssm_state_indices is not None:
        if initial_state is None:
            raise ValueError("initial_state: required with ssm_state_indices (the state pool [P, HV, V, K])")
        if not state_v_first:
            raise NotImplementedError("fused_recurrent_kda: a state pool (ssm_state_indices) needs state_v_first=True "
                                      "([P, HV, V, K] slots, flash_kda's layout)")
        if not inplace_final_state:
            raise NotImplementedError("fused_recurrent_kda: a state pool (ssm_state_indices) needs "
                                      "inplace_final_state=True (the final states go back to their slots)")
        if not isinstance(ssm_state_indices, torch.Tensor) or ssm_state_indices.ndim not in (1, 2):
            raise ValueError("ssm_state_indices: expected a tensor [N] or [N, 1 + draft tokens], got "
                             f"{getattr(ssm_state_indices, 'shape', type(ssm_state_indices).__name__)}")
        # fla: without cu_seqlens every batch row is one sequence.
        if cu_seqlens is None and ssm_state_indices.shape[0] != B:
            raise ValueError(f"ssm_state_indices: expected one row per batch row of q (B={B}) without cu_seqlens, "
                             f"got {ssm_state_indices.shape[0]}")
        _call_named(decode, _SERVING_NAMES, q, k, v, g, beta, A_log, dt_bias, initial_state, ssm_state_indices,
                    num_accepted_tokens=num_accepted_tokens, **common)
        return out, initial_state
    if num_accepted_tokens is not None:
        raise ValueError("num_accepted_tokens: given without ssm_state_indices (speculative verify on pool slots)")
    if inplace_final_state:
        raise NotImplementedError("fused_recurrent_kda: inplace_final_state=True needs ssm_state_indices "
                                  "(the slots the final states go back to)")

    # Dense states: sequence n starts from initial_state[n] (zero without one). The
    # decode runs on a pool of N slots, fp32 where a final state is returned (fla's
    # dtype; bf16 and fp16 states widen exactly) or the state is neither fp32 nor
    # bf16. initial_state is only read: where the pool shares its memory (no copy was
    # needed) the final states go to a pool of their own.
    if N == 0:  # B = 0 (cu_seqlens has N >= 1): a pool of no slots is no pool
        raise ValueError(f"q: expected at least one sequence (B >= 1), got shape {list(q.shape)}")
    if initial_state is not None:
        want = (N, HV, V, K) if state_v_first else (N, HV, K, V)
        if not isinstance(initial_state, torch.Tensor) or tuple(initial_state.shape) != want:
            raise ValueError(f"initial_state: expected a tensor {list(want)} ([N, HV, {'V, K' if state_v_first else 'K, V'}]"
                             f", N = {N} sequences), got "
                             f"{list(initial_state.shape) if isinstance(initial_state, torch.Tensor) else type(initial_state).__name__}")
        _check_state_dtype(initial_state)
        pool = initial_state if state_v_first else initial_state.transpose(-1, -2)
        if pool.dtype not in (torch.float32, torch.bfloat16) or (output_final_state and pool.dtype != torch.float32):
            pool = pool.float()
        pool = pool.contiguous()
        shared = pool.untyped_storage().data_ptr() == initial_state.untyped_storage().data_ptr()
    else:
        pool = torch.zeros(N, HV, V, K, dtype=torch.float32, device=q.device)
        shared = False
    slots = torch.arange(N, dtype=torch.int32, device=q.device)
    final = torch.empty_like(pool) if shared else None
    decode(q, k, v, g, beta, A_log, dt_bias, pool, slots, state_out_pool=final, **common)
    if not output_final_state:
        return out, None
    final_state = final if shared else pool
    if not state_v_first:
        final_state = final_state.transpose(-1, -2).contiguous()
    return out, final_state
