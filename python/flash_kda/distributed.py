"""Context parallelism: one long sequence (or a packed batch) split across ranks.

Each rank holds a contiguous shard of the packed tokens. A sequence may start on one
rank and end on another. The state map of any run of tokens is affine in the state it
starts from, ``S_out = S_in @ M + B`` (spec section 6), so:

1. every rank computes the summaries ``(M, B)`` of the sequence pieces it holds
   (:func:`flash_kda.segment_summaries`);
2. one all-gather over the process group gives every rank all the pieces' summaries;
3. every rank composes, for each of its pieces, the summaries of the same sequence's
   pieces on earlier ranks onto the sequence's initial state (zero without one), and
   runs :func:`flash_kda.fwd` on its shard from those incoming states.

The final state of a sequence comes out on the rank that holds its last token. Only
step 2 communicates: one all-gather of fp32 ``M [K, K]`` and ``B [V, K]`` per sequence
piece and value head, ``(K*K + V*K) * 4`` bytes each (128 KiB at K = V = 128), padded
to the largest piece count of any rank. The communication is torch.distributed's
(gloo on CPU tensors, NCCL on CUDA tensors).
"""
from __future__ import annotations

import torch

from . import fwd, segment_summaries

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
        if x.dim() != 1 or x.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name}: expected a 1-d int32 or int64 tensor, got shape {tuple(x.shape)} {x.dtype}")
        return [int(v) for v in x.tolist()]
    return [int(v) for v in x]


def cp_fwd(q, k, v, g, beta, scale, out, *, A_log, dt_bias, cu_seqlens, lower_bound=None, initial_state=None,
           final_state=None, group=None, backend="auto"):
    """Context-parallel :func:`flash_kda.fwd` over a process group.

    Every rank calls it with its own shard and the same global arguments:

    - q, k: ``[1, T_r, H, K]``; v, out: ``[1, T_r, HV, V]``; g: ``[1, T_r, HV, K]``;
      beta: ``[1, T_r, HV]`` (bf16): this rank's tokens, which are tokens
      ``[start_r, start_r + T_r)`` of the packed sequences, ranks in group order
      (``start_r`` = the sum of the lower ranks' ``T``; shards may be empty).
    - cu_seqlens: the global boundaries ``[N+1]`` (int64 or int32; read on the host,
      so a device tensor costs one synchronisation); ``cu_seqlens[N]`` must equal the
      sum of every rank's ``T_r``.
    - initial_state: the global ``[N, HV, V, K]`` (fp32 or bf16), the same on every rank,
      or None (every sequence starts from zero).
    - final_state: ``[N, HV, V, K]`` (fp32 or bf16) or None. The rank holding a
      sequence's last token (for an empty sequence: the rank where it sits, see
      :func:`shard_pieces`) writes its final state there; other entries are untouched.
    - A_log, dt_bias, lower_bound, scale, backend: as for :func:`flash_kda.fwd`.
    - group: the torch.distributed process group (None: the default group).

    Returns the list of sequence indices whose final state this rank wrote. Collective:
    every rank of the group must call it, with the same ``cu_seqlens``. CPU tensors (gloo)
    or CUDA tensors (NCCL, K = V: the summaries come from two forwards over the pieces).
    """
    import torch.distributed as dist

    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    cu = _as_int_list(cu_seqlens, "cu_seqlens")
    if len(cu) < 2:
        raise ValueError(f"cu_seqlens: expected [N+1] with N >= 1, got {len(cu)} values")
    if q.dim() != 4 or q.shape[0] != 1:
        raise ValueError(f"q: expected this rank's shard as [1, T_r, H, K], got shape {tuple(q.shape)}")
    T_r = int(q.shape[1])
    HV, V, K = int(v.shape[2]), int(v.shape[3]), int(q.shape[3])
    N = len(cu) - 1
    dev = q.device

    # Shard boundaries from every rank's token count (one small all-gather).
    counts = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(world)]
    dist.all_gather(counts, torch.tensor([T_r], dtype=torch.int64, device=dev), group=group)
    starts = [0]
    for c in counts:
        starts.append(starts[-1] + int(c.item()))
    if starts[-1] != cu[-1]:
        raise ValueError(f"cu_seqlens: cu_seqlens[N] = {cu[-1]}, but the ranks hold {starts[-1]} tokens in all "
                         f"(per rank: {[s1 - s0 for s0, s1 in zip(starts, starts[1:])]})")
    if any(cu[i + 1] < cu[i] for i in range(N)) or cu[0] != 0:
        raise ValueError("cu_seqlens: expected 0 = cu_seqlens[0] <= cu_seqlens[1] <= ... (non-decreasing)")
    pieces = shard_pieces(cu, starts)
    mine = pieces[rank]
    start = starts[rank]

    # 1. The summaries of this rank's pieces (empty ones are the identity), from two
    #    forwards over the pieces when K == V (any backend, CUDA included): B is the
    #    final state from a zero state, M the final state of K rows started from the
    #    identity with v = 0 (spec section 6). Otherwise from segment_summaries (CPU).
    P_max = max(len(p) for p in pieces)
    M_all = torch.zeros(world, max(P_max, 1), HV, K, K, dtype=torch.float32, device=dev)
    B_all = torch.zeros(world, max(P_max, 1), HV, V, K, dtype=torch.float32, device=dev)
    local_cu = torch.tensor([0] + [e - start for _, _, e in mine], dtype=torch.int64, device=dev)
    common = dict(A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound, cu_seqlens=local_cu, backend=backend)
    if mine:
        M_local, B_local = M_all[rank, :len(mine)], B_all[rank, :len(mine)]
        if K == V:
            scratch = torch.empty_like(out)
            fwd(q, k, v, g, beta, scale, scratch, final_state=B_local, **common)
            identity = torch.eye(K, dtype=torch.float32, device=dev).expand(len(mine), HV, K, K).contiguous()
            fwd(q, k, torch.zeros_like(v), g, beta, scale, scratch, initial_state=identity, final_state=M_local,
                **common)
        else:
            segs = torch.tensor([[b - start, e - start] for _, b, e in mine], dtype=torch.int64)
            M, B = segment_summaries(q, k, v, g, beta, A_log, dt_bias, segs, lower_bound=lower_bound,
                                     backend=backend)
            M_local.copy_(M)
            B_local.copy_(B)

    # 2. Every rank's summaries.
    mine_M, mine_B = M_all[rank].clone(), B_all[rank].clone()
    M_list = list(M_all.unbind(0))
    B_list = list(B_all.unbind(0))
    dist.all_gather(M_list, mine_M, group=group)
    dist.all_gather(B_list, mine_B, group=group)

    # 3. Incoming states of this rank's pieces: the sequence's initial state taken
    #    through its pieces on the ranks before this one, in order.
    if not mine:
        return []
    incoming = torch.zeros(len(mine), HV, V, K, dtype=torch.float32, device=dev)
    for i, (n, _, _) in enumerate(mine):
        S = incoming[i]
        if initial_state is not None:
            S.copy_(initial_state[n].float())
        for r in range(rank):
            for j, (m, _, _) in enumerate(pieces[r]):
                if m == n:  # S <- S @ M + B, summed in float64
                    S.copy_((S.double() @ M_list[r][j].double() + B_list[r][j].double()).float())
    # Pieces partition the shard: their ends are increasing and the last is the shard's end.
    fin = torch.empty_like(incoming)
    fwd(q, k, v, g, beta, scale, out, initial_state=incoming, final_state=fin, **common)
    owned = []
    for i, (n, b, e) in enumerate(mine):
        if e == cu[n + 1] and (b < e or cu[n] == cu[n + 1]):
            owned.append(n)
            if final_state is not None:
                final_state[n].copy_(fin[i].to(final_state.dtype))
    return owned
