"""What one rounding in the chunk step costs, against the float64 token recurrence.

A float64 NumPy model of the chunk-16 algorithm (spec section 3, the WY form the
kernels use) in which the state update's operands can be rounded the way the
recurrence kernel rounds them, one switch at a time. It answers questions such as
"may K_res enter the update as one bf16 instead of hi + lo?" before a kernel is
written. Everything not named by the mode is exact; the state is rounded to fp32
after each chunk and its bf16 image feeds w·Sᵀ and Q_dec·Sᵀ, as in the kernel.

    python3 tools/rounding_study.py [--T 1024] [--dim 128] [--seeds 4]

Modes of the update S·diag(2^G_last) + Uᵀ K_res:
    exact        in float64
    hilo         Uᵀ and K_res as bf16 hi + lo: hi·hi + lo·hi + hi·lo (the kernel's)
    kres_single  K_res as one bf16: hi·hi + lo·hi
    u_single     Uᵀ as one bf16: hi·hi + hi·lo
Inputs: the spec's distribution (section 2), and the degenerate class (near-
collinear keys, b → 1, almost no decay) that the GPU tests hold to 1e-2.
"""
import argparse

import numpy as np

LOG2E = 1.4426950408889634


def bf16(x):
    """Round to the nearest bf16 (ties to even), returned as float64."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32).astype(np.float64)


def hilo(x):
    hi = bf16(x)
    return hi, bf16(x - hi)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def make_inputs(T, K, V, seed, degenerate):
    r = np.random.default_rng(seed)
    q, k = bf16(r.standard_normal((T, K))), bf16(r.standard_normal((T, K)))
    v, g, beta = bf16(r.standard_normal((T, V))), bf16(r.standard_normal((T, K))), bf16(r.standard_normal(T))
    A_log, dt_bias = float(np.float32(r.uniform())), r.uniform(size=K).astype(np.float32).astype(np.float64)
    S0 = (0.1 * r.standard_normal((V, K))).astype(np.float32).astype(np.float64)
    if degenerate:
        k = bf16(np.tile(r.standard_normal(K), (T, 1)) + 1e-2 * r.standard_normal((T, K)))
        beta, g = bf16(np.full(T, 8.0)), bf16(np.full((T, K), -20.0))
    return q, k, v, g, beta, A_log, dt_bias, S0


def activations(q, k, g, beta, A_log, dt_bias, lower_bound):
    qn = q / np.sqrt((q * q).sum(1, keepdims=True) + 1e-6)
    kn = k / np.sqrt((k * k).sum(1, keepdims=True) + 1e-6)
    return qn, kn, lower_bound * sigmoid(np.exp(A_log) * (g + dt_bias)), sigmoid(beta)


def token_recurrence(q, k, v, g, beta, A_log, dt_bias, S0, scale, lower_bound):
    qn, kn, a, b = activations(q, k, g, beta, A_log, dt_bias, lower_bound)
    S, out = S0.copy(), np.empty_like(v)
    for t in range(len(q)):
        S = S * np.exp(a[t])[None, :]
        S = S + b[t] * np.outer(v[t] - S @ kn[t], kn[t])
        out[t] = scale * S @ qn[t]
    return out, S


def chunked(q, k, v, g, beta, A_log, dt_bias, S0, scale, lower_bound, mode):
    qn, kn, a, b = activations(q, k, g, beta, A_log, dt_bias, lower_bound)
    S, out = S0.copy(), np.empty_like(v)
    for c0 in range(0, len(q), 16):
        c = slice(c0, min(c0 + 16, len(q)))
        G = np.cumsum(a[c] * LOG2E, 0)
        K_dec, Q_dec, K_inv = kn[c] * 2**G, scale * qn[c] * 2**G, kn[c] * 2**-G
        K_res = K_inv * 2**G[-1]
        bc = b[c][:, None]
        L = np.tril(K_dec @ K_inv.T, -1) * bc
        INV = np.linalg.inv(np.eye(len(L)) + L)
        w, u = INV @ (bc * K_dec), INV @ (bc * v[c])
        S_img = bf16(S)
        U = u - w @ S_img.T
        out[c] = Q_dec @ S_img.T + np.tril(Q_dec @ K_inv.T) @ U
        (Uh, Ul), (Kh, Kl) = hilo(U), hilo(K_res)
        update = {"exact": lambda: U.T @ K_res,
                  "hilo": lambda: Uh.T @ Kh + Ul.T @ Kh + Uh.T @ Kl,
                  "kres_single": lambda: Uh.T @ Kh + Ul.T @ Kh,
                  "u_single": lambda: Uh.T @ Kh + Uh.T @ Kl}[mode]()
        S = (S * 2**G[-1][None, :] + update).astype(np.float32).astype(np.float64)
    return out, S


def rel_rms(x, ref):
    return float(np.sqrt(((x - ref) ** 2).sum() / (ref**2).sum()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--seeds", type=int, default=4)
    args = ap.parse_args()
    K = V = args.dim
    for degenerate in (False, True):
        errors = {}
        for seed in range(args.seeds):
            x = make_inputs(args.T, K, V, seed, degenerate)
            ref_out, ref_S = token_recurrence(*x, K**-0.5, -5.0)
            for mode in ("exact", "hilo", "kres_single", "u_single"):
                out, S = chunked(*x, K**-0.5, -5.0, mode)
                errors.setdefault(mode, []).append((rel_rms(bf16(out), ref_out), rel_rms(S, ref_S)))
        print(f"{'degenerate keys' if degenerate else 'spec inputs'}, T = {args.T}, K = V = {K}, "
              f"{args.seeds} seeds, worst relative RMS (out as bf16 / fp32 state):")
        for mode, e in errors.items():
            e = np.array(e)
            print(f"  {mode:12s} out {e[:, 0].max():.2e}  state {e[:, 1].max():.2e}")


if __name__ == "__main__":
    main()
