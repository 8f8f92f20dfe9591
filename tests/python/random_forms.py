"""Random engine-style calls of flash_kda.fwd and flash_kda.decode, drawn for one
device: the draws and the two forms of each call that test_random_calls_cpu.py,
test_random_calls_gpu.py, test_random_decode_cpu.py and test_random_decode_gpu.py
share (random_errors.py breaks the engine's forms, from engine_kwargs(), one
argument at a time).

A drawn call is made twice on its device. Once in an engine's forms, all at once:
token tensors as views of one fused projection output (or dense), int32 or int64
cu_seqlens (the forward with or without the host copy), states in a pool sliced
from a bigger buffer (int32 or int64 indices, negative ones; the forward's
has_initial_state, decode's block-table column, separate output pool, per-token
states and speculative verify), the forward's periodic checkpoints in either
layout and dtype. Once with the glue an engine would otherwise write: contiguous
copies, int64 boundaries, dense states gathered from the pool and scattered back
by hand, dense indices. The binding reads every form as the plain one, so the
two runs must be bitwise equal, and the first may write nothing else (the pool's
other slots and padding, spare checkpoint entries, the block table's other
columns). The GPU suites also run the glued call on the CPU backend with the same
inputs and hold the CUDA results to the accuracy bars against it.

What follows the device: the head dims (K in 16, 32 on the CPU, V = K or 16; on
CUDA K = V in 64, 128, the only ones its kernels are built for), the padding of a
fused row (on CUDA the rows of q, k, v and g must start 16-byte aligned), where
the tensors live (the host copy of cu_seqlens stays on the CPU), the backend
argument (CPU calls name "cpu"; CUDA ones leave the default), and somewhat longer
forward sequences on CUDA, kept short enough for the CPU backend the GPU suites
compare with.

FLASHKDA_RANDOM_SEEDS = "first:count" (or "count", from seed 0) replaces every
suite's default seeds, range(default count), e.g. for a longer sweep:
FLASHKDA_RANDOM_SEEDS=100:200 runs seeds 100 to 299.
"""
from __future__ import annotations

import math
import os
import random
from types import SimpleNamespace

import torch

import flash_kda
from kda_reference import make_problem, rel_rms
from test_decode_cpu import make_decode

CPU_HEAD_DIMS = (16, 32)
CUDA_HEAD_DIMS = (64, 128)
TOKEN_INPUTS = ("q", "k", "v", "g", "beta")


def seeds(default_count):
    """The seeds a suite runs: range(default_count), or those FLASHKDA_RANDOM_SEEDS names."""
    env = os.environ.get("FLASHKDA_RANDOM_SEEDS", "").strip()
    if not env:
        return range(default_count)
    first, _, count = env.rpartition(":")
    try:
        first, count = int(first or 0), int(count)
    except ValueError:
        raise ValueError(f"FLASHKDA_RANDOM_SEEDS: expected 'first:count' or 'count', got {env!r}") from None
    return range(first, first + max(count, 1))


def backend_kw(device):
    # On CUDA the default ("auto") is what an engine passes; on the CPU "cpu" names
    # the chunked fp32 backend rather than leaving the choice to the default.
    return {"backend": "cpu"} if device == "cpu" else {}


def fused_pad(p, r, device):
    """bf16 elements after beta in a fused row of p's token inputs."""
    H, K = p["q"].shape[-2:]
    HV, V = p["v"].shape[-2:]
    width = 2 * H * K + HV * V + HV * K + HV
    # CUDA reads q, k, v and g rows as 16-byte vectors: the row (the token stride)
    # must be whole 8-element groups. q, k, v and g start at multiples of K there.
    align = (-width) % 8 if device == "cuda" else 0
    return align + 8 * r.randint(0, 2)


def fused(p, pad, device):
    """q | k | v | g | beta | pad of each token in one [..., width] buffer on `device`,
    and the views of it (p's token dims: [B, T] for the forward, [T] for decode)."""
    lead = tuple(p["v"].shape[:-2])
    H, K = p["q"].shape[-2:]
    HV, V = p["v"].shape[-2:]
    shapes = ((H, K), (H, K), (HV, V), (HV, K), None)
    parts = [p[n] if s is None else p[n].reshape(*lead, s[0] * s[1]) for n, s in zip(TOKEN_INPUTS, shapes)]
    buf = torch.cat(parts + [torch.zeros(*lead, pad, dtype=torch.bfloat16)], dim=-1).to(device)
    at, views = 0, {}
    for name, t, shape in zip(TOKEN_INPUTS, parts, shapes):
        x = buf[..., at:at + t.shape[-1]]
        views[name] = x if shape is None else x.unflatten(-1, shape)
        at += t.shape[-1]
    return views


def token_inputs(p, pad, device):
    """q, k, v, g, beta on `device` as an engine passes them: views of a fused row
    with `pad` elements of padding, or (pad None) dense tensors."""
    return fused(p, pad, device) if pad is not None else {n: p[n].to(device) for n in TOKEN_INPUTS}


def dense_copy(x, device):
    """A contiguous copy of x on `device`: a new tensor even where x is one already
    (the glued pool is written, the drawn one must keep its values)."""
    return x.clone(memory_format=torch.contiguous_format).to(device)


def assert_near(label, x, ref, bar):
    """x within relative RMS `bar` of ref, as whole tensors; an empty one has nothing to compare."""
    if ref.numel() == 0:
        return
    e = rel_rms(x.cpu(), ref.cpu())
    assert e <= bar, f"{label}: rel RMS {e:.3e} against the CPU backend > {bar}"


# ---- the forward ------------------------------------------------------------------

class ForwardCall:
    """A drawn forward (its inputs kept on the CPU): the engine's forms on its
    device, and the glued call on any device."""

    def __init__(self, seed, device, head_dims):
        r = random.Random(seed)
        cuda = device == "cuda"
        self.device = device
        H = r.choice([1, 2])
        HV = H * r.choice([1, 2])
        K = r.choice(head_dims)
        V = K if cuda else r.choice([K, min(head_dims)])
        # CUDA plans its launch by the lengths (and with or without their host copy):
        # somewhat longer sequences there, still quick for the CPU backend that the
        # GPU suite compares with at K = 128.
        longest, chunks, batch_T = (300, 8, 240) if cuda else (150, 4, 120)
        if r.random() < 0.75:
            self.lengths = [r.choice([0, r.randint(1, 15), 16 * r.randint(1, chunks), r.randint(17, longest)])
                            for _ in range(r.randint(1, 5))]
            p = make_problem(H=H, HV=HV, K=K, V=V, seqlens=self.lengths, seed=seed)
        else:
            self.lengths = None
            p = make_problem(B=r.randint(1, 3), T=r.randint(1, batch_T), H=H, HV=HV, K=K, V=V, seed=seed)
        self.p = p
        B, T = p["v"].shape[:2]
        N = p["N"]
        self.state_shape = (N, HV, V, K)
        self.per = HV * V * K
        self.lower_bound = r.choice([-5.0, -1.0])
        self.scale = r.choice([None, 0.3])
        self.pad = fused_pad(p, r, device) if r.random() < 0.6 else None
        self.cu_dtype = r.choice([torch.int32, torch.int64])
        self.host_copy = self.lengths is not None and r.random() < 0.5

        self.use_pool = r.random() < 0.6
        self.pool_dtype = r.choice([torch.float32, torch.bfloat16])
        P = 2 * N + 2
        slot_pad = r.choice([0, 8])
        gen = torch.Generator().manual_seed(seed + 7)
        self.pool_base = (0.1 * torch.randn(P, self.per + slot_pad, generator=gen)).to(self.pool_dtype)
        self.slots = [s if r.random() < 0.8 else -1 for s in r.sample(range(P), N)]
        self.has = [r.random() < 0.7 for _ in range(N)] if r.random() < 0.5 else None
        self.index_dtype = r.choice([torch.int32, torch.int64])

        self.interval = 16 * r.choice([1, 2, 4]) if r.random() < 0.5 else 0
        self.ck_dtype = r.choice([torch.float32, torch.bfloat16])
        self.value_major = r.random() < 0.5
        lens = self.lengths if self.lengths is not None else [T] * B
        self.entries = sum(math.ceil(n / self.interval) for n in lens) if self.interval else 0
        entry = (HV, V, K) if self.value_major else (HV, K, V)
        self.ck_shape = (max(self.entries, 1) + 1, *entry)  # one spare entry at least

    def _common(self, device):
        p = self.p
        return dict(A_log=p["A_log"].to(device), dt_bias=p["dt_bias"].to(device), lower_bound=self.lower_bound,
                    **backend_kw(device))

    def _checkpoints(self, device):
        ck = torch.full(self.ck_shape, 7.0, dtype=self.ck_dtype, device=device)
        kw = {}
        if self.interval:
            kw = dict(checkpoints=ck, checkpoint_interval=self.interval, checkpoints_value_major=self.value_major)
        return ck, kw

    def engine_kwargs(self):
        """The engine's forms on the call's device as flash_kda.fwd's keyword
        arguments, not yet called, and what the call may write: out, the whole pool
        buffer or final_state (states) and the whole checkpoint buffer."""
        dev, p = self.device, self.p
        t = token_inputs(p, self.pad, dev)
        kw = {}
        if self.lengths is not None:
            kw["cu_seqlens"] = p["cu_seqlens"].to(dev, self.cu_dtype)
            if self.host_copy:
                kw["cu_seqlens_host"] = p["cu_seqlens"].clone()  # int64 on the CPU, whatever the device
        pool_base = self.pool_base.to(dev, copy=True)
        if self.use_pool:
            pool = pool_base[:, :self.per].view(-1, *self.state_shape[1:])  # slots slot_pad elements apart
            kw.update(state_pool=pool, state_indices=torch.tensor(self.slots, dtype=self.index_dtype, device=dev))
            if self.has is not None:
                kw["has_initial_state"] = torch.tensor(self.has, device=dev)
        ck, ck_kw = self._checkpoints(dev)
        kw.update(ck_kw)
        out = torch.full(p["v"].shape, float("nan"), dtype=torch.bfloat16, device=dev)
        dense_in = None if self.use_pool else p["initial_state"].to(dev)
        fin = None if self.use_pool else torch.full(self.state_shape, float("nan"), device=dev)
        kwargs = dict(q=t["q"], k=t["k"], v=t["v"], g=t["g"], beta=t["beta"], scale=self.scale, out=out,
                      initial_state=dense_in, final_state=fin, **self._common(dev), **kw)
        return kwargs, SimpleNamespace(out=out, states=pool_base if self.use_pool else fin, checkpoints=ck)

    def engine(self):
        """The engine's forms on the call's device: (out, the whole pool buffer or
        final_state, the whole checkpoint buffer)."""
        kwargs, written = self.engine_kwargs()
        flash_kda.fwd(**kwargs)
        return written.out, written.states, written.checkpoints

    def glued(self, device):
        """The same call with the glue, on `device`: out, the N final states (dense,
        in the pool's dtype with a pool) and the checkpoint entries the sequences own."""
        p = self.p
        kw = {}
        if self.lengths is not None:
            kw["cu_seqlens"] = p["cu_seqlens"].to(device, torch.int64)
            if self.host_copy:
                # Where a host copy is given CUDA plans the segments on the host, else
                # on the device: the glue keeps it, so that both calls run one plan.
                kw["cu_seqlens_host"] = p["cu_seqlens"].clone()
        if self.use_pool:
            init = torch.zeros(self.state_shape, dtype=self.pool_dtype)
            for n, s in enumerate(self.slots):
                if s >= 0 and (self.has is None or self.has[n]):
                    init[n] = self.pool_base[s, :self.per].view(self.state_shape[1:])
            init = init.to(device)
            fin = torch.empty(self.state_shape, dtype=self.pool_dtype, device=device)
        else:
            init, fin = p["initial_state"].to(device), torch.empty(self.state_shape, device=device)
        ck, ck_kw = self._checkpoints(device)
        kw.update(ck_kw)
        out = torch.full(p["v"].shape, float("nan"), dtype=torch.bfloat16, device=device)
        flash_kda.fwd(*(dense_copy(p[n], device) for n in TOKEN_INPUTS), self.scale, out, initial_state=init,
                      final_state=fin, **self._common(device), **kw)
        return SimpleNamespace(out=out, final=fin, checkpoints=ck[:self.entries])

    def scattered(self, final):
        """The pool after the glued call: each sequence's final state in its slot, by hand."""
        expect = self.pool_base.to(final.device, copy=True)
        for n, s in enumerate(self.slots):
            if s >= 0:
                expect[s, :self.per] = final[n].reshape(-1)
        return expect


def forward_forms_are_the_glued_call(seed, device, head_dims):
    """Draws a forward, runs it in the engine's forms and glued on `device`, and
    asserts the two are bitwise equal and nothing else was written. Returns the
    call and the glued results."""
    c = ForwardCall(seed, device, head_dims)
    out, states, ck = c.engine()
    g = c.glued(device)
    if device == "cuda":
        flash_kda.check_device_faults()  # every device-resident boundary and index was valid
    assert torch.equal(out, g.out), "out"
    if c.use_pool:
        assert torch.equal(states, c.scattered(g.final)), "the pool: sequences' slots, and nothing else"
    else:
        assert torch.equal(states, g.final), "final_state"
    if c.interval:
        assert torch.equal(ck[:c.entries], g.checkpoints), "checkpoints"
        assert torch.all(ck[c.entries:] == 7.0), "spare checkpoint entries"
    return c, g


# ---- decode -------------------------------------------------------------------------

class DecodeStep:
    """A drawn decode step (its inputs kept on the CPU): the engine's forms on its
    device, and the glued step on any device."""

    def __init__(self, seed, device, head_dims):
        r = random.Random(seed)
        self.device = device
        N = r.randint(1, 4)
        self.verify = r.random() < 0.4
        S = r.randint(1, 3) if self.verify else 0
        self.lengths = [r.randint(1, 1 + S) for _ in range(N)] if (self.verify or r.random() < 0.5) else None
        P = N * (2 + S) + 2
        H = r.choice([1, 2])
        # At these sizes (a few (sequence, value head) pairs) CUDA runs views and
        # dense tokens on the same latency kernel: far below where decode copies
        # views dense or picks a bandwidth kernel, so the two forms stay bitwise.
        p = self.p = make_decode(N=N, t=1, H=H, HV=H * r.choice([1, 2]), K=r.choice(head_dims), P=P,
                                 seqlens=self.lengths, state_dtype=r.choice([torch.float32, torch.bfloat16]),
                                 seed=seed)
        T, HV, V = p["v"].shape
        K = p["q"].shape[-1]
        self.state_dtype = p["pool"].dtype
        self.slot_shape = (HV, V, K)
        self.per_token_shape = (T, HV, V, K)
        self.index_dtype = r.choice([torch.int32, torch.int64])
        free = list(range(P))
        r.shuffle(free)
        self.cols = cols = 1 + S
        idx = torch.tensor([[free.pop() if (c > 0 or r.random() < 0.85) else -1 for c in range(cols)]
                            for _ in range(N)], dtype=self.index_dtype)
        if self.verify:
            acc = torch.tensor([r.randint(1, cols) for _ in range(N)], dtype=self.index_dtype)
            for n in range(N):  # a row that starts from a slot must have one there
                if idx[n, int(acc[n]) - 1] < 0:
                    idx[n, int(acc[n]) - 1] = free.pop()
        else:
            acc = None
        self.idx, self.acc = idx, acc

        self.per = per = HV * V * K
        slot_pad = r.choice([0, 8])
        self.base = torch.zeros(P, per + slot_pad, dtype=self.state_dtype)
        self.base[:, :per] = p["pool"].reshape(P, per)
        self.base[:, per:] = 3.0
        self.out_pool = not self.verify and r.random() < 0.3  # verify writes each token's state to its slots
        self.per_token = not self.verify and r.random() < 0.3
        self.pad = fused_pad(p, r, device) if r.random() < 0.6 else None
        self.cu_dtype = r.choice([torch.int32, torch.int64]) if self.lengths is not None else None

    def _kwargs(self, t, pool, idx, device, cu_seqlens, state_out_pool, per_token_states):
        """flash_kda.decode's keyword arguments for these forms."""
        p = self.p
        # A padding entry's out rows are not written: both forms start from the same bytes.
        out = torch.full(p["v"].shape, 9.0, dtype=torch.bfloat16, device=device)
        acc = None if self.acc is None else self.acc.to(device)
        return dict(q=t["q"], k=t["k"], v=t["v"], g=t["g"], beta=t["beta"], A_log=p["A_log"].to(device),
                    dt_bias=p["dt_bias"].to(device), state_pool=pool, state_indices=idx, out=out, scale=p["scale"],
                    lower_bound=p["lower_bound"], cu_seqlens=cu_seqlens, num_accepted_tokens=acc,
                    state_out_pool=state_out_pool, per_token_states=per_token_states)

    def slots_of(self, buf):
        """The slots of a pool buffer (rows of per + slot_pad elements) as [P, HV, V, K]."""
        return buf[:, :self.per].view(-1, *self.slot_shape)

    def _per_token_states(self, device):
        if not self.per_token:
            return None
        return torch.full(self.per_token_shape, 7.0, dtype=self.state_dtype, device=device)

    def engine_kwargs(self):
        """The engine's forms on the step's device as flash_kda.decode's keyword
        arguments, not yet called, and the buffers behind them: the whole pool and
        output pool buffers (base, out_base), the per-token states and the block table."""
        dev, p = self.device, self.p
        table = torch.full((self.idx.shape[0], self.cols + 2), 99, dtype=self.index_dtype)
        table[:, :self.cols] = self.idx
        table = table.to(dev)
        idx_view = table[:, :self.cols] if self.verify else table[:, 0]  # strided, as an engine's block table
        base = self.base.to(dev, copy=True)
        out_base = torch.full_like(base, 5.0) if self.out_pool else None
        per_token = self._per_token_states(dev)
        t = token_inputs(p, self.pad, dev)
        cu = None if self.lengths is None else p["cu_seqlens"].to(dev, self.cu_dtype)
        out_pool = None if out_base is None else self.slots_of(out_base)
        kwargs = self._kwargs(t, self.slots_of(base), idx_view, dev, cu, out_pool, per_token)
        return kwargs, SimpleNamespace(out=kwargs["out"], base=base, out_base=out_base, per_token=per_token,
                                       table=table)

    def engine(self):
        """The engine's forms on the step's device: out, the whole pool and output
        pool buffers, the per-token states and the block table."""
        kwargs, e = self.engine_kwargs()
        flash_kda.decode(**kwargs)
        return e

    def glued(self, device):
        """The same step with the glue, on `device`: out, the pool, the output pool
        and the per-token states (None where the step has none)."""
        p = self.p
        pool = dense_copy(self.base[:, :self.per], device).view(-1, *self.slot_shape)
        out_pool = torch.full_like(pool, 5.0) if self.out_pool else None
        per_token = self._per_token_states(device)
        idx = (self.idx if self.verify else self.idx[:, 0]).contiguous().to(device)
        t = {n: dense_copy(p[n], device) for n in TOKEN_INPUTS}
        cu = None if self.lengths is None else p["cu_seqlens"].to(device, torch.int64)
        out = flash_kda.decode(**self._kwargs(t, pool, idx, device, cu, out_pool, per_token))
        return SimpleNamespace(out=out, pool=pool, out_pool=out_pool, per_token=per_token)


def decode_forms_are_the_glued_step(seed, device, head_dims):
    """Draws a decode step, runs it in the engine's forms and glued on `device`, and
    asserts the two are bitwise equal and nothing else was written. Returns the
    step and the glued results."""
    s = DecodeStep(seed, device, head_dims)
    e = s.engine()
    g = s.glued(device)
    if device == "cuda":
        flash_kda.check_device_faults()  # every device-resident boundary, index and count was valid
    before = s.base.to(device)
    assert torch.equal(e.out, g.out), "out"
    assert torch.equal(s.slots_of(e.base), g.pool), "the pool's slots"
    assert torch.equal(e.base[:, s.per:], before[:, s.per:]), "the padding between slots"
    if e.out_base is not None:
        assert torch.equal(s.slots_of(e.out_base), g.out_pool), "the output pool"
        assert torch.all(e.out_base[:, s.per:] == 5.0), "the output pool's padding"
    if e.per_token is not None:
        assert torch.equal(e.per_token, g.per_token), "per-token states"
    assert torch.all(e.table[:, s.cols:] == 99), "the block table's other columns"
    return s, g
