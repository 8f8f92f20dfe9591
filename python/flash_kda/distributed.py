"""Context parallelism: one long sequence (or a packed batch) split across ranks.

Each rank holds a contiguous shard of the packed tokens. A sequence may start on one
rank and end on another. The state map of any run of tokens is affine in the state it
starts from, ``S_out = S_in @ M + B`` (spec section 6), so:

1. every rank computes the summaries ``(M, B)`` of the sequence pieces it holds (the
   summaries call of :func:`flash_kda.fwd`, ``summaries=``);
2. one all-gather over the process group shares, from every rank, the summary of its
   last piece (the only one that can continue on a later rank);
3. every rank takes the initial state of the sequence its first piece continues (zero
   without one) through those summaries of the earlier ranks, and runs its shard's
   forward from the incoming states (the resume call, ``resume_from_summaries=True``).
   On CUDA the resume reuses what the summaries call left in the workspace (the
   token-parallel prologue and the segment scan's first pass): where the launch plan
   cuts the pieces into segments (few heads, long pieces, the regime context
   parallelism is for) a rank does about the work of one forward over its shard; where
   it does not (many heads or short pieces) the summaries call runs every piece's chain
   once more.

The final state of a sequence comes out on the rank that holds its last token. Before
step 1, one small all-gather shares every rank's token count (the shard boundaries),
whether its arguments passed its own checks, and what must be the same on every rank
(the heads and head dims, the gate and beta forms, scale, lower_bound, whether an
initial state is given and its dtype, and a 128-bit BLAKE2b digest of cu_seqlens);
step 2 is one all-gather each of fp32 ``M [K, K]`` and ``B [V, K]`` per rank and value
head, ``(K*K + V*K) * 4`` bytes (128 KiB at K = V = 128). Nothing else communicates. The
communication is torch.distributed's (gloo on CPU tensors, NCCL on CUDA tensors).
"""
from __future__ import annotations

import hashlib
import struct

import torch

from . import _resolve_scalars, fwd, workspace_size

__all__ = ["cp_fwd", "shard_pieces"]


def shard_pieces(cu_seqlens, shard_starts):
    """The sequence pieces of every rank: ``pieces[r]`` lists ``(n, begin, end)``, the
    global token range ``[begin, end)`` of sequence n held by rank r, in sequence order.

    ``cu_seqlens``: the global boundaries (a list of ints, ``[N+1]``). ``shard_starts``:
    ``[R+1]``, rank r holding tokens ``[shard_starts[r], shard_starts[r+1])``. Every
    sequence appears on the ranks its tokens touch. An empty sequence appears once, as an
    empty piece on the rank whose shard holds the token at its position (the last rank
    for a position at the very end), so that its final state (its initial state) has an
    owner.
    """
    cu_seqlens = _boundaries(cu_seqlens, "cu_seqlens")
    shard_starts = _boundaries(shard_starts, "shard_starts")
    if cu_seqlens[-1] != shard_starts[-1]:
        raise ValueError(f"shard_starts: the shards end at {shard_starts[-1]}, the sequences at {cu_seqlens[-1]}; "
                         "expected the same token count")
    R = len(shard_starts) - 1
    pieces = [[] for _ in range(R)]
    for n in range(len(cu_seqlens) - 1):
        b, e = cu_seqlens[n], cu_seqlens[n + 1]
        if b == e:
            holding = [r for r in range(R) if shard_starts[r] <= b < shard_starts[r + 1]]
            pieces[holding[0] if holding else R - 1].append((n, b, b))
            continue
        for r in range(R):
            lo, hi = max(b, shard_starts[r]), min(e, shard_starts[r + 1])
            if lo < hi:
                pieces[r].append((n, lo, hi))
    return pieces


def _as_int_list(x, name):
    if isinstance(x, torch.Tensor):
        if x.device.type not in ("cpu", "cuda"):
            raise ValueError(f"{name}: expected a tensor in CPU or CUDA memory, got one on device {x.device}")
        if x.dim() != 1 or x.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name}: expected a 1-d int32 or int64 tensor, got shape {tuple(x.shape)} {x.dtype}")
        return [int(v) for v in x.tolist()]
    try:
        values = list(x)
    except TypeError:
        raise TypeError(f"{name}: expected a 1-d int tensor or a list of ints, got {type(x).__name__}") from None
    for v in values:  # int() would truncate 70.9 to 70
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name}: expected ints, got {v!r}")
    return values


def _boundaries(x, name):
    """Boundaries as ints: [M+1] values, M >= 1, from 0, non-decreasing."""
    xs = _as_int_list(x, name)
    if len(xs) < 2:
        raise ValueError(f"{name}: expected [M+1] boundaries with M >= 1, got {len(xs)} values")
    if xs[0] != 0 or any(b < a for a, b in zip(xs, xs[1:])):
        raise ValueError(f"{name}: expected 0 = {name}[0] <= {name}[1] <= ... (non-decreasing), got {xs}")
    return xs


def _check_shard_args(q, v, initial_state, final_state, cu_seqlens):
    """cp_fwd's arguments that this rank can check alone, before any collective (the
    forward's own checks name the rest). Returns cu_seqlens as ints."""
    for name, x in (("q", q), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4 or x.shape[0] != 1:
            raise ValueError(f"{name}: expected this rank's shard as [1, T_r, heads, dim], got shape {tuple(x.shape)}")
        if x.device.type not in ("cpu", "cuda"):
            raise ValueError(f"{name}: expected a tensor in CPU or CUDA memory, got one on device {x.device}")
    if cu_seqlens is None:
        raise TypeError("cu_seqlens: expected the global boundaries [N+1], got None")
    cu = _boundaries(cu_seqlens, "cu_seqlens")
    want = (len(cu) - 1, int(v.shape[2]), int(v.shape[3]), int(q.shape[3]))
    for name, x in (("initial_state", initial_state), ("final_state", final_state)):
        if x is None:
            continue
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor or None, got {type(x).__name__}")
        if x.dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"{name}: expected dtype torch.float32 or torch.bfloat16, got {x.dtype}")
        if tuple(x.shape) != want:
            raise ValueError(f"{name}: expected shape [N, HV, V, K] = {list(want)}, got {list(x.shape)}")
        if x.device != q.device:
            raise ValueError(f"{name}: expected a tensor on the device of q ({q.device}), got {x.device}")
    # Written entry by entry: a broadcast view would take every sequence's state in one place.
    if final_state is not None and not final_state.is_contiguous():
        raise ValueError(f"final_state: expected a C-contiguous tensor, got strides {final_state.stride()}")
    return cu


def _byte_range(x):
    """[first, last) bytes a tensor's elements can touch (strides >= 0: the forward
    refuses others)."""
    if x.numel() == 0:
        return None
    first = x.data_ptr()
    span = sum((n - 1) * st for n, st in zip(x.shape, x.stride()) if n > 1)
    return first, first + (span + 1) * x.element_size()


def _check_final_state_memory(final_state, others):
    """The final states are copied in after this rank's forward wrote out and read its
    inputs: final_state sharing memory with one of them would corrupt it or be
    corrupted. The initial state may be final_state itself (it is read before)."""
    if final_state is None:
        return
    fs = _byte_range(final_state)
    for name, x in others:
        if not isinstance(x, torch.Tensor) or fs is None or x.device != final_state.device:
            continue
        r = _byte_range(x)
        if r is not None and r[0] < fs[1] and fs[0] < r[1]:
            raise ValueError(f"final_state: shares memory with {name}; expected memory of its own, since the final "
                             "states are written after the rank's forward")


# What every rank must pass alike, in the plan's all-gather, one row entry each: the
# argument the error names and what of it must agree. Scalars as their float64 bits;
# an absent initial state as 0; cu_seqlens as two halves of its digest.
_AGREED = (("q", "head count"), ("v", "head count"), ("q", "head dim"), ("v", "head dim"),
           ("use_gate_in_kernel", "value"), ("use_beta_sigmoid_in_kernel", "value"), ("scale", "value"),
           ("lower_bound", "value"), ("initial_state", "presence and dtype"),
           ("cu_seqlens", "global boundaries"), ("cu_seqlens", "global boundaries"))


def _float_bits(x):
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def _agreed_row(q, v, cu, scale, lower_bound, initial_state, forms):
    """This rank's entries of _AGREED, as int64 values."""
    digest = hashlib.blake2b(struct.pack(f"<{len(cu)}q", *cu), digest_size=16).digest()
    init = 0 if initial_state is None else (1 if initial_state.dtype == torch.float32 else 2)
    return [int(q.shape[2]), int(v.shape[2]), int(q.shape[3]), int(v.shape[3]), int(bool(forms["use_gate_in_kernel"])),
            int(bool(forms["use_beta_sigmoid_in_kernel"])), _float_bits(scale), _float_bits(lower_bound), init,
            int.from_bytes(digest[:8], "little", signed=True), int.from_bytes(digest[8:], "little", signed=True)]


def cp_fwd(q, k, v, g, beta, scale, out, *, A_log=None, dt_bias=None, cu_seqlens, lower_bound=None, initial_state=None,
           final_state=None, group=None, backend="auto", use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True):
    """Context-parallel :func:`flash_kda.fwd` over a process group.

    Every rank calls it with its own shard and the same global arguments:

    - q, k: ``[1, T_r, H, K]``; v, out: ``[1, T_r, HV, V]``; g: ``[1, T_r, HV, K]``;
      beta: ``[1, T_r, HV]`` (bf16; g and beta may be fp32 as :func:`flash_kda.fwd` takes
      them): this rank's tokens, which are tokens
      ``[start_r, start_r + T_r)`` of the packed sequences, ranks in group order
      (``start_r`` = the sum of the lower ranks' ``T``; shards may be empty).
    - cu_seqlens: the global boundaries ``[N+1]`` (int64 or int32; read on the host,
      so a device tensor costs one synchronisation); ``cu_seqlens[N]`` must equal the
      sum of every rank's ``T_r``.
    - initial_state: the global ``[N, HV, V, K]`` (fp32 or bf16), the same on every rank,
      or None (every sequence starts from zero).
    - final_state: C-contiguous ``[N, HV, V, K]`` (fp32 or bf16) or None. The rank holding a
      sequence's last token (for an empty sequence: the rank where it sits, see
      :func:`shard_pieces`) writes its final state there; other entries are untouched.
    - A_log, dt_bias, lower_bound, scale, backend, use_gate_in_kernel,
      use_beta_sigmoid_in_kernel: as for :func:`flash_kda.fwd` (with ``use_gate_in_kernel=False``
      g is the log decay, and A_log and dt_bias may be None).
    - group: the torch.distributed process group (None: the default group).

    Returns the list of sequence indices whose final state this rank wrote. Collective:
    every rank of the group must call it, with the same ``cu_seqlens``. CPU tensors (gloo)
    or CUDA tensors (NCCL).

    Errors: each rank checks its own arguments (the forward's checks included) before the
    first collective, and the ranks then agree on the result in it: a rank whose
    arguments are wrong raises its TypeError / ValueError / NotImplementedError naming the
    argument, and every other rank a RuntimeError naming that rank, so that none waits in
    a later collective. Ranks that pass different ``cu_seqlens``, head counts, head dims,
    gate or beta forms, ``scale``, ``lower_bound``, or initial states of another dtype (or
    given on some ranks only) all raise a ValueError naming it. The values of
    ``initial_state``, ``A_log`` and ``dt_bias`` are taken to be the same, not compared
    (that would copy them to the host). ``final_state`` must not share memory with this
    rank's token tensors or ``out``. Without an initialised process group the error is
    raised at once.
    """
    forms = dict(use_gate_in_kernel=use_gate_in_kernel, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel)
    error = None
    agreed = None
    try:
        cu_seqlens = _check_shard_args(q, v, initial_state, final_state, cu_seqlens)
        # The forward's own checks of this shard (no boundaries needed: [1, T_r] is one
        # sequence), so that a bad k, g, beta, gate parameter, lower_bound or out fails
        # here, not in the summaries call after the ranks have parted ways.
        workspace_size(q, k, v, g, beta, scale, out, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound,
                       backend=backend, **forms)
        _check_final_state_memory(final_state, (("out", out), ("q", q), ("k", k), ("v", v), ("g", g),
                                                ("beta", beta), ("A_log", A_log), ("dt_bias", dt_bias)))
        agreed = _agreed_row(q, v, cu_seqlens, *_resolve_scalars(q, scale, lower_bound), initial_state, forms)
    except (TypeError, ValueError, NotImplementedError) as e:
        if not _has_group(group):
            raise
        error = e
    plan = _plan(q, v, cu_seqlens, group, error=error, agreed=agreed)
    local = _summarise(plan, q, k, v, g, beta, scale, A_log, dt_bias, lower_bound, backend, forms)
    M_list, B_list = _exchange(plan, local, group)
    incoming = _incoming_states(plan, M_list, B_list, initial_state)
    return _resume(plan, local, incoming, q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, final_state,
                   backend)


# The steps of cp_fwd, apart so that bench/cp_bench.py can time each one.

class _Plan:
    """Who holds what: the shard boundaries, every rank's pieces, this rank's."""

    def __init__(self, world, rank, cu, starts, HV, V, K, device):
        self.world, self.rank, self.cu, self.starts = world, rank, cu, starts
        self.HV, self.V, self.K, self.device = HV, V, K, device
        self.pieces = shard_pieces(cu, starts)
        self.mine = self.pieces[rank]
        start = starts[rank]
        self.local_cu = [0] + [e - start for _, _, e in self.mine]
        # Only a rank's last piece can continue on a later rank, and only its first
        # can have begun on an earlier one: each rank shares one summary, that of
        # its last piece (the sequence, or -1 for a rank without pieces).
        self.last_seq = [p[-1][0] if p else -1 for p in self.pieces]


def _has_group(group):
    """Whether cp_fwd can reach the other ranks (a group given, or a default one)."""
    import torch.distributed as dist

    return group is not None or (dist.is_available() and dist.is_initialized())


def _agreement_device(q, group):
    """Where the plan's all-gather runs: q's device, or for a q that is no CPU or CUDA
    tensor (a rank that is about to report it) the device its group's backend takes."""
    import torch.distributed as dist

    nccl = dist.get_backend(group) == "nccl"
    if isinstance(q, torch.Tensor) and q.device.type in ("cpu", "cuda") and not (nccl and q.device.type == "cpu"):
        return q.device
    return torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")


def _plan(q, v, cu_seqlens, group, error=None, agreed=None):
    """The shard boundaries, from one all-gather of every rank's token count, which also
    carries whether the rank's own checks failed (`error`) and what every rank must
    pass alike (`agreed`, _AGREED's entries; None: only cu_seqlens' digest is
    compared), so that every rank raises together or none does."""
    import torch.distributed as dist

    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group: expected a torch.distributed ProcessGroup or None, got {type(group).__name__}")
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    dev = _agreement_device(q, group)
    n = 2 + len(_AGREED)
    if error is None:
        cu = _boundaries(cu_seqlens, "cu_seqlens")
        T_r = int(q.shape[1])
        if agreed is None:  # the shapes and forms of fwd's defaults: only the digest differs by rank
            agreed = _agreed_row(q, v, cu, 1.0, -5.0, None, dict(use_gate_in_kernel=True,
                                                               use_beta_sigmoid_in_kernel=True))
        mine = [T_r, 0] + agreed
    else:
        mine = [0, 1] + [0] * len(_AGREED)
    gathered = [torch.zeros(n, dtype=torch.int64, device=dev) for _ in range(world)]
    dist.all_gather(gathered, torch.tensor(mine, dtype=torch.int64, device=dev), group=group)
    rows = [[int(x) for x in t.tolist()] for t in gathered]
    failed = [r for r, row in enumerate(rows) if row[1]]
    if error is not None:
        raise error
    if failed:
        raise RuntimeError(f"cp_fwd: rank(s) {failed} of the group rejected their arguments (the error is raised "
                           "there); nothing was computed")
    for i, (name, what) in enumerate(_AGREED):
        differ = [r for r, row in enumerate(rows) if row[2 + i] != rows[0][2 + i]]
        if differ:
            raise ValueError(f"{name}: expected the same {what} on every rank; rank(s) {differ} passed another "
                             "than rank 0")
    starts = [0]
    for row in rows:
        starts.append(starts[-1] + row[0])
    if starts[-1] != cu[-1]:
        raise ValueError(f"cu_seqlens: cu_seqlens[N] = {cu[-1]}, but the ranks hold {starts[-1]} tokens in all "
                         f"(per rank: {[s1 - s0 for s0, s1 in zip(starts, starts[1:])]})")
    return _Plan(world, rank, cu, starts, int(v.shape[2]), int(v.shape[3]), int(q.shape[3]), q.device)


class _Local:
    """This rank's summaries (one per piece; the identity without pieces) and the
    forward's arguments shared by the summaries and the resume call, workspace
    included."""

    def __init__(self, M, B, common):
        self.M, self.B, self.common = M, B, common


def _summarise(plan, q, k, v, g, beta, scale, A_log, dt_bias, lower_bound, backend, forms=None):
    """Step 1: the summaries of this rank's pieces. `forms`: fwd's use_gate_in_kernel and
    use_beta_sigmoid_in_kernel (its defaults when None)."""
    HV, V, K, dev = plan.HV, plan.V, plan.K, plan.device
    n_mine = len(plan.mine)
    M = torch.zeros(max(n_mine, 1), HV, K, K, dtype=torch.float32, device=dev)
    B = torch.zeros(max(n_mine, 1), HV, V, K, dtype=torch.float32, device=dev)
    if not plan.mine:
        return _Local(M, B, None)
    common = dict(A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound,
                  cu_seqlens=torch.tensor(plan.local_cu, dtype=torch.int64, device=dev), backend=backend,
                  **(forms or {}))
    if dev.type == "cuda":
        # The workspace keeps the summaries call's work for the resume call; the
        # host copy of the boundaries lets both calls validate them.
        common["cu_seqlens_host"] = torch.tensor(plan.local_cu, dtype=torch.int64)
        nbytes = workspace_size(q, k, v, g, beta, scale, None, summaries=(M, B), **common)
        common["workspace"] = torch.empty(nbytes + 255, dtype=torch.uint8, device=dev)
    fwd(q, k, v, g, beta, scale, None, summaries=(M, B), **common)
    return _Local(M, B, common)


def _exchange(plan, local, group):
    """Step 2: every rank's last-piece summary, one all-gather each of M and B:
    (K·K + V·K) · 4 bytes per value head and rank."""
    import torch.distributed as dist

    M_list = [torch.empty_like(local.M[-1]) for _ in range(plan.world)]
    B_list = [torch.empty_like(local.B[-1]) for _ in range(plan.world)]
    dist.all_gather(M_list, local.M[-1].contiguous(), group=group)
    dist.all_gather(B_list, local.B[-1].contiguous(), group=group)
    return M_list, B_list


def _incoming_states(plan, M_list, B_list, initial_state):
    """Step 3a: each piece's incoming state. A piece that starts its sequence starts
    from the sequence's initial state (zero without one); the first piece may instead
    continue a sequence from earlier ranks, whose last pieces take that initial state
    through, in rank order (float64 sums)."""
    if not plan.mine:
        return None
    seqs = [n for n, _, _ in plan.mine]
    if initial_state is not None:
        # Contiguous whatever initial_state's strides: the resume call's initial states.
        incoming = initial_state[torch.tensor(seqs, device=initial_state.device)].to(plan.device,
                                                                                     torch.float32).contiguous()
    else:
        incoming = torch.zeros(len(seqs), plan.HV, plan.V, plan.K, dtype=torch.float32, device=plan.device)
    n0 = seqs[0]
    earlier = [r for r in range(plan.rank) if plan.last_seq[r] == n0]
    if earlier:
        S = incoming[0].double()
        for r in earlier:  # S <- S @ M + B
            S = S @ M_list[r].double() + B_list[r].double()
        incoming[0].copy_(S.float())
    return incoming


def _resume(plan, local, incoming, q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, final_state,
            backend):
    """Step 3b: this rank's outputs and final states from the true incoming states."""
    if not plan.mine:
        return []
    fin = torch.empty_like(incoming)
    fwd(q, k, v, g, beta, scale, out, initial_state=incoming, final_state=fin, resume_from_summaries=True,
        **local.common)
    owned = []
    cu = plan.cu
    for i, (n, b, e) in enumerate(plan.mine):
        if e == cu[n + 1] and (b < e or cu[n] == cu[n + 1]):
            owned.append(n)
            if final_state is not None:
                with torch.no_grad():  # written as fwd writes it, also into a tensor that requires grad
                    final_state[n].copy_(fin[i].to(final_state.dtype))
    return owned
