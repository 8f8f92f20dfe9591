"""flash_kda: Kimi Delta Attention (KDA) forward and decode.

A drop-in for the FlashKDA Python API that fla's ``chunk_kda`` dispatches to
(``fla/ops/kda/backends/flash_kda.py``): under ``torch.inference_mode()`` fla calls
``flash_kda.fwd(q, k, v, g, beta, scale, out, A_log=..., dt_bias=..., lower_bound=...,
initial_state=..., final_state=..., cu_seqlens=...)`` and reads ``out`` and
``final_state``, which are filled in place.

CUDA tensors run the sm_90a kernels on the current torch stream; CPU tensors run
the multithreaded chunked fp32 CPU backend (``backend="reference"``: the float64
one; ``decode``: float64). The extension links no torch: torch
tensors are read through their own attributes (data pointer, shape, strides,
dtype, device), any other array (CuPy, NumPy, ...) through DLPack. torch is used
when installed (for those reads, the workspace allocation and the custom ops);
``segment_summaries`` and ``compose_summaries`` need it (they allocate their
results with torch).

    fwd(...)           FlashKDA-compatible, in place, returns None
    decode(...)        one decode step on states in an engine's pool, in place on
                       the pool; returns out
    kda_forward(...)   functional form -> (out, final_state); a torch.library custom
                       op (torch.compile / CUDA-graph friendly)
    kda_prefill(...)   the forward on a state pool (checkpoints too) as a torch.library
                       custom op -> out (the pool and checkpoints updated in place,
                       declared as mutated: torch.compile friendly)
    kda_decode(...)    decode as a torch.library custom op -> out (the pool updated in
                       place, declared as mutated: torch.compile friendly)
    check_device_faults()  raises ValueError if a kernel met invalid device-resident
                       cu_seqlens / state_indices / slot checkpoint /
                       num_accepted_tokens values (see its docstring)
    chunk_kda(...), fused_recurrent_kda(...)
                       fla's chunk_kda and fused_recurrent_kda arguments and outputs (one
                       import to switch)
    segment_summaries(...), compose_summaries(...)
                       a run of tokens as an affine map of the state (M, B), and
                       their composition: the pieces of context parallelism
    workspace_size(...), cuda_available(), cuda_status()
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import operator
import sys

from ._loader import load_extension

_C = load_extension()

if "torch" in sys.modules or importlib.util.find_spec("torch") is not None:
    import torch as _torch

    # torch.Tensor / nn.Parameter arguments are then read through their attributes
    # rather than exported through DLPack (a few attribute reads instead of
    # microseconds per tensor).
    _C.register_torch(_torch)
    # The current stream as a plain int, without building a torch.cuda.Stream
    # object on every call (the private getter Triton and Inductor use; the public
    # spelling where a torch lacks it).
    _current_raw_stream = getattr(_torch._C, "_cuda_getCurrentRawStream", None) or (
        lambda index: _torch.cuda.current_stream(index).cuda_stream)
else:  # pragma: no cover - exercised only without torch
    _torch = None

__version__ = "0.1.0"
__all__ = ["fwd", "decode", "kda_forward", "kda_prefill", "kda_decode", "workspace_size", "check_device_faults",
           "cuda_available", "cuda_status", "compiled_with_cuda", "segment_summaries", "compose_summaries", "chunk_kda",
           "fused_recurrent_kda"]

#: Used when ``lower_bound=None`` is passed (fla passes its own value through,
#: which may be None): the FlashKDA/fla safe-gate default and the widest bound
#: the chunked algorithm accepts.
DEFAULT_LOWER_BOUND = -5.0

compiled_with_cuda: bool = bool(_C.compiled_with_cuda)


def cuda_available() -> bool:
    """Whether CUDA tensors can run here: kernels compiled in and an sm_90 device present."""
    return bool(_C.cuda_available())


def cuda_status() -> tuple[bool, str]:
    """``(available, reason)`` for the CUDA backend."""
    ok, why = _C.cuda_status()
    return bool(ok), str(why)


_DLPACK_TORCH_DEVICES = {1: "cpu", 2: "cuda", 3: "cpu"}  # kDLCPU, kDLCUDA, kDLCUDAHost (pinned host memory)


def _allocation_device(name, x):
    """The torch device to allocate outputs on beside x: a torch tensor's own, or a
    DLPack array's (CPU, pinned host or CUDA memory); anything else is named."""
    if _is_torch(x):
        return x.device
    dev = getattr(x, "__dlpack_device__", None)
    kind, index = dev() if callable(dev) else (None, 0)
    if kind not in _DLPACK_TORCH_DEVICES:
        raise TypeError(f"{name}: expected a torch tensor or a DLPack array in CPU or CUDA memory "
                        f"(outputs are allocated on its device), got {type(x).__name__}"
                        + (f" on DLPack device type {kind}" if kind is not None else ""))
    where = _DLPACK_TORCH_DEVICES[kind]
    return _torch.device(where, index) if where == "cuda" else _torch.device(where)


def _is_torch(x) -> bool:
    return _torch is not None and isinstance(x, _torch.Tensor)


def _check_boundaries(name, x):
    """None, or a torch tensor [N+1] with N >= 1: the torch-only entry points (fla's
    calls, the ops) read N from it, or size outputs by it, before fwd or decode sees it."""
    if x is not None and (not _is_torch(x) or x.ndim != 1 or x.shape[0] < 2):
        raise (ValueError if _is_torch(x) else TypeError)(
            f"{name}: expected a 1-d tensor [N+1] with N >= 1, got "
            f"{list(x.shape) if _is_torch(x) else type(x).__name__}")


# Device index -> callable(nbytes) returning uint8 scratch memory on that device.
_cuda_allocators: dict = {}


def _cuda_allocator(index: int):
    alloc = _cuda_allocators.get(index)
    if alloc is None:
        # torch's caching allocator: stream-ordered on the current stream, and served
        # from the graph's private pool while capturing a CUDA graph.
        alloc = functools.partial(_torch.empty, dtype=_torch.uint8, device=_torch.device("cuda", index))
        _cuda_allocators[index] = alloc
    return alloc


def _allocator_for_stream(index: int, stream: int):
    # torch's allocator may hand a freed block to the next allocation on the stream it
    # was allocated on (torch's current one) at once. When the kernels run on another
    # stream, that stream is recorded on the block, so that it is reused only after
    # the work queued there has finished.
    base = _cuda_allocator(index)
    recorded = _torch.cuda.ExternalStream(stream, device=_torch.device("cuda", index))

    def alloc(n: int):
        ws = base(n)
        ws.record_stream(recorded)
        return ws

    return alloc


def _type_name(x) -> str:
    """x's type for a message: qualified outside the builtins, so that numpy.bool
    does not read as the bool it was refused for."""
    t = type(x)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _stream_value(stream):
    """``stream=`` checked on every device, as an int or None: a value a CUDA call
    would refuse is refused on CPU tensors too (where the stream is not used)."""
    if stream is None:
        return None
    if isinstance(stream, bool):
        raise TypeError(f"stream: expected a cudaStream_t as an int, or None, got bool {stream!r}")
    try:
        value = operator.index(stream)
    except TypeError:
        raise TypeError(f"stream: expected a cudaStream_t as an int (e.g. torch.cuda.current_stream().cuda_stream), "
                        f"or None, got {_type_name(stream)}") from None
    if not 0 <= value < 2 ** 64:
        raise ValueError(f"stream: expected a cudaStream_t, an int in [0, 2**64), got {value}")
    return value


def _runtime(q, stream, need_alloc=True):
    """(alloc, stream) for q's framework and device."""
    stream = _stream_value(stream)
    if _is_torch(q):
        if not q.is_cuda:
            return None, 0
        index = q.get_device()
        current = _current_raw_stream(index)
        if stream is None or int(stream) == current:
            return (_cuda_allocator(index) if need_alloc else None), current
        stream = int(stream)
        return (_allocator_for_stream(index, stream) if need_alloc else None), stream
    if type(q).__module__.startswith("cupy"):
        import cupy

        def alloc(n: int):
            return cupy.empty(n, dtype=cupy.uint8)

        if stream is None:
            stream = cupy.cuda.get_current_stream().ptr
        return alloc, int(stream)
    return None, int(stream or 0)


_SAME_STREAM = contextlib.nullcontext()


def _on_stream(q, stream):
    """Where a call's own allocations and copies (a dense copy of the indices or of
    token views, a zero-filled out) go: on the kernels' stream. torch queues them on
    its current stream; when `stream` names another, nothing would order them before
    the kernel, and torch could hand their memory to the next allocation while the
    kernel still reads it. Inside this context both follow `stream`."""
    stream = _stream_value(stream)
    if stream is None or not _is_torch(q) or not q.is_cuda:
        return _SAME_STREAM
    if stream == _current_raw_stream(q.get_device()):
        return _SAME_STREAM
    return _torch.cuda.stream(_torch.cuda.ExternalStream(stream, device=q.device))


def _dense_indices(x):
    """Slot indices as the kernels read them: dense. An engine's slot column is often a
    strided view (a block table's first column, fla reads it through its strides): a
    copy of N (or N·(1 + S)) integers, on the stream, capturable in a CUDA graph. ~0.1 µs
    of host time a call where x is dense already."""
    if _torch is not None and isinstance(x, _torch.Tensor) and not x.is_contiguous():
        return x.contiguous()
    return x


def _not_a_number(x) -> bool:
    """What float() takes that is no scale or bound: a string, which it parses ('0.1'),
    and a bool (Python's, NumPy's, a torch bool tensor), which it reads as 0 or 1."""
    if isinstance(x, (str, bytes, bytearray, bool)):
        return True
    dtype = getattr(x, "dtype", None)
    return dtype is not None and (getattr(dtype, "kind", None) in ("b", "U", "S") or str(dtype) == "torch.bool")


def _resolve_scalars(q, scale, lower_bound):
    # On every call's path: the common case is two float() calls; the errors are
    # worked out only when one fails.
    if scale is None:
        try:
            scale = q.shape[-1] ** -0.5
        except (AttributeError, IndexError, TypeError, ZeroDivisionError):
            # No last dimension to read K from (not a tensor, wrong rank, K = 0): any
            # value will do, the extension names q before it looks at scale.
            scale = 1.0
    if lower_bound is None:
        lower_bound = DEFAULT_LOWER_BOUND
    if type(scale) is not float or type(lower_bound) is not float:
        for name, x in (("scale", scale), ("lower_bound", lower_bound)):
            if _not_a_number(x):
                raise TypeError(f"{name}: expected a float (or None for the default), got {x!r}")
    try:
        return float(scale), float(lower_bound)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int past the float range
        for name, x in (("scale", scale), ("lower_bound", lower_bound)):
            try:
                float(x)
            except (TypeError, ValueError, OverflowError) as e:
                raise TypeError(f"{name}: expected a float (or None for the default), got {x!r}") from e
        raise


# The extension's scalar and string parameters, which nanobind converts before any
# check runs: a value of another type gets nanobind's "incompatible function
# arguments" with the whole signature. _raise_named names the argument instead.
_PARAMETER_TYPES = (("backend", str), ("checkpoint_interval", int), ("checkpoints_value_major", bool),
                    ("resume_from_summaries", bool), ("states_key_major", bool), ("use_gate_in_kernel", bool),
                    ("use_beta_sigmoid_in_kernel", bool))


def _raise_named(err, **given):
    """Raises the TypeError (or ValueError) naming the first of `given` that nanobind
    could not convert, for its generic `err`; else `err` itself."""
    if "incompatible function arguments" in str(err):
        for name, want in _PARAMETER_TYPES:
            if name not in given:
                continue
            x = given[name]
            if not isinstance(x, want) or (want is int and isinstance(x, bool)):
                raise TypeError(f"{name}: expected {want.__name__}, got {_type_name(x)} {x!r}") from None
            if want is int and not -2 ** 63 <= x < 2 ** 63:
                raise ValueError(f"{name}: expected a value that fits int64, got {x}") from None
    raise err


def _widened(x):
    """A torch bf16 or fp16 gate parameter (A_log, dt_bias) as fp32, exactly; else x."""
    if _torch is not None and isinstance(x, _torch.Tensor) and x.dtype in (_torch.bfloat16, _torch.float16):
        return x.float()
    return x


def _refuse_bool_interval(checkpoint_interval):
    """nanobind converts a bool to the binding's int64: True would read as an interval of 1."""
    if checkpoint_interval is True or checkpoint_interval is False:
        raise TypeError(f"checkpoint_interval: expected int, got bool {checkpoint_interval!r}")


def _pdl_mode(pdl) -> int:
    """pdl= as the binding's pdl_mode (flashkda::PdlMode: 0 auto, 1 on, -1 off)."""
    # Only None and real bools: an int would be ambiguous (the C ABI's 0 is auto,
    # Python's 0 == False would be off). Identity tests: this is on every step's path.
    if pdl is None:
        return 0
    if pdl is True:
        return 1
    if pdl is False:
        return -1
    raise TypeError(f"pdl: expected None (auto), True (on) or False (off), got {pdl!r}")


def fwd(q, k, v, g, beta, scale, out, A_log=None, dt_bias=None, lower_bound=None,
        initial_state=None, final_state=None, cu_seqlens=None, *,
        cu_seqlens_host=None, state_pool=None, state_indices=None, has_initial_state=None,
        checkpoints=None, checkpoint_interval=64, checkpoints_value_major=False,
        slot_checkpoint_offsets=None, slot_checkpoint_slots=None,
        summaries=None, resume_from_summaries=False, states_key_major=False,
        use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
        workspace=None, stream=None, backend="auto") -> None:
    """KDA forward into ``out`` (and ``final_state``), in place. FlashKDA's signature.

    Args (B batch, T tokens, H q/k heads, HV value heads = a multiple of H, K/V head dims,
    N sequences = ``len(cu_seqlens) - 1`` or B):
        q, k: bf16 ``[B, T, H, K]``.  v: bf16 ``[B, T, HV, V]``.
        g: bf16 ``[B, T, HV, K]``, raw gate (or the log decay: ``use_gate_in_kernel``).
        beta: bf16 or fp32 ``[B, T, HV]``, raw logit (or b itself: ``use_beta_sigmoid_in_kernel``).
        scale: float, or None for ``K ** -0.5``.
        out: bf16 ``[B, T, HV, V]``, written in place.
        A_log: fp32 ``[HV]``.  dt_bias: fp32 ``[HV, K]`` (torch bf16 or fp16 ones, from a
            model cast to half precision, are widened exactly: fla's dispatch passes them
            as the model holds them). Not read with ``use_gate_in_kernel=False`` (may be None).
        lower_bound: float in ``[-5, 0)``, or None for -5.0 (not read with ``use_gate_in_kernel=False``).
        initial_state: bf16/fp32 ``[N, HV, V, K]`` or None (zeros).
        final_state: bf16/fp32 ``[N, HV, V, K]`` written in place, or None; same dtype
            as initial_state when both are given. It may be ``initial_state`` itself
            (an in-place state update: bitwise the call with a separate final state).
        cu_seqlens: int64 or int32 (vLLM's offsets) ``[N+1]`` on the tensors' device
            (requires B == 1), or None.
    What g and beta hold (fla's flags of the same names; the defaults are FlashKDA's):
      ``use_gate_in_kernel=True``: g is the raw gate, activated inside as
        ``a = lower_bound * sigmoid(exp(A_log) * (g + dt_bias))``. ``False``: g is ``a``
        itself, bf16 or fp32, the natural log of each key channel's decay (``<= 0``; e.g. fla's
        ``fused_kda_gate``, ``-exp(A_log) * softplus(g + dt_bias)``, as vLLM's Kimi Linear layer
        passes it), any strength; A_log, dt_bias and lower_bound are then not read. A value above 0
        is a ValueError naming g on the CPU; CUDA reads it as 0 and records it for
        :func:`check_device_faults`.
      ``use_beta_sigmoid_in_kernel=True``: beta is the logit, ``b = sigmoid(beta)``. ``False``:
        ``b = beta`` as given (e.g. ``sigmoid(b.float())`` computed outside).
    Keyword-only extensions: ``cu_seqlens_host`` (an int64 CPU copy of cu_seqlens: validated, and
    with CPU tensors equal to cu_seqlens; never made implicitly, as a device-to-host copy would
    synchronise; with it the host plans how a
    long sequence among short ones is split, without it the device does); ``state_pool`` (bf16/fp32
    ``[P, HV, V, K]``, any stride between slots) with ``state_indices`` (int32/int64 ``[N]``) and
    optionally ``has_initial_state`` (bool/uint8 ``[N]``): sequence n starts from slot
    ``state_indices[n]`` (from zero when the index is negative or its flag is false) and its final
    state is written back to that slot in place (none for a negative index), instead of
    initial_state / final_state; ``states_key_major=True``: initial_state and final_state are
    ``[N, HV, K, V]`` (fla's layout of chunk_kda's states) instead of ``[N, HV, V, K]``, read
    and written as they are (no transposed copies; not with state_pool);
    ``checkpoints`` (bf16/fp32 ``[..., HV, K, V]``, or ``[..., HV, V, K]`` with
    ``checkpoints_value_major=True``; the leading dims hold at least sum(ceil(L_n / c))
    entries) receives each sequence's state after 0, c, 2c, ... tokens, c =
    ``checkpoint_interval`` (a multiple of 16; 64 gives the layout of fla's
    ``return_intermediate_states``): sequence n's entries follow those of the sequences
    before it; ``slot_checkpoint_offsets`` (int64 ``[N, 2]``, multiples of 16 within each
    sequence, negative = none) with ``slot_checkpoint_slots`` (``[N, 2]``, the dtype of
    state_indices) write the state after those many tokens into those pool slots (vLLM's
    "align" prefix caching; needs state_pool);
    ``workspace`` (uint8 scratch; default: allocated per call from
    torch's caching allocator), ``stream`` (cudaStream_t as int; default: torch's current
    stream; the workspace and a dense copy of a strided state_indices follow it),
    ``backend`` ('auto', 'cuda', 'cpu', 'reference').

    A forward in two calls around an exchange of summaries (``summaries=``,
    ``resume_from_summaries=``): what :func:`flash_kda.distributed.cp_fwd` makes for context
    parallelism, where a piece's incoming state depends on the pieces before it, on other
    devices.
      1. The summaries call, ``summaries=(M, B)``: contiguous fp32 tensors ``[N, HV, K, K]``
         and ``[N, HV, V, K]`` on the call's device receive each whole sequence's summary as
         :func:`segment_summaries` defines it (``S_out = S_in @ M + B``). Nothing else is
         written: ``out`` may be None; initial_state / final_state must be None.
      2. The resume call, ``resume_from_summaries=True``: the ordinary forward (``out``, and
         ``final_state`` from ``initial_state``, the incoming states composed from the
         exchanged summaries). It must get the same token tensors, A_log, dt_bias, scale,
         lower_bound, gate and beta forms and cu_seqlens on the same device, and the same
         ``workspace`` tensor, untouched since the summaries call: on CUDA it runs only the
         part that depends on the initial states, from what the summaries call left there. Both calls therefore take an
         explicit ``workspace`` (``workspace_size(..., summaries=(M, B))`` bytes, + 255
         unless 256-byte aligned; none on the CPU, whose backends run the whole forward).
    One resume call per summaries call; neither call with state_pool or checkpoints.

    Raises TypeError (wrong dtype / not a tensor) or ValueError (shape, device, strides,
    invalid values) naming the argument; NotImplementedError for valid input the backend
    cannot run (e.g. K = V other than 64 or 128 on CUDA); RuntimeError for CUDA errors.
    """
    scale, lower_bound = _resolve_scalars(q, scale, lower_bound)
    _refuse_bool_interval(checkpoint_interval)
    A_log, dt_bias = _widened(A_log), _widened(dt_bias)
    alloc, stream = _runtime(q, stream)
    if state_indices is not None:
        with _on_stream(q, stream):
            state_indices = _dense_indices(state_indices)
    # Positional: the cheapest call into the extension (this is on every step's path).
    try:
        _C.fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
               cu_seqlens_host, state_pool, state_indices, has_initial_state, checkpoints, checkpoint_interval,
               checkpoints_value_major, slot_checkpoint_offsets, slot_checkpoint_slots, summaries,
               resume_from_summaries, workspace, alloc, stream, backend, states_key_major, use_gate_in_kernel,
               use_beta_sigmoid_in_kernel)
    except TypeError as e:
        _raise_named(e, backend=backend, checkpoint_interval=checkpoint_interval,
                     checkpoints_value_major=checkpoints_value_major, resume_from_summaries=resume_from_summaries,
                     states_key_major=states_key_major, use_gate_in_kernel=use_gate_in_kernel,
                     use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel)


def workspace_size(q, k, v, g, beta, scale, out, A_log=None, dt_bias=None, lower_bound=None,
                   initial_state=None, final_state=None, cu_seqlens=None, *,
                   cu_seqlens_host=None, state_pool=None, state_indices=None, has_initial_state=None,
                   checkpoints=None, checkpoint_interval=64, checkpoints_value_major=False,
                   slot_checkpoint_offsets=None, slot_checkpoint_slots=None, summaries=None,
                   resume_from_summaries=False, states_key_major=False, use_gate_in_kernel=True,
                   use_beta_sigmoid_in_kernel=True, backend="auto") -> int:
    """Bytes of scratch memory ``fwd`` needs for these arguments (checked as fwd checks them).

    A caller-provided ``workspace`` needs ``workspace_size(...) + 255`` bytes unless its
    pointer is 256-byte aligned. With ``summaries=(M, B)`` (``out`` may be None): the bytes of
    the summaries call, whose workspace then serves its resume call too.
    """
    scale, lower_bound = _resolve_scalars(q, scale, lower_bound)
    _refuse_bool_interval(checkpoint_interval)
    A_log, dt_bias = _widened(A_log), _widened(dt_bias)
    try:
        return int(_C.workspace_size(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state,
                                     final_state, cu_seqlens, cu_seqlens_host, state_pool, state_indices,
                                     has_initial_state, checkpoints, checkpoint_interval, checkpoints_value_major,
                                     slot_checkpoint_offsets, slot_checkpoint_slots, summaries,
                                     resume_from_summaries, backend, states_key_major, use_gate_in_kernel,
                                     use_beta_sigmoid_in_kernel))
    except TypeError as e:
        _raise_named(e, backend=backend, checkpoint_interval=checkpoint_interval,
                     checkpoints_value_major=checkpoints_value_major, resume_from_summaries=resume_from_summaries,
                     states_key_major=states_key_major, use_gate_in_kernel=use_gate_in_kernel,
                     use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel)


# CUDA decode reads strided token views with its latency kernel at every size (the
# bandwidth kernels take dense rows only). At K = 128 from this many (sequence, value
# head) pairs, copying the views dense and running the bandwidth kernel is faster
# (H200, 32 heads, a step with the copies in the graph: N = 64, bf16 pool, 58.1 us
# strided against 47.4 copied; N = 256, fp32 pool, 309 against 296; at N = 8 the
# copies lose, 12.4 against 7.8). At K = 64 the strided step is within 7 % of the
# dense one at every N measured, and ahead of the copies.
_DECODE_COPY_VIEWS_FROM_PAIRS = 2048


def _readable_view(t):
    # The views the binding takes (and so those a copy may stand for): no broadcast
    # dimension, the last one contiguous, and a rank-4 [N, t, ...] tensor whose two
    # leading dimensions flatten to tokens.
    st = t.stride()
    if 0 in st or st[-1] != 1:
        return False
    return t.ndim != 4 or st[0] == t.shape[1] * st[1]


def _decode_token_inputs(q, k, v, g, beta, state_indices):
    """q, k, v, g, beta as decode reads them: strided CUDA views copied dense where
    that is faster (see _DECODE_COPY_VIEWS_FROM_PAIRS); anything the binding would
    refuse (a broadcast view, a wrong type) is passed on for it to name."""
    tensors = (q, k, v, g, beta)
    try:  # the common call, dense torch tensors, returns here
        if q.is_contiguous() and k.is_contiguous() and v.is_contiguous() and g.is_contiguous() and beta.is_contiguous():
            return tensors
    except (AttributeError, TypeError):  # not torch tensors
        return tensors
    if not all(_is_torch(t) for t in tensors) or not q.is_cuda or q.shape[-1] != 128 or v.ndim < 3:
        return tensors
    if not all(_readable_view(t) for t in tensors) or not _is_torch(state_indices) or state_indices.ndim < 1:
        return tensors
    if state_indices.shape[0] * v.shape[-2] < _DECODE_COPY_VIEWS_FROM_PAIRS:
        return tensors
    return tuple(t.contiguous() for t in tensors)


def decode(q, k, v, g, beta, A_log, dt_bias, state_pool, state_indices, *, out=None, scale=None,
           lower_bound=None, cu_seqlens=None, state_out_pool=None, per_token_states=None,
           cu_seqlens_host=None, stream=None, pdl=None, num_accepted_tokens=None, use_gate_in_kernel=True,
           use_beta_sigmoid_in_kernel=True):
    """One KDA decode step: a few new tokens per running sequence, states in a pool.

    Sequence n's tokens run the recurrence (the same math as :func:`fwd`) starting from
    slot ``state_indices[n]`` of ``state_pool``; its final state is written back to that
    slot in place (or to the same slot of ``state_out_pool``, leaving ``state_pool``
    untouched). A negative index is a padding entry: its ``out`` rows, its slot and its
    ``per_token_states`` rows are neither read nor written.

    Args (T tokens in all, N = ``len(state_indices)`` sequences, P pool slots):
        q, k: bf16 ``[T, H, K]``, or ``[N, t, H, K]`` (read as the flattened ``[N*t, H, K]``;
            every token tensor then has the same two leading dims; without cu_seqlens the
            first is N, one row a sequence).
        v: bf16 ``[T, HV, V]``.  g: bf16 ``[T, HV, K]`` (or the log decay, bf16 or fp32).
            beta: bf16 or fp32 ``[T, HV]``.
            q, k, v, g, beta may be strided views (last dimension contiguous, e.g. of one
            fused projection); on CUDA at K = 128 from 2,048 (sequence, value head) pairs
            they are copied dense first, where that is faster than reading them strided.
        A_log: fp32 ``[HV]``.  dt_bias: fp32 ``[HV, K]`` (both may be None with
            ``use_gate_in_kernel=False``).
        state_pool: fp32 or bf16 ``[P, HV, V, K]``; each slot dense, any stride >= HV*V*K
            elements between slots (e.g. a slice of a bigger buffer). Updated in place.
        state_indices: int32 or int64 ``[N]``, each < P (negative: padding); a strided view
            (a block table's column) is taken dense.
        out: bf16 ``[T, HV, V]`` written in place, or None to allocate one (torch only;
            zero-filled, so a padding entry's rows read 0).
        scale: float, or None for ``K ** -0.5``.  lower_bound: float in ``[-5, 0)``, or None for -5.0.
        cu_seqlens: int64 or int32 (vLLM's offsets) ``[N+1]`` token offsets of the
            sequences, or None: then every sequence has T / N tokens (T must be a multiple of N).
            A sequence may have no tokens: its state stays as it is (copied to
            state_out_pool when given; with speculative verify nothing is written).
        state_out_pool: like state_pool (same shape and dtype, own slot stride), or None.
        per_token_states: ``[T, HV, V, K]`` in the state dtype, or None: also the state
            after every token (speculative verify).
        cu_seqlens_host: optional int64 CPU copy of cu_seqlens (validated; on CPU tensors it
            must equal cu_seqlens).
        Speculative verify on pool slots (fla's serving-form fused_recurrent_kda):
            state_indices ``[N, 1 + S]`` (S >= 1, or S = 0 with num_accepted_tokens) and optionally
            num_accepted_tokens ``[N]`` (the dtype of state_indices, values in [1, 1 + S]): sequence n starts from slot
            ``state_indices[n, num_accepted_tokens[n] - 1]`` (column 0 without it) and the
            state after its token t goes to slot ``state_indices[n, t]``.
        stream: cudaStream_t as int; default torch's current stream on q's device. The
            call's own allocations and copies (a zero-filled out, the dense copies of a
            strided state_indices or of token views) go on it too.
        pdl: programmatic dependent launch of the CUDA kernel: it may then be scheduled
            while the previous kernel on the stream still runs (it waits for that kernel
            before touching memory), hiding part of the launch latency between
            back-to-back steps. None (default, auto): the measured choice, currently
            PDL at every size. True: always; False: never. Anything else is a
            TypeError. Ignored on the CPU.
        use_gate_in_kernel, use_beta_sigmoid_in_kernel: what g and beta hold, as for :func:`fwd`
            (False: the log decay; b itself).

    Returns ``out``. CPU tensors run the float64 CPU decode; CUDA tensors the sm_90a
    kernels (K = V = 128 or 64), asynchronously, capturable in a CUDA graph. Errors as for
    :func:`fwd`: TypeError / ValueError naming the argument, NotImplementedError for what
    the backend cannot run, RuntimeError for CUDA errors.
    """
    pdl_mode = _pdl_mode(pdl)  # before allocating anything
    if out is None:
        if not _is_torch(v):
            if v is None or not hasattr(v, "__dlpack__"):
                raise TypeError(f"v: expected a tensor, got {type(v).__name__}")
            raise TypeError("out: pass an output array (bf16, the shape of v) for non-torch inputs; "
                            "only torch tensors are allocated automatically")
    scale, lower_bound = _resolve_scalars(q, scale, lower_bound)
    with _on_stream(q, stream):
        if out is None:
            # Zeros: a padding entry's rows are not written, and must not read as garbage.
            out = _torch.zeros(v.shape, dtype=v.dtype, device=v.device)
        state_indices = _dense_indices(state_indices)
        q, k, v, g, beta = _decode_token_inputs(q, k, v, g, beta, state_indices)
    _, stream = _runtime(q, stream, need_alloc=False)
    try:
        _C.decode(q, k, v, g, beta, A_log, dt_bias, out, state_pool, state_indices, scale, lower_bound, cu_seqlens,
                  cu_seqlens_host, state_out_pool, per_token_states, num_accepted_tokens, stream, pdl_mode,
                  use_gate_in_kernel, use_beta_sigmoid_in_kernel)
    except TypeError as e:
        _raise_named(e, use_gate_in_kernel=use_gate_in_kernel, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel)
    return out


def segment_summaries(q, k, v, g, beta, A_log, dt_bias, segments, *, lower_bound=None, cu_seqlens=None,
                      use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, backend="auto"):
    """Affine summaries of token ranges: ``(M, B)`` with ``S_out = S_in @ M + B``.

    For one (sequence, value head), the tokens ``[begin, end)`` map the state they
    start from, ``S_in`` ``[V, K]``, to the state they leave, ``S_in @ M + B``
    (``M`` ``[K, K]``, ``B`` ``[V, K]``: B is the final state from a zero state).
    Summaries of consecutive ranges compose with :func:`compose_summaries`; a range's
    ``fwd`` from the composed incoming state (``initial_state``) gives the same
    outputs and final state as one straight run. The building blocks of splitting a
    long sequence across devices (context parallelism).

    Args: q, k, v, g, beta, A_log, dt_bias, lower_bound, cu_seqlens, use_gate_in_kernel and
    use_beta_sigmoid_in_kernel as for :func:`fwd` (``[B, T, ...]`` with B == 1 for cu_seqlens). ``segments``: int64
    ``[S, 2]`` of ``(begin, end)`` on the flattened ``B*T`` token axis, each inside
    one sequence, in any order (``begin == end``: the identity). ``backend``:
    'auto' / 'cpu' (the chunked fp32 CPU backend) or 'reference' (float64 steps) for
    CPU tensors ('cpu' runs two forwards a range, each padded to whole 16-token
    chunks: for many ranges of a few tokens 'reference' is the faster); CUDA tensors run each range as a forward's summaries call on the GPU
    and return when they are done: ``segments`` (and ``cu_seqlens``) are copied to
    the host first, a synchronisation, so this is not a per-step call (on CUDA the
    summaries of whole sequences come cheaper from ``fwd(..., summaries=(M, B))``).

    Returns fp32 ``M`` ``[S, HV, K, K]`` and ``B`` ``[S, HV, V, K]``, allocated with torch
    (which must be installed).
    """
    _, lower_bound = _resolve_scalars(q, None, lower_bound)
    # M and B are allocated from these shapes: name what cannot give them, and refuse
    # a segments tensor the extension would refuse, before allocating [S, ...].
    for name, x, rank in (("q", q, 4), ("v", v, 4), ("segments", segments, 2)):
        shape = getattr(x, "shape", None)
        if shape is None:
            raise TypeError(f"{name}: expected a tensor, got {type(x).__name__}")
        if len(shape) != rank:
            raise ValueError(f"{name}: expected a {rank}-d tensor, got shape {list(shape)}")
        if any(d < 0 for d in shape):  # only a DLPack producer can claim one
            raise ValueError(f"{name}: expected non-negative dims, got shape {list(shape)}")
    if segments.shape[1] != 2 or (_is_torch(segments) and not segments.is_contiguous()):
        raise ValueError(f"segments: expected a contiguous int64 tensor [S, 2] of (begin, end) token pairs, "
                         f"got shape {list(segments.shape)}"
                         + (f" with strides {list(segments.stride())}" if _is_torch(segments) else ""))
    if isinstance(q, _torch.Tensor) and q.is_cuda:
        # The kernels run on the legacy default stream: inputs written on the
        # current stream must be complete first.
        _torch.cuda.current_stream(q.device).synchronize()
    S, HV, K, V = segments.shape[0], v.shape[2], q.shape[3], v.shape[3]
    device = _allocation_device("q", q)
    try:
        M = _torch.empty((S, HV, K, K), dtype=_torch.float32, device=device)
        B = _torch.empty((S, HV, V, K), dtype=_torch.float32, device=device)
    except RuntimeError as e:  # torch.OutOfMemoryError is one; so is a size past int64
        raise ValueError(f"segments: {S} segments need M [S, HV, K, K] and B [S, HV, V, K] = "
                         f"{S * HV * (K + V) * K * 4} bytes on {device}, more than could be allocated") from e
    A_log, dt_bias = _widened(A_log), _widened(dt_bias)  # half-precision parameters, as fwd takes them
    try:
        _C.segment_summaries(q, k, v, g, beta, A_log, dt_bias, lower_bound, cu_seqlens, segments, M, B, backend,
                             use_gate_in_kernel, use_beta_sigmoid_in_kernel)
    except TypeError as e:
        _raise_named(e, backend=backend, use_gate_in_kernel=use_gate_in_kernel,
                     use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel)
    return M, B


def compose_summaries(M1, B1, M2, B2, *, out=None, stream=None, backend="auto"):
    """``(M1, B1)`` followed by ``(M2, B2)``: ``(M1 @ M2, B1 @ M2 + B2)``, summed in float64.

    fp32 ``M*`` ``[..., K, K]`` and ``B*`` ``[..., V, K]`` with the same leading dims
    (up to 3), all on one device: CPU tensors run on the CPU, CUDA tensors on the GPU
    (K, V <= 128; asynchronous on ``stream``, torch's current stream when None, and
    safe to capture in a CUDA graph). ``out``: a ``(M, B)`` pair to write (M may be M1
    or M2 itself, B may be B1 or B2 itself: in place; any other overlap is a ValueError),
    else new torch tensors (which needs torch).
    Returns ``(M, B)``.
    """
    if out is None:
        for name, x in (("M1", M1), ("B1", B1)):
            if not _is_torch(x):
                raise TypeError(f"{name}: expected a torch.Tensor (or pass out=(M, B)), got {type(x).__name__}")
        out = (_torch.empty_like(M1), _torch.empty_like(B1))
    elif not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError(f"out: expected a pair (M, B), got {type(out).__name__}"
                        + (f" of length {len(out)}" if isinstance(out, (tuple, list)) else ""))
    _, raw_stream = _runtime(M1, stream, need_alloc=False)
    try:
        _C.compose_summaries(M1, B1, M2, B2, out[0], out[1], raw_stream, backend)
    except TypeError as e:
        _raise_named(e, backend=backend)
    return out


def check_device_faults(device=None, stream=None) -> None:
    """Raises ValueError if a CUDA kernel met invalid device-resident argument values.

    ``cu_seqlens`` values (``fwd``, ``decode``), ``state_indices`` (``fwd``'s state pool,
    ``decode``), ``slot_checkpoint_offsets`` / ``slot_checkpoint_slots`` and ``decode``'s
    ``num_accepted_tokens`` live on the GPU, where the host cannot check them without a
    synchronisation. Whatever they hold, no kernel reads or writes outside the tensors it
    was given: sequence bounds are clamped to ``0 <= begin <= end <= T``, indices past the
    pool and offsets or counts out of range are skipped, and the fault is
    recorded on the device (the outputs of that call are then unspecified). This call waits
    for ``stream``, reads and clears that record, and raises ``ValueError`` naming the
    argument, the rule and the first offending sequence when anything was recorded on the
    device since the last check (from any stream). It synchronises: call it after a batch,
    in a debug mode, or where the program synchronises anyway; not during CUDA graph capture.

    Args:
        device: a CUDA device index, ``torch.device`` or tensor (whose device is used); None
            for torch's current device (or the current CUDA device without torch).
        stream: ``cudaStream_t`` as an int; None for torch's current stream on that device.
    Without a usable CUDA device nothing can have been recorded, and it returns at once.
    """
    if isinstance(device, str):
        device = _torch.device(device) if _torch is not None else device
    if device is not None and not isinstance(device, int):
        device = getattr(device, "device", device)  # a tensor's device
        if getattr(device, "type", "cuda") != "cuda":
            raise ValueError(f"device: expected a CUDA device, got {device}")
        device = device.index
    if device is None and _torch is not None and _torch.cuda.is_available():
        device = _torch.cuda.current_device()
    if stream is None:
        stream = _current_raw_stream(device) if device is not None and _torch is not None and _torch.cuda.is_available() else 0
    _C.check_device_faults(-1 if device is None else int(device), int(stream))


def _set_torch_fast_path(enabled: bool) -> bool:
    """Reads torch tensors through their attributes (True, the default) or through
    DLPack like any other array (False). Returns the previous setting. For tests and
    benchmarks: both paths accept the same arguments and raise the same errors."""
    return bool(_C.set_torch_fast_path(bool(enabled)))


if _torch is not None:
    from ._fla_compat import chunk_kda, fused_recurrent_kda  # noqa: E402  (fla's entry points; need fwd, decode)

# The functional form needs torch (a torch.library custom op). Registered at import
# when torch is installed; without torch, kda_forward raises ImportError when called.
if _torch is not None:
    from ._torch_ops import kda_decode, kda_forward, kda_prefill  # noqa: E402
else:  # pragma: no cover - exercised only without torch
    def kda_forward(*args, **kwargs):
        raise ImportError("flash_kda.kda_forward needs torch (>= 2.4); flash_kda.fwd works with any DLPack arrays")

    def kda_decode(*args, **kwargs):
        raise ImportError("flash_kda.kda_decode needs torch (>= 2.4); flash_kda.decode works with any DLPack arrays")

    def kda_prefill(*args, **kwargs):
        raise ImportError("flash_kda.kda_prefill needs torch (>= 2.4); flash_kda.fwd works with any DLPack arrays")
