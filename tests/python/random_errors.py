"""Invalid arguments in random engine-style calls of flash_kda.fwd and flash_kda.decode:
the catalog of mutations and the checks that test_random_errors_cpu.py and
test_random_errors_gpu.py share.

The API's rule for bad input: a clear error, never a crash, a stray write or a
silent wrong answer. An error is TypeError for a wrong dtype (or a value of the
wrong Python type), ValueError for a wrong shape, stride, alignment, device or
value, NotImplementedError for a valid shape the backend does not run (a head
dim), and its message names the argument. Hand-written tests check each rule
once, on one small call; here each seed draws a valid call in an engine's forms
(random_forms.py: fused-projection views, int32 or int64 boundaries, a sliced
state pool with negative indices, checkpoints in either layout, speculative
verify, ...) and breaks it in ONE way drawn from the catalog below, so that the
checks also run against the forms an engine passes and with every other feature
present. A case passes when the call raises the documented exception type, the
message names the broken argument (as a whole identifier, not as part of a
longer name: "cu_seqlens" is not named by "cu_seqlens_host"), and no byte of
any tensor of the call changed: out, final_state, the whole pool buffer (other
slots and padding included), the checkpoint buffer, the block table and the
inputs. On CUDA nothing may be recorded for check_device_faults either: an
error raised on the host launches nothing.

Only what the API documents as an error is drawn. Device-resident values that
CUDA skips and records instead (cu_seqlens, state_indices and
num_accepted_tokens values on the device; the checkpoint capacity without
host-side lengths) are drawn on the CPU only, where the host reads them; on
CUDA the host copy cu_seqlens_host is broken instead. A strided state_indices is
taken dense (documented), so it is no mutation, nor is a strided beta (read
element by element), a bf16 or fp16 A_log / dt_bias for the forward (widened
exactly) or a pool with another number of slots.

A shape that disagrees with one another argument defines may be either side's
fault: the message must name both (e.g. g's expected shape says "HV from v", a
state's "N = len(cu_seqlens) - 1"), and either name satisfies the check.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

import flash_kda
from random_forms import DecodeStep, ForwardCall

# Head dims no backend of the device runs: the CPU backends (and decode on every
# device) take 1 to 256; CUDA's kernels K = V in {64, 128}.
UNSUPPORTED_HEAD_DIMS = {"cpu": (272,), "cuda": (32, 96, 256)}


@dataclass
class Mutation:
    """One way to break a call: `apply` changes its keyword arguments in place (and
    returns any further tensors to watch for writes)."""
    kind: str
    what: str
    apply: Callable[[dict], Optional[list]]
    exc: type
    names: tuple


@dataclass
class Case:
    """A drawn call, broken by one mutation, ready to run."""
    seed: int
    fn: str
    call: Callable
    kwargs: dict
    mutation: Mutation
    watched: list = field(default_factory=list)

    @property
    def label(self):
        return f"seed {self.seed}, {self.fn} {self.mutation.kind}: {self.mutation.what}"


@dataclass
class Ctx:
    """What the catalog's kinds look at: the drawn call, its keyword arguments and the device."""
    fn: str
    seed: int
    call: object
    kw: dict
    device: str

    @property
    def cuda(self):
        return self.device == "cuda"


# ---- building wrong tensors -------------------------------------------------------

def _filled(shape, like):
    """A new tensor of `shape` beside `like`, holding its first values where they fit
    (the values do not matter: the call must refuse the tensor before reading them)."""
    x = torch.zeros(shape, dtype=like.dtype, device=like.device)
    flat, src = x.reshape(-1), like.reshape(-1)
    n = min(flat.numel(), src.numel())
    flat[:n] = src[:n]
    return x


def _strided_last(x):
    """x's values in a view whose last dimension has stride 2."""
    buf = torch.zeros(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype, device=x.device)
    y = buf[..., ::2]
    y.copy_(x)
    return y


def _one_element_in(x):
    """x's values, dense, starting one element into a buffer: off the 16-byte
    alignment CUDA needs for rows, states and pools."""
    buf = torch.zeros(x.numel() + 8, dtype=x.dtype, device=x.device)
    y = buf[1:1 + x.numel()].view(x.shape)
    y.copy_(x)
    return y


def _setter(name, make):
    """An `apply` that replaces argument `name` with make(old value)."""
    def apply(kw):
        kw[name] = make(kw[name])
    return apply


def _is_tensor(x):
    return isinstance(x, torch.Tensor)


def _tensor_args(kw, names):
    return [n for n in names if _is_tensor(kw.get(n))]


# ---- the catalog: one function per kind, each the list of its applicable variants ----

def kind_dtype(ctx):
    """A wrong dtype where the API names the ones it takes (TypeError)."""
    wrong = {"q": (torch.float16, torch.float32), "k": (torch.float16, torch.float32),
             "v": (torch.float16, torch.float32), "out": (torch.float16, torch.float32),
             # g is the raw gate here (use_gate_in_kernel=True): bf16 only.
             "g": (torch.float16, torch.float32), "beta": (torch.float16, torch.float64),
             # bf16 / fp16 parameters are widened by the forward: only a wider or integer dtype is wrong.
             "A_log": (torch.float64, torch.int32), "dt_bias": (torch.float64,)}
    out = []
    for name, dtypes in wrong.items():
        if not _is_tensor(ctx.kw.get(name)):
            continue
        for dt in dtypes:
            out.append(Mutation("dtype", f"{name} as {dt}", _setter(name, lambda x, dt=dt: x.to(dt)), TypeError,
                                (name,)))
    return out


def kind_state_dtype(ctx):
    """States, pools and their companions of a wrong or disagreeing dtype (TypeError)."""
    kw, out = ctx.kw, []
    other = {torch.float32: torch.bfloat16, torch.bfloat16: torch.float32}
    for name in _tensor_args(kw, ("initial_state", "final_state", "state_pool", "state_out_pool",
                                  "per_token_states", "checkpoints")):
        for dt in (torch.float16, torch.float64):
            out.append(Mutation("state dtype", f"{name} as {dt}", _setter(name, lambda x, dt=dt: x.to(dt)),
                                TypeError, (name,)))
    # The final state takes the initial state's dtype, the output pool and the
    # per-token states the pool's: the second one is named.
    for name, ref in (("final_state", "initial_state"), ("state_out_pool", "state_pool"),
                      ("per_token_states", "state_pool")):
        if _is_tensor(kw.get(name)) and _is_tensor(kw.get(ref)):
            dt = other[kw[ref].dtype]
            out.append(Mutation("state dtype", f"{name} as {dt} beside {ref} of {kw[ref].dtype}",
                                _setter(name, lambda x, dt=dt: x.to(dt)), TypeError, (name,)))
    return out


def _shape_targets(ctx):
    names = ["q", "k", "v", "g", "beta", "out", "A_log", "dt_bias", "initial_state", "final_state", "state_pool",
             "state_out_pool", "per_token_states"]
    return _tensor_args(ctx.kw, names)


def kind_shape(ctx):
    """A dimension off by one, or one missing (ValueError)."""
    kw, out = ctx.kw, []
    for name in _shape_targets(ctx):
        shape = tuple(kw[name].shape)
        for d in range(len(shape)):
            # A pool may have any number of slots: P is no shape error (the output
            # pool's P is, it must be the pool's).
            if name == "state_pool" and d == 0:
                continue
            for delta in (1, -1):
                new = shape[:d] + (shape[d] + delta,) + shape[d + 1:]
                if new[d] < 0:
                    continue
                out.append(Mutation("shape", f"{name} {list(shape)} -> {list(new)}",
                                    _setter(name, lambda x, new=new: _filled(new, x)), ValueError, (name,)))
            new = shape[:d] + shape[d + 1:]
            out.append(Mutation("shape", f"{name} {list(shape)} without dim {d} -> {list(new)}",
                                _setter(name, lambda x, new=new: _filled(new, x)), ValueError, (name,)))
    return out


def kind_heads(ctx):
    """v's heads (HV) not a multiple of q's (H): ValueError naming q or v."""
    kw = ctx.kw
    H, HV = kw["q"].shape[-2], kw["v"].shape[-2]
    out = []
    # q and k with 3 heads: HV in {1, 2, 4} is never a multiple of 3.
    def three_heads(kw):
        for n in ("q", "k"):
            kw[n] = _filled((*kw[n].shape[:-2], 3, kw[n].shape[-1]), kw[n])
    out.append(Mutation("heads", f"q and k with 3 heads beside HV = {HV}", three_heads, ValueError, ("q", "v")))
    if H > 1:
        # v alone with H + 1 heads (g, beta, out keep HV): the grouping is checked first.
        def odd_v(kw):
            kw["v"] = _filled((*kw["v"].shape[:-2], H + 1, kw["v"].shape[-1]), kw["v"])
        out.append(Mutation("heads", f"v with {H + 1} heads beside H = {H}", odd_v, ValueError, ("q", "v")))
    return out


def kind_head_dim(ctx):
    """A head dim the device's backend does not run: the call drawn again with it
    (NotImplementedError naming the head dim)."""
    out = []
    for K in UNSUPPORTED_HEAD_DIMS[ctx.device]:
        def redraw(kw, K=K):
            cls = ForwardCall if ctx.fn == "fwd" else DecodeStep
            new_kw, written = cls(ctx.seed, ctx.device, (K,)).engine_kwargs()
            kw.clear()
            kw.update(new_kw)
            return [t for t in vars(written).values() if _is_tensor(t)]
        out.append(Mutation("head dim", f"the call drawn with K = V = {K}", redraw, NotImplementedError,
                            ("head_dim_k", "head_dim_v")))
    return out


def kind_strides(ctx):
    """A last dimension that is not contiguous (ValueError)."""
    kw, out = ctx.kw, []
    # Token inputs may be views with any token and head strides, but their rows
    # must be contiguous; beta (no row) is read element by element, and a strided
    # state_indices is taken dense: neither is an error.
    dense = ("out", "A_log", "dt_bias", "initial_state", "final_state", "cu_seqlens", "cu_seqlens_host",
             "has_initial_state", "checkpoints", "state_pool", "state_out_pool", "per_token_states",
             "num_accepted_tokens")
    for name in _tensor_args(kw, ("q", "k", "v", "g") + dense):
        x = kw[name]
        if x.numel() == 0 or x.ndim == 0 or x.shape[-1] < 2:
            continue  # no element, or a last dimension of one: any stride is contiguous
        out.append(Mutation("strides", f"{name} with last-dimension stride 2", _setter(name, _strided_last),
                            ValueError, (name,)))
        if x.ndim >= 2 and x.shape[-1] == x.shape[-2]:
            # A square [.., V, K] state handed over transposed: the shape is right, the layout is not.
            out.append(Mutation("strides", f"{name} a transposed view",
                                _setter(name, lambda x: x.transpose(-1, -2).contiguous().transpose(-1, -2)),
                                ValueError, (name,)))
    return out


def kind_alignment(ctx):
    """CUDA: a tensor starting one element into a buffer, off the 16-byte alignment
    its rows or states need; or fused token rows whose stride is not whole 16-byte
    groups (ValueError). The CPU backends need only the natural alignment."""
    if not ctx.cuda:
        return []
    kw, out = ctx.kw, []
    if ctx.fn == "fwd":
        names = ("q", "k", "v", "g", "out", "initial_state", "final_state", "state_pool", "checkpoints")
    else:
        # Decode reads token rows element by element (2-byte alignment): only its
        # states move in 16-byte vectors.
        names = ("state_pool", "state_out_pool", "per_token_states")
    for name in _tensor_args(kw, names):
        if kw[name].numel() == 0:
            continue
        out.append(Mutation("alignment", f"{name} one element into its buffer", _setter(name, _one_element_in),
                            ValueError, (name,)))
    if ctx.fn == "fwd" and kw["q"].shape[0] * kw["q"].shape[1] > 1:
        def odd_rows(kw):
            q = kw["q"]
            B, T, H, K = q.shape
            buf = torch.zeros(B, T, H * K + 1, dtype=q.dtype, device=q.device)
            y = buf[..., :H * K].unflatten(-1, (H, K))
            y.copy_(q)
            kw["q"] = y
        out.append(Mutation("alignment", "q rows H*K + 1 elements apart", odd_rows, ValueError,
                            ("q", "q_token_stride")))
    return out


def kind_device(ctx):
    """CUDA: one tensor left on the CPU (or the host copy of cu_seqlens on the GPU): ValueError."""
    if not ctx.cuda:
        return []
    kw, out = ctx.kw, []
    for name in [n for n, x in kw.items() if _is_tensor(x)]:
        if name == "cu_seqlens_host":
            out.append(Mutation("device", "cu_seqlens_host on the GPU", _setter(name, lambda x: x.cuda()),
                                ValueError, (name,)))
        else:
            # Moving q names q in every other tensor's message ("on the same device as q").
            out.append(Mutation("device", f"{name} on the CPU", _setter(name, lambda x: x.cpu()), ValueError,
                                (name,)))
    return out


def _lengths_known(ctx):
    return ctx.call.lengths is not None


def _host_boundaries(ctx):
    """The argument whose values the host checks: cu_seqlens itself on the CPU (or
    its host copy, compared with it), only the host copy on CUDA (added if absent)."""
    kw = ctx.kw
    if ctx.cuda:
        return ["cu_seqlens_host"]
    return ["cu_seqlens"] + (["cu_seqlens_host"] if _is_tensor(kw.get("cu_seqlens_host")) else [])


def kind_boundaries(ctx):
    """cu_seqlens values visible on the host that break its rules (ValueError)."""
    if not _lengths_known(ctx):
        return []
    out = []
    for name in _host_boundaries(ctx):
        def change(how, name=name):
            def apply(kw):
                cu = kw.get(name)
                if cu is None:  # a host copy added for the mutation
                    cu = kw["cu_seqlens"].to("cpu", torch.int64)
                cu = cu.clone()
                N, T = cu.numel() - 1, int(cu[-1])
                if how == "start":
                    cu[0] = 1 if int(cu[1]) >= 1 else -1
                elif how == "decreasing":
                    if N >= 2:
                        cu[1] = int(cu[2]) + 1
                    else:
                        cu[1] = -1
                else:
                    cu[-1] = T + 1
                kw[name] = cu
            return apply
        for how, what in (("start", "not starting at 0"), ("decreasing", "decreasing"),
                          ("end", "not ending at the token count")):
            out.append(Mutation("boundaries", f"{name} {what}", change(how), ValueError, (name,)))
    if not ctx.cuda and _is_tensor(ctx.kw.get("cu_seqlens_host")) and ctx.kw["cu_seqlens_host"].numel() > 2:
        # Valid boundaries, but another split: the CPU backends read cu_seqlens
        # itself, and the host copy must be a copy of it.
        def other_split(kw):
            cu = kw["cu_seqlens_host"].clone()
            cu[1] = int(cu[1]) + 1 if int(cu[1]) < int(cu[2]) else int(cu[1]) - 1
            kw["cu_seqlens_host"] = cu
        cu = ctx.kw["cu_seqlens_host"]
        if int(cu[1]) < int(cu[2]) or int(cu[1]) > 0:
            out.append(Mutation("boundaries", "cu_seqlens_host another valid split than cu_seqlens", other_split,
                                ValueError, ("cu_seqlens_host",)))
    return out


def kind_boundary_form(ctx):
    """cu_seqlens of a wrong dtype, length or rank, or given to a batch of several rows."""
    kw, out = ctx.kw, []
    if _lengths_known(ctx):
        for dt in (torch.float32, torch.int16, torch.float64):
            out.append(Mutation("boundary form", f"cu_seqlens as {dt}",
                                _setter("cu_seqlens", lambda x, dt=dt: x.to(dt)), TypeError, ("cu_seqlens",)))
        if _is_tensor(kw.get("cu_seqlens_host")):
            out.append(Mutation("boundary form", "cu_seqlens_host as int32",
                                _setter("cu_seqlens_host", lambda x: x.int()), TypeError, ("cu_seqlens_host",)))
        out.append(Mutation("boundary form", "cu_seqlens 2-d [1, N+1]", _setter("cu_seqlens", lambda x: x[None]),
                            ValueError, ("cu_seqlens",)))
        out.append(Mutation("boundary form", "cu_seqlens of one entry", _setter("cu_seqlens", lambda x: x[:1]),
                            ValueError, ("cu_seqlens",)))
        # One entry more: an empty last sequence. The forward reads N from
        # cu_seqlens, and the states (or indices) then disagree; decode reads N
        # from state_indices, and cu_seqlens disagrees.
        def longer(kw):
            kw["cu_seqlens"] = torch.cat([kw["cu_seqlens"], kw["cu_seqlens"][-1:]])
        out.append(Mutation("boundary form", "cu_seqlens one entry longer", longer, ValueError, ("cu_seqlens",)))
    elif ctx.fn == "fwd" and kw["q"].shape[0] > 1:
        def on_batch(kw):
            T = kw["q"].shape[1]
            kw["cu_seqlens"] = torch.tensor([0, T], dtype=torch.int64, device=kw["q"].device)
        out.append(Mutation("boundary form", "cu_seqlens with B > 1", on_batch, ValueError, ("cu_seqlens",)))
    return out


def kind_indices(ctx):
    """state_indices of a wrong dtype, length or rank (TypeError / ValueError)."""
    kw, out = ctx.kw, []
    if not _is_tensor(kw.get("state_indices")):
        return out
    idx = kw["state_indices"]
    for dt in (torch.float32, torch.int16, torch.float64):
        out.append(Mutation("indices", f"state_indices as {dt}", _setter("state_indices", lambda x, dt=dt: x.to(dt)),
                            TypeError, ("state_indices",)))
    if ctx.fn == "fwd":
        out.append(Mutation("indices", "state_indices 2-d [N, 1]", _setter("state_indices", lambda x: x[:, None]),
                            ValueError, ("state_indices",)))
    else:
        # decode takes [N] or [N, 1 + S]: a third dimension is the wrong rank.
        out.append(Mutation("indices", "state_indices 3-d", _setter("state_indices", lambda x: x[:, None, None]),
                            ValueError, ("state_indices",)))
    if not ctx.cuda and idx.numel() > 0:
        # An index past the pool, read on the host by the CPU backends (CUDA skips
        # and records it for check_device_faults).
        P = kw["state_pool"].shape[0]
        def past_the_pool(kw):
            x = kw["state_indices"].clone()
            x.view(-1)[-1] = P
            kw["state_indices"] = x
        out.append(Mutation("indices", f"state_indices' last entry = {P}, the pool's size", past_the_pool,
                            ValueError, ("state_indices",)))
    N = idx.shape[0]
    for n in (N + 1, N - 1):
        if n < 0:
            continue
        if ctx.fn == "decode":
            # decode reads N from state_indices: a length that splits the tokens
            # evenly, without cu_seqlens, is another valid step, no error.
            T = kw["q"].shape[0]
            has_cu = _is_tensor(kw.get("cu_seqlens"))
            if not has_cu and n > 0 and T % n == 0:
                continue
        def resize(x, n=n):
            rows = torch.full((n, *x.shape[1:]), -1, dtype=x.dtype, device=x.device)
            m = min(n, x.shape[0])
            rows[:m] = x[:m]
            return rows
        out.append(Mutation("indices", f"state_indices of length {n} for {N} sequences",
                            _setter("state_indices", resize), ValueError, ("state_indices",)))
    return out


def kind_has_initial_state(ctx):
    """has_initial_state of a wrong dtype or length (forward with a pool)."""
    kw, out = ctx.kw, []
    if ctx.fn != "fwd" or not _is_tensor(kw.get("state_indices")):
        return out
    N = kw["state_indices"].shape[0]
    dev = kw["state_indices"].device
    for dt in (torch.int32, torch.float32, torch.int64):
        out.append(Mutation("has_initial_state", f"has_initial_state as {dt}",
                            lambda kw, dt=dt: kw.update(has_initial_state=torch.ones(N, dtype=dt, device=dev)),
                            TypeError, ("has_initial_state",)))
    for n in (N + 1, N - 1):
        out.append(Mutation("has_initial_state", f"has_initial_state of length {n} for {N} sequences",
                            lambda kw, n=n: kw.update(has_initial_state=torch.ones(n, dtype=torch.bool, device=dev)),
                            ValueError, ("has_initial_state",)))
    out.append(Mutation("has_initial_state", "has_initial_state 2-d [N, 1]",
                        lambda kw: kw.update(has_initial_state=torch.ones(N, 1, dtype=torch.bool, device=dev)),
                        ValueError, ("has_initial_state",)))
    return out


def kind_scalars(ctx):
    """lower_bound outside [-5, 0) or not finite; scale not finite (ValueError)."""
    out = []
    for lb in (0.5, 0.0, -6.0, float("nan"), float("inf"), float("-inf")):
        out.append(Mutation("scalars", f"lower_bound = {lb}", lambda kw, lb=lb: kw.update(lower_bound=lb), ValueError,
                            ("lower_bound",)))
    for s in (float("nan"), float("inf"), float("-inf")):
        out.append(Mutation("scalars", f"scale = {s}", lambda kw, s=s: kw.update(scale=s), ValueError, ("scale",)))
    return out


def kind_checkpoints(ctx):
    """The forward's checkpoints: an interval that is no positive multiple of 16 (or a
    bool), a buffer of a wrong entry shape, or one entry short where the host knows
    the lengths (on CUDA: a B·T batch, or the host copy of cu_seqlens)."""
    kw, c, out = ctx.kw, ctx.call, []
    if ctx.fn != "fwd" or not c.interval:
        return out
    for interval, exc in ((24, ValueError), (8, ValueError), (0, ValueError), (-16, ValueError), (True, TypeError),
                          (False, TypeError), (16.0, TypeError)):
        out.append(Mutation("checkpoints", f"checkpoint_interval = {interval!r}",
                            lambda kw, i=interval: kw.update(checkpoint_interval=i), exc, ("checkpoint_interval",)))
    ck = kw["checkpoints"]
    for d in (1, 2, 3):
        new = list(ck.shape)
        new[d] += 1
        out.append(Mutation("checkpoints", f"checkpoints {list(ck.shape)} -> {new}",
                            _setter("checkpoints", lambda x, new=new: _filled(new, x)), ValueError, ("checkpoints",)))
    out.append(Mutation("checkpoints", "checkpoints 3-d (an entry without HV)",
                        _setter("checkpoints", lambda x: x[:, 0]), ValueError, ("checkpoints",)))
    if ck.shape[-1] != ck.shape[-2]:
        out.append(Mutation("checkpoints", "checkpoints_value_major flipped (V != K)",
                            lambda kw: kw.update(checkpoints_value_major=not kw["checkpoints_value_major"]),
                            ValueError, ("checkpoints",)))
    host_lengths = not ctx.cuda or c.lengths is None or _is_tensor(kw.get("cu_seqlens_host"))
    if c.entries >= 1 and host_lengths:
        out.append(Mutation("checkpoints", f"checkpoints holding {c.entries - 1} of {c.entries} entries",
                            _setter("checkpoints", lambda x: x[:c.entries - 1]), ValueError,
                            ("checkpoints", "checkpoints_capacity")))
    return out


def kind_accepted_tokens(ctx):
    """decode's num_accepted_tokens: a count outside [1, 1 + S] (CPU: on the device
    CUDA clamps and records it), another dtype than state_indices, a wrong length,
    or given with 1-d state_indices."""
    kw, out = ctx.kw, []
    if ctx.fn != "decode":
        return out
    acc, idx = kw.get("num_accepted_tokens"), kw["state_indices"]
    N = idx.shape[0]
    if _is_tensor(acc):
        cols = idx.shape[1]
        if not ctx.cuda:
            for bad in (0, cols + 1, -1):
                def set_entry(kw, bad=bad):
                    a = kw["num_accepted_tokens"].clone()
                    a[N - 1] = bad
                    kw["num_accepted_tokens"] = a
                out.append(Mutation("accepted tokens", f"num_accepted_tokens[{N - 1}] = {bad} (columns: {cols})",
                                    set_entry, ValueError, ("num_accepted_tokens",)))
        other = torch.int64 if acc.dtype == torch.int32 else torch.int32
        for dt in (other, torch.float32):
            out.append(Mutation("accepted tokens", f"num_accepted_tokens as {dt} beside state_indices of {idx.dtype}",
                                _setter("num_accepted_tokens", lambda x, dt=dt: x.to(dt)), TypeError,
                                ("num_accepted_tokens",)))
        out.append(Mutation("accepted tokens", f"num_accepted_tokens of length {N + 1} for {N} sequences",
                            _setter("num_accepted_tokens", lambda x: torch.cat([x, x[:1]])), ValueError,
                            ("num_accepted_tokens",)))
    elif idx.ndim == 1:
        out.append(Mutation("accepted tokens", "num_accepted_tokens with 1-d state_indices",
                            lambda kw: kw.update(num_accepted_tokens=torch.ones_like(kw["state_indices"])),
                            ValueError, ("num_accepted_tokens",)))
    return out


def kind_output_pool(ctx):
    """decode's state_out_pool and per_token_states: a shape other than the pool's
    (or the tokens'), or either one with speculative verify (ValueError)."""
    kw, out = ctx.kw, []
    if ctx.fn != "decode":
        return out
    pool = kw["state_pool"]
    verify = kw["state_indices"].ndim == 2
    T = kw["q"].shape[0]
    if verify:
        out.append(Mutation("output pool", "state_out_pool with speculative verify",
                            lambda kw: kw.update(state_out_pool=torch.zeros_like(kw["state_pool"])), ValueError,
                            ("state_out_pool",)))
        out.append(Mutation("output pool", "per_token_states with speculative verify",
                            lambda kw: kw.update(per_token_states=torch.zeros((T, *pool.shape[1:]), dtype=pool.dtype,
                                                                              device=pool.device)),
                            ValueError, ("per_token_states",)))
        return out
    for d in range(4):
        for delta in (1, -1):
            new = list(pool.shape)
            new[d] += delta
            if new[d] < 1:
                continue
            out.append(Mutation("output pool", f"state_out_pool {new} beside state_pool {list(pool.shape)}",
                                lambda kw, new=new: kw.update(state_out_pool=torch.zeros(new, dtype=pool.dtype,
                                                                                         device=pool.device)),
                                ValueError, ("state_out_pool",)))
    new = [T + 1, *pool.shape[1:]]
    out.append(Mutation("output pool", f"per_token_states {new} for {T} tokens",
                        lambda kw: kw.update(per_token_states=torch.zeros(new, dtype=pool.dtype, device=pool.device)),
                        ValueError, ("per_token_states",)))
    return out


CATALOG = (kind_dtype, kind_state_dtype, kind_shape, kind_heads, kind_head_dim, kind_strides, kind_alignment,
           kind_device, kind_boundaries, kind_boundary_form, kind_indices, kind_has_initial_state, kind_scalars,
           kind_checkpoints, kind_accepted_tokens, kind_output_pool)


# ---- drawing and running a case ---------------------------------------------------------

def applicable(fn, seed, device, head_dims):
    """The drawn call (engine forms), its keyword arguments, the tensors it may
    write, and the catalog's applicable kinds: [(kind name, [Mutation, ...])]."""
    cls = ForwardCall if fn == "fwd" else DecodeStep
    c = cls(seed, device, head_dims)
    kw, written = c.engine_kwargs()
    ctx = Ctx(fn, seed, c, kw, device)
    kinds = []
    for kind in CATALOG:
        muts = kind(ctx)
        if muts:
            kinds.append((muts[0].kind, muts))
    return c, kw, written, kinds


def draw_case(fn, seed, device, head_dims):
    """Seed's valid call of `fn` on `device`, broken by one mutation: a kind drawn
    among those that apply to it, then one of its variants."""
    c, kw, written, kinds = applicable(fn, seed, device, head_dims)
    r = random.Random(f"flash_kda errors {fn} {seed}")  # a string seed: the same draw in every process
    _, muts = r.choice(kinds)
    m = r.choice(muts)
    extra = m.apply(kw) or []
    watched = [(n, x) for n, x in kw.items() if _is_tensor(x)]
    watched += [(f"buffer {n}", x) for n, x in vars(written).items() if _is_tensor(x)]
    watched += [("buffer", x) for x in extra]
    call = flash_kda.fwd if fn == "fwd" else flash_kda.decode
    return Case(seed, fn, call, kw, m, watched)


def _bytes(x):
    """A copy of x's bytes (a fresh dense buffer: a clone may keep odd strides, which
    a dtype view refuses)."""
    flat = torch.empty(x.numel(), dtype=x.dtype, device=x.device)
    flat.copy_(x.detach().reshape(-1))
    return flat.view(torch.uint8)


def names(message, name):
    """Whether `message` names `name` as a whole identifier (not inside a longer one)."""
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", message) is not None


def check(case):
    """Runs the broken call and asserts the three rules."""
    m = case.mutation
    before = [(n, x, _bytes(x)) for n, x in case.watched]
    err = None
    try:
        case.call(**case.kwargs)
    except Exception as e:  # noqa: BLE001 - the type is what is checked
        err = e
    cuda = any(x.is_cuda for _, x, _ in before)
    if cuda:
        torch.cuda.synchronize()
    problems = []
    if err is None:
        problems.append(f"no exception: the call ran (expected {m.exc.__name__})")
    else:
        text = f"{type(err).__name__}: {err}"
        if not isinstance(err, m.exc):
            problems.append(f"raised {text!r}, expected {m.exc.__name__}")
        if not any(names(str(err), n) for n in m.names):
            problems.append(f"the message does not name {' or '.join(m.names)}: {text!r}")
    changed = [n for n, x, b in before if not torch.equal(_bytes(x), b)]
    if changed:
        problems.append(f"written although the call failed: {', '.join(changed)}")
    if cuda:
        try:
            flash_kda.check_device_faults()
        except ValueError as e:
            problems.append(f"a device fault was recorded: {e}")
    assert not problems, f"{case.label}: " + "; ".join(problems)
