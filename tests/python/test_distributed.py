"""flash_kda.distributed.cp_fwd on CPU tensors over gloo, with 2 and 3 processes:
every rank's out and the final states (on the rank holding each sequence's end)
equal the single-process forward of the whole batch to fp32 rounding: out and bf16
states within one bf16 ulp, fp32 states within 1e-5 relative RMS. Cases: one long sequence split
evenly and unevenly, a rank holding only a middle piece, varlen with sequences
crossing shard boundaries and an empty sequence, an empty shard, with and without
an initial state, fp32 and bf16 states, GVA, K = V (summaries from two forwards, the
CUDA path's construction) and K != V (from segment_summaries), g as the log decay (with decays of
e^-60 and e^-1000 a token) and beta as b. Plus the piece bookkeeping itself (no processes)."""
from __future__ import annotations

import datetime
import os
import tempfile

import pytest
import torch

import flash_kda
from flash_kda.distributed import shard_pieces
from kda_reference import make_log_decay_problem, make_problem

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available in this torch build", allow_module_level=True)

# (name, seqlens, shard sizes per world size, state dtype: None = no initial state, fp32
# final; V: K = V = 32 takes the summaries from two forwards, as on CUDA; V = 16 from
# segment_summaries; optionally "log decay": use_gate_in_kernel=False and
# use_beta_sigmoid_in_kernel=False, strong decays on two key channels)
CASES = [
    ("one sequence, even", [300], {2: [150, 150], 3: [100, 100, 100]}, torch.float32, 32),
    ("one sequence, uneven", [300], {2: [37, 263], 3: [20, 250, 30]}, torch.float32, 32),
    ("varlen crossing", [70, 0, 33, 128, 5], {2: [100, 136], 3: [50, 100, 86]}, torch.float32, 32),
    ("varlen, no initial state", [70, 0, 33, 128, 5], {2: [71, 165], 3: [16, 200, 20]}, None, 32),
    ("varlen, bf16 states", [70, 0, 33, 128, 5], {2: [100, 136], 3: [50, 100, 86]}, torch.bfloat16, 32),
    ("empty shard", [90, 40], {2: [0, 130], 3: [65, 0, 65]}, torch.float32, 32),
    ("K != V", [70, 0, 33, 128, 5], {2: [100, 136], 3: [50, 100, 86]}, torch.float32, 16),
    # Many pieces a rank: only each rank's last piece crosses to the next.
    ("many short sequences", [7, 19, 0, 33, 16, 5, 40, 2, 11, 29, 3, 23], {2: [90, 98], 3: [60, 64, 64]},
     torch.float32, 32),
    ("log decay, beta as b", [70, 0, 33, 128, 5], {2: [100, 136], 3: [50, 100, 86]}, torch.float32, 32,
     "log decay"),
]
OUT_ULPS = 1
STATE_BAR = 1e-5


def bf16_ulps(a, b):
    """Elementwise distance in units of the bf16 spacing at the larger magnitude."""
    a, b = a.float(), b.float()
    mag = torch.maximum(a.abs(), b.abs()).clamp_min(2.0 ** -126)
    ulp = torch.exp2(torch.floor(torch.log2(mag)) - 7)
    return ((a - b).abs() / ulp).max().item()


def _worker(rank, world, init_file, errors):
    # A rank that fails must not leave the others waiting in a collective for long.
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        for name, seqlens, shards, state_dtype, V, *gate in CASES:
            fin_dtype = state_dtype or torch.float32
            shape = dict(H=2, HV=4, K=32, V=V, seqlens=seqlens, seed=len(name), state_dtype=state_dtype,
                         final_dtype=fin_dtype)
            if gate:
                p = make_log_decay_problem(strong=((0, -60.0), (5, -1000.0)), **shape)
            else:
                p = make_problem(**shape)
            forms = {f: p[f] for f in ("use_gate_in_kernel", "use_beta_sigmoid_in_kernel") if f in p}
            # The straight single-process run of the whole batch.
            out_ref = torch.empty_like(p["v"])
            fin_ref = torch.empty(len(seqlens), 4, V, 32, dtype=fin_dtype)
            flash_kda.fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out_ref, A_log=p["A_log"],
                          dt_bias=p["dt_bias"], lower_bound=p["lower_bound"], initial_state=p["initial_state"],
                          final_state=fin_ref, cu_seqlens=p["cu_seqlens"], backend="cpu", **forms)
            sizes = shards[world]
            lo = sum(sizes[:rank])
            sl = slice(lo, lo + sizes[rank])
            x = {key: p[key][:, sl].contiguous() for key in ("q", "k", "v", "g", "beta")}
            out = torch.full_like(x["v"], float("nan"))
            fin = torch.full((len(seqlens), 4, V, 32), float("nan"), dtype=fin_dtype)
            # Initial states of any strides (the same values), and a final_state that
            # requires grad (written as fwd writes it).
            init = p["initial_state"]
            if init is not None:
                init = init.transpose(2, 3).contiguous().transpose(2, 3)
            fin.requires_grad_(fin_dtype == torch.float32)
            owned = flash_kda.distributed.cp_fwd(
                x["q"], x["k"], x["v"], x["g"], x["beta"], p["scale"], out, A_log=p["A_log"], dt_bias=p["dt_bias"],
                lower_bound=p["lower_bound"], cu_seqlens=p["cu_seqlens"], initial_state=init,
                final_state=fin, backend="cpu", **forms)
            fin = fin.detach()
            if out.numel():
                u = bf16_ulps(out, out_ref[:, sl])
                if not u <= OUT_ULPS:
                    errors.append(f"{name}, world {world}, rank {rank}: out differs by {u:.1f} bf16 ulps")
            cu = p["cu_seqlens"].tolist()
            for n in range(len(seqlens)):
                end_here = (lo < cu[n + 1] <= lo + sizes[rank]) if cu[n + 1] > cu[n] else n in owned
                if end_here != (n in owned):
                    errors.append(f"{name}, world {world}, rank {rank}: sequence {n} owned={n in owned}, "
                                  f"expected {end_here}")
                if n in owned and fin_dtype == torch.bfloat16:
                    u = bf16_ulps(fin[n], fin_ref[n])
                    if not u <= OUT_ULPS:
                        errors.append(f"{name}, world {world}, rank {rank}: bf16 final state {n}: {u:.1f} ulps")
                elif n in owned:
                    e = ((fin[n] - fin_ref[n]).norm() / fin_ref[n].norm().clamp_min(1e-30)).item()
                    if not e <= STATE_BAR:
                        errors.append(f"{name}, world {world}, rank {rank}: final state {n} rel RMS {e:.2e}")
                elif not torch.isnan(fin[n]).all():
                    errors.append(f"{name}, world {world}, rank {rank}: final state {n} written by a non-owner")
            # Every sequence's final state has exactly one owner across the ranks.
            count = torch.zeros(len(seqlens), dtype=torch.int64)
            for n in owned:
                count[n] += 1
            dist.all_reduce(count)
            if rank == 0 and not torch.equal(count, torch.ones_like(count)):
                errors.append(f"{name}, world {world}: final-state owners per sequence {count.tolist()}")
    finally:
        dist.destroy_process_group()


def _run(rank, world, init_file, result_dir, worker=None):
    errors = []
    try:
        (worker or _worker)(rank, world, init_file, errors)
    except Exception as e:  # report, do not hang the others
        errors.append(f"rank {rank}: {type(e).__name__}: {e}")
    with open(os.path.join(result_dir, f"rank{rank}.txt"), "w") as f:
        f.write("\n".join(errors))


@pytest.mark.parametrize("world", [2, 3])
def test_cp_fwd_equals_the_single_process_forward(world):
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        init_file = os.path.join(d, "init")
        mp.spawn(_run, args=(world, init_file, d), nprocs=world, join=True)
        errors = []
        for r in range(world):
            with open(os.path.join(d, f"rank{r}.txt")) as f:
                errors += [line for line in f.read().splitlines() if line]
    assert not errors, "\n".join(errors)


def test_shard_pieces():
    # Sequences [0,70) [70,70) [70,103) [103,231) [231,236); shards [0,50) [50,150) [150,236).
    cu = [0, 70, 70, 103, 231, 236]
    pieces = shard_pieces(cu, [0, 50, 150, 236])
    assert pieces == [[(0, 0, 50)],
                      [(0, 50, 70), (1, 70, 70), (2, 70, 103), (3, 103, 150)],
                      [(3, 150, 231), (4, 231, 236)]]
    # An empty shard holds nothing; an empty sequence at the very end goes to the last rank.
    assert shard_pieces([0, 10, 10], [0, 10, 10]) == [[(0, 0, 10)], [(1, 10, 10)]]
    assert shard_pieces([0, 5, 10], [0, 5, 5, 10]) == [[(0, 0, 5)], [], [(1, 5, 10)]]
    # Every token of every rank is covered once, in order.
    for cu, starts in [([0, 300], [0, 37, 300]), (cu, [0, 16, 216, 236]), ([0, 0, 5, 5], [0, 3, 5])]:
        for r, ps in enumerate(shard_pieces(cu, starts)):
            assert [b for _, b, _ in ps[:1]] in ([starts[r]], []) and (not ps or ps[-1][2] == starts[r + 1])
            assert all(ps[i][2] == ps[i + 1][1] for i in range(len(ps) - 1))


def test_shard_pieces_bad_arguments_are_named():
    for cu, starts, err, match in [
            ([0, 10], [], ValueError, r"^shard_starts: expected \[M\+1\] boundaries"),
            ([0, 10], [0], ValueError, r"^shard_starts: expected \[M\+1\] boundaries"),
            ([0, 10], [0, 7, 3, 10], ValueError, r"^shard_starts: expected 0 = shard_starts\[0\] <= "),
            ([0, 12, 10], [0, 10], ValueError, r"^cu_seqlens: expected 0 = cu_seqlens\[0\] <= "),
            ([0, 10], [0, 5, 8], ValueError, r"^shard_starts: the shards end at 8, the sequences at 10"),
            ([0, 7.5, 10], [0, 10], TypeError, r"^cu_seqlens: expected ints, got 7.5"),
            (5, [0, 10], TypeError, r"^cu_seqlens: expected a 1-d int tensor or a list of ints, got int")]:
        with pytest.raises(err, match=match):
            shard_pieces(cu, starts)


def test_cp_fwd_names_bad_arguments_before_any_collective():
    # Checked on each rank before the first collective (no process group is needed
    # to see them): a final_state that would be written wrongly (a broadcast view,
    # int64, another shape), an initial_state of another dtype or length, boundaries
    # that are not ints.
    p = make_problem(H=2, HV=4, K=32, seqlens=[20, 13], seed=7, state_dtype=torch.float32)
    out = torch.empty_like(p["v"])
    good_state = torch.zeros(2, 4, 32, 32)

    def call(**kw):
        args = dict(A_log=p["A_log"], dt_bias=p["dt_bias"], cu_seqlens=p["cu_seqlens"], final_state=good_state)
        args.update(kw)
        return flash_kda.distributed.cp_fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], out, **args)

    cases = [
        (dict(final_state=torch.zeros(1, 4, 32, 32).expand(2, 4, 32, 32)), ValueError,
         r"^final_state: expected a C-contiguous tensor"),
        (dict(final_state=torch.zeros(2, 4, 32, 32, dtype=torch.int64)), TypeError, r"^final_state: expected dtype"),
        (dict(final_state=torch.zeros(2, 2, 4, 32, 32)), ValueError, r"^final_state: expected shape \[N, HV, V, K\]"),
        (dict(final_state=torch.zeros(3, 4, 32, 32)), ValueError, r"^final_state: expected shape"),
        (dict(final_state=torch.zeros(2, 4, 32, 32, device="meta")), ValueError,
         r"^final_state: expected a tensor on the device of q"),
        (dict(initial_state=torch.zeros(2, 4, 32, 32, dtype=torch.float16)), TypeError,
         r"^initial_state: expected dtype"),
        (dict(initial_state=torch.zeros(5, 4, 32, 32)), ValueError, r"^initial_state: expected shape"),
        (dict(cu_seqlens=[0, 19.9, 33]), TypeError, r"^cu_seqlens: expected ints"),
        (dict(cu_seqlens=None), TypeError, r"^cu_seqlens: expected the global boundaries"),
        (dict(cu_seqlens=[0, 20, 13]), ValueError, r"^cu_seqlens: expected 0 = cu_seqlens\[0\] <="),
    ]
    for kw, err, match in cases:
        with pytest.raises(err, match=match):
            call(**kw)
    with pytest.raises(TypeError, match=r"^q: expected a torch.Tensor, got NoneType"):
        flash_kda.distributed.cp_fwd(None, p["k"], p["v"], p["g"], p["beta"], p["scale"], out, A_log=p["A_log"],
                                     dt_bias=p["dt_bias"], cu_seqlens=p["cu_seqlens"])
    with pytest.raises(ValueError, match=r"^v: expected this rank's shard as \[1, T_r, heads, dim\]"):
        flash_kda.distributed.cp_fwd(p["q"], p["k"], p["v"][0], p["g"], p["beta"], p["scale"], out,
                                     A_log=p["A_log"], dt_bias=p["dt_bias"], cu_seqlens=p["cu_seqlens"])
    # The final states are written after the rank's forward: one that shares memory
    # with out (or an input) would corrupt it or be corrupted.
    buf = torch.zeros(2 * 4 * 32 * 32, dtype=torch.bfloat16)
    shared_out = buf[:out.numel()].view(out.shape)
    with pytest.raises(ValueError, match=r"^final_state: shares memory with out"):
        flash_kda.distributed.cp_fwd(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], shared_out,
                                     A_log=p["A_log"], dt_bias=p["dt_bias"], cu_seqlens=p["cu_seqlens"],
                                     final_state=buf.view(2, 4, 32, 32))
    with pytest.raises(ValueError, match=r"^q: expected a tensor in CPU or CUDA memory, got one on device meta"):
        flash_kda.distributed.cp_fwd(p["q"].to("meta"), p["k"], p["v"], p["g"], p["beta"], p["scale"], out,
                                     A_log=p["A_log"], dt_bias=p["dt_bias"], cu_seqlens=p["cu_seqlens"],
                                     initial_state=good_state)
    with pytest.raises(ValueError, match=r"^cu_seqlens: expected a tensor in CPU or CUDA memory, got one on device"):
        call(cu_seqlens=p["cu_seqlens"].to("meta"))


# Arguments that fail on some ranks: each case a shard split [90 | 40] of two sequences,
# an edit of the arguments on the ranks listed, and what each rank must raise (type,
# message start). No rank may wait for the others in a later collective.
ERROR_CASES = [
    # The same bad value on every rank, rank 1's shard empty (no pieces, no summaries call).
    ("lower_bound everywhere, empty shard", (130, 0), {0: dict(lower_bound=0.5), 1: dict(lower_bound=0.5)},
     {0: (ValueError, "lower_bound: expected a finite value in [-5, 0)"),
      1: (ValueError, "lower_bound: expected a finite value in [-5, 0)")}),
    ("k on one rank", (90, 40), {0: dict(k_dtype=torch.float32)},
     {0: (TypeError, "k: expected dtype"), 1: (RuntimeError, "cp_fwd: rank(s) [0] of the group rejected")}),
    ("final_state on one rank", (90, 40), {1: dict(final_state_shape=(3, 4, 32, 32))},
     {0: (RuntimeError, "cp_fwd: rank(s) [1] of the group rejected"), 1: (ValueError, "final_state: expected shape")}),
    ("other boundaries on one rank", (90, 40), {1: dict(cu=[0, 120, 130])},
     {0: (ValueError, "cu_seqlens: expected the same global boundaries on every rank; rank(s) [1]"),
      1: (ValueError, "cu_seqlens: expected the same global boundaries on every rank; rank(s) [1]")}),
    # What must agree beyond the boundaries: each would give wrong answers on some ranks.
    ("another head dim on one rank", (90, 40), {1: dict(head_dim=16)},
     {0: (ValueError, "q: expected the same head dim on every rank; rank(s) [1]"),
      1: (ValueError, "q: expected the same head dim on every rank; rank(s) [1]")}),
    ("another scale on one rank", (90, 40), {0: dict(scale=0.5)},
     {0: (ValueError, "scale: expected the same value on every rank; rank(s) [1]"),
      1: (ValueError, "scale: expected the same value on every rank; rank(s) [1]")}),
    ("an initial state on one rank only", (90, 40), {1: dict(initial_state=True)},
     {0: (ValueError, "initial_state: expected the same presence and dtype on every rank; rank(s) [1]"),
      1: (ValueError, "initial_state: expected the same presence and dtype on every rank; rank(s) [1]")}),
]
ERROR_DEADLINE_S = 20.0  # the group's timeout is 120 s: a rank left waiting would pass it


def _error_worker(rank, world, init_file, errors):
    import time

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        for name, sizes, edits, expect in ERROR_CASES:
            p = make_problem(H=2, HV=4, K=32, seqlens=[90, 40], seed=3, state_dtype=torch.float32)
            edit = edits.get(rank, {})
            lo = sum(sizes[:rank])
            x = {key: p[key][:, lo:lo + sizes[rank]].contiguous() for key in ("q", "k", "v", "g", "beta")}
            if "k_dtype" in edit:
                x["k"] = x["k"].to(edit["k_dtype"])
            K = edit.get("head_dim", 32)
            dt_bias = p["dt_bias"]
            if K != 32:  # every argument of this rank consistent with K, the other rank's not
                x.update({key: x[key][..., :K].contiguous() for key in ("q", "k", "g")})
                dt_bias = dt_bias[:, :K].contiguous()
            fin = torch.zeros(edit.get("final_state_shape", (2, 4, 32, K)))
            init = torch.zeros(2, 4, 32, K) if edit.get("initial_state") else None
            t0 = time.monotonic()
            try:
                flash_kda.distributed.cp_fwd(
                    x["q"], x["k"], x["v"], x["g"], x["beta"], edit.get("scale", p["scale"]),
                    torch.empty_like(x["v"]), A_log=p["A_log"], dt_bias=dt_bias,
                    lower_bound=edit.get("lower_bound", -5.0), cu_seqlens=edit.get("cu", p["cu_seqlens"]),
                    initial_state=init, final_state=fin, backend="cpu")
                errors.append(f"{name}, rank {rank}: no error")
            except Exception as e:
                want_type, want_msg = expect[rank]
                if type(e) is not want_type or not str(e).startswith(want_msg):
                    errors.append(f"{name}, rank {rank}: {type(e).__name__}: {e}; expected {want_type.__name__}: "
                                  f"{want_msg}")
            took = time.monotonic() - t0
            if took > ERROR_DEADLINE_S:
                errors.append(f"{name}, rank {rank}: took {took:.1f} s (a rank waited for the others)")
            dist.barrier()  # the next case starts together
    finally:
        dist.destroy_process_group()


def test_cp_fwd_ranks_raise_together():
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        init_file = os.path.join(d, "init")
        mp.spawn(_run, args=(2, init_file, d, _error_worker), nprocs=2, join=True)
        errors = []
        for r in range(2):
            with open(os.path.join(d, f"rank{r}.txt")) as f:
                errors += [line for line in f.read().splitlines() if line]
    assert not errors, "\n".join(errors)
