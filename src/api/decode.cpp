// flashkda::validate_decode / decode: the decode step's argument rules, then
// dispatch. Messages name the argument and what was expected.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "api/guarded.h"
#include "api/overlap.h"
#include "api/validation_util.h"
#include "cpu/cpu_backends.h"
#include "common/sequences.h"
#include "flashkda/flashkda.h"
#include "sm90/sm90_decode.h"

namespace flashkda {
using namespace validation;

namespace {

int64_t decode_value_heads(const DecodeArgs& a) { return a.num_v_heads > 0 ? a.num_v_heads : a.num_heads; }

Status validate_decode_impl(const DecodeArgs& a, Backend backend);

}  // namespace

// No exception crosses the API (int32 boundaries are widened into a vector).
Status validate_decode(const DecodeArgs& a, Backend backend) {
  return api::guarded(backend, "validate_decode", [&] {
    const Status s = validate_decode_impl(a, backend);
    return s.ok() ? check_decode_overlaps(a) : s;
  });
}

// After validate_decode_impl: every size below fits in int64 (checked there).
Status validation::check_decode_overlaps(const DecodeArgs& a) {
  const int64_t N = a.num_seqs, T = a.total_tokens, HV = decode_value_heads(a);
  const int64_t K = a.head_dim_k, V = a.head_dim_v, slot = HV * V * K;
  const int64_t elem = dtype_bytes(a.state_dtype), index_bytes = a.index_type == IndexType::kInt64 ? 8 : 4;
  const int64_t stride = a.pool_stride == 0 ? slot : a.pool_stride;
  const int64_t out_stride = a.state_out_stride == 0 ? stride : a.state_out_stride;
  const int64_t columns = speculative_verify(a) ? a.verify_slots : 1;  // of state_indices
  // With state_out_pool the pool is only read; without it, updated in place.
  const bool in_place = a.state_out_pool == nullptr;
  const ArgBytes pool =
      row_bytes("state_pool", a.state_pool, a.pool_size, arg_bytes(a.state_pool, {slot}, elem), stride * elem);
  std::vector<ArgBytes> written = {
      dense_bytes("out", a.out, arg_bytes(a.out, {T, HV, V}, 2)),
      row_bytes("state_out_pool", a.state_out_pool, a.pool_size, arg_bytes(a.state_out_pool, {slot}, elem),
                out_stride * elem),
      dense_bytes("per_token_states", a.per_token_states, arg_bytes(a.per_token_states, {T, HV, V, K}, elem))};
  std::vector<ArgBytes> read = token_input_bytes(a, HV, N, T);
  read.push_back(dense_bytes("state_indices", a.state_indices, arg_bytes(a.state_indices, {N, columns}, index_bytes)));
  read.push_back(dense_bytes("num_accepted_tokens", a.num_accepted_tokens,
                             arg_bytes(a.num_accepted_tokens, {N}, index_bytes)));
  if (in_place) written.insert(written.begin() + 1, pool);  // out's neighbour, as the messages name it
  else read.push_back(pool);
  return check_overlaps(written, read, {{"state_out_pool", "state_pool", out_stride == stride}});
}

namespace {
Status validate_decode_impl(const DecodeArgs& a, Backend backend) {
  if (const Status s = check_backend(backend); !s.ok()) return s;
  const bool cuda = backend == Backend::kCuda;

  // ---- int32 boundaries: checked as the int64 ones they stand for --------------
  if (a.cu_seqlens_int32 != nullptr) {
    if (const Status s = check_int32_boundaries(a, 0, a.total_tokens, "total_tokens"); !s.ok()) return s;
    return validate_as_int64_boundaries(a, cuda, [&](const DecodeArgs& b) { return validate_decode_impl(b, backend); });
  }

  // ---- shapes --------------------------------------------------------------
  if (a.num_seqs < 0) return Status::Invalid(cat("num_seqs: expected a value >= 0, got ", a.num_seqs));
  if (a.num_heads < 1) return Status::Invalid(cat("num_heads: expected a value >= 1, got ", a.num_heads));
  if (a.num_v_heads < 0 || (a.num_v_heads > 0 && a.num_v_heads % a.num_heads != 0))
    return Status::Invalid(cat("num_v_heads: expected 0 (= num_heads) or a positive multiple of num_heads=",
                               a.num_heads, ", got ", a.num_v_heads));
  // Above 256 on every backend (kCuda's narrower set: check_decode_supported).
  if (const Status s = check_head_dims(a.head_dim_k, a.head_dim_v, kCpuMaxHeadDim, [] { return "the decode"; });
      !s.ok())
    return s;
  const int64_t N = a.num_seqs, H = a.num_heads, HV = decode_value_heads(a);
  const int64_t K = a.head_dim_k, V = a.head_dim_v, T = a.total_tokens;
  if (T < 0) return Status::Invalid(cat("total_tokens: expected a value >= 0, got ", T));
  if (a.cu_seqlens == nullptr) {
    if (a.tokens_per_seq < 1)
      return Status::Invalid(cat("tokens_per_seq: expected a value >= 1, got ", a.tokens_per_seq));
    int64_t nt = 0;
    if (!mul_ok(N, a.tokens_per_seq, &nt) || nt != T)
      return Status::Invalid(cat("total_tokens: expected num_seqs * tokens_per_seq = ", N, " * ",
                                 a.tokens_per_seq, ", got ", T));
  }
  // What g and beta hold, and their dtypes (which the sizes below depend on).
  if (const Status s = check_gate_inputs(a); !s.ok()) return s;
  const bool safe_gate = a.gate_form == GateForm::kSafeGate;
  int64_t per_slot = 0, n_qk = 0, n_v = 0, n_g = 0, n_beta = 0, n_tok_states = 0;
  if (!tensor_fits({HV, V, K}, 4, &per_slot) || !tensor_fits({T, H, K}, 2, &n_qk) ||
      !tensor_fits({T, HV, V}, 2, &n_v) || !tensor_fits({T, HV, K}, dtype_bytes(a.g_dtype), &n_g) ||
      !tensor_fits({T, HV}, dtype_bytes(a.beta_dtype), &n_beta) ||
      (a.per_token_states != nullptr && !tensor_fits({T, HV, V, K}, 4, &n_tok_states)))
    return Status::Invalid(cat("total_tokens: tensor sizes overflow int64 (total_tokens=", T, ", num_v_heads=", HV,
                               ", head_dim_k=", K, ", head_dim_v=", V, ")"));
  // Strided token tensors: every backend reads them element by element.
  if (const Status s = check_token_views(a, T, H, HV, K, V, false); !s.ok()) return s;

  // ---- state pool ------------------------------------------------------------
  if (a.state_dtype != DType::kFP32 && a.state_dtype != DType::kBF16)
    return Status::Invalid(cat("state_dtype: expected kFP32 or kBF16, got ",
                               a.state_dtype == DType::kNone ? std::string("kNone")
                                                             : cat("value ", static_cast<int32_t>(a.state_dtype))));
  if (a.pool_size < 1) return Status::Invalid(cat("pool_size: expected a value >= 1, got ", a.pool_size));
  const int64_t stride = a.pool_stride == 0 ? per_slot : a.pool_stride;
  const int64_t out_stride = a.state_out_stride == 0 ? stride : a.state_out_stride;
  if (stride < per_slot)
    return Status::Invalid(cat("pool_stride: expected 0 or at least num_v_heads*head_dim_v*head_dim_k = ", per_slot,
                               " elements, got ", a.pool_stride));
  if (out_stride < per_slot)
    return Status::Invalid(cat("state_out_stride: expected 0 or at least ", per_slot, " elements, got ",
                               a.state_out_stride));
  // Element and byte counts, as validate() checks a forward's pool.
  int64_t pool_elems = 0;
  const int64_t state_bytes = a.state_dtype == DType::kBF16 ? 2 : 4;
  if (!tensor_fits({a.pool_size, stride}, state_bytes, &pool_elems) ||
      !tensor_fits({a.pool_size, out_stride}, state_bytes, &pool_elems))
    return Status::Invalid(cat("pool_size: pool_size * pool_stride elements (", a.pool_size, " * ", stride,
                               ") overflow int64 bytes"));
  if (a.index_type != IndexType::kInt32 && a.index_type != IndexType::kInt64)
    return Status::Invalid(cat("index_type: unknown value ", static_cast<int32_t>(a.index_type),
                               " (expected kInt32=0 or kInt64=1)"));
  // Checked on every backend although only kCuda reads it: a bad value is a caller bug either way.
  if (a.programmatic_dependent_launch != PdlMode::kOff && a.programmatic_dependent_launch != PdlMode::kAuto &&
      a.programmatic_dependent_launch != PdlMode::kOn)
    return Status::Invalid(cat("programmatic_dependent_launch: expected -1 (off), 0 (auto) or 1 (on), got ",
                               static_cast<int32_t>(a.programmatic_dependent_launch)));

  // ---- speculative verify ----------------------------------------------------------
  const bool verify = speculative_verify(a);
  if (a.verify_slots < 0) return Status::Invalid(cat("verify_slots: expected a value >= 0, got ", a.verify_slots));
  if (a.num_accepted_tokens != nullptr && !verify)
    return Status::Invalid("num_accepted_tokens: needs verify_slots >= 1 (state_indices [N, 1 + draft tokens])");
  if (verify) {
    if (a.state_out_pool != nullptr)
      return Status::Invalid("state_out_pool: not with verify_slots (the per-token states go to the pool's slots)");
    if (a.per_token_states != nullptr)
      return Status::Invalid("per_token_states: not with verify_slots (the per-token states go to the pool's slots)");
    int64_t n_idx = 0;
    if (!tensor_fits({N, a.verify_slots}, 8, &n_idx))
      return Status::Invalid("verify_slots: num_seqs * verify_slots overflows int64");
  }

  // ---- pointers ----------------------------------------------------------------
  struct Req {
    const char* name;
    const void* ptr;
    bool needed;
  };
  const Req required[] = {
      {"q", a.q, n_qk > 0},        {"k", a.k, n_qk > 0},         {"v", a.v, n_v > 0},
      {"g", a.g, n_g > 0},         {"beta", a.beta, T > 0},       {"out", a.out, n_v > 0},
      {"A_log", a.A_log, safe_gate}, {"dt_bias", a.dt_bias, safe_gate}, {"state_pool", a.state_pool, true},
      {"state_indices", a.state_indices, N > 0},
  };
  for (const Req& r : required)
    if (r.needed && r.ptr == nullptr) return Status::Invalid(cat(r.name, ": null pointer"));

  if (!std::isfinite(a.scale)) return Status::Invalid(cat("scale: expected a finite value, got ", a.scale));
  // The same rule as the forward: the chunked prefill and this decode share states
  // (and lower_bound is not read with a given log decay).
  if (safe_gate && (!std::isfinite(a.lower_bound) || !(a.lower_bound >= -5.f && a.lower_bound < 0.f)))
    return Status::Invalid(cat("lower_bound: expected a finite value in [-5, 0), got ", a.lower_bound));

  // ---- alignment ---------------------------------------------------------------
  // The GPU kernel moves states in 16-byte vectors: pool base and strides must allow it.
  const int64_t vec_elems = cuda ? 16 / dtype_bytes(a.state_dtype) : 1;
  const uintptr_t state_align = cuda ? 16 : static_cast<uintptr_t>(dtype_bytes(a.state_dtype));
  if (!aligned(a.state_pool, state_align))
    return Status::Invalid(cat("state_pool: expected ", state_align, "-byte alignment"));
  if (a.state_out_pool != nullptr && !aligned(a.state_out_pool, state_align))
    return Status::Invalid(cat("state_out_pool: expected ", state_align, "-byte alignment"));
  if (a.per_token_states != nullptr && !aligned(a.per_token_states, state_align))
    return Status::Invalid(cat("per_token_states: expected ", state_align, "-byte alignment"));
  if (stride % vec_elems != 0 || out_stride % vec_elems != 0)
    return Status::Invalid(cat("pool_stride: expected a multiple of ", vec_elems, " elements for backend kCuda, got ",
                               stride, " / ", out_stride));
  const struct {
    const char* name;
    const void* ptr;
    uintptr_t align;
  } aligns[] = {{"q", a.q, 2},          {"k", a.k, 2},         {"v", a.v, 2},
                {"g", a.g, static_cast<uintptr_t>(dtype_bytes(a.g_dtype))},
                {"beta", a.beta, static_cast<uintptr_t>(dtype_bytes(a.beta_dtype))},
                {"out", a.out, 2},
                {"A_log", a.A_log, 4},  {"dt_bias", a.dt_bias, 4},
                {"state_indices", a.state_indices, a.index_type == IndexType::kInt64 ? 8u : 4u},
                {"num_accepted_tokens", a.num_accepted_tokens, a.index_type == IndexType::kInt64 ? 8u : 4u},
                {"cu_seqlens", a.cu_seqlens, 8},
                {"cu_seqlens_host", a.cu_seqlens_host, 8}};
  for (const auto& r : aligns)
    if (r.ptr != nullptr && !aligned(r.ptr, r.align))
      return Status::Invalid(cat(r.name, ": expected ", r.align, "-byte alignment"));

  // ---- host-visible values ------------------------------------------------------
  // On the CPU every pointer is host memory; for kCuda only the optional host copy.
  const int64_t* cu_host = cuda ? a.cu_seqlens_host : a.cu_seqlens;
  if (a.cu_seqlens == nullptr && a.cu_seqlens_host != nullptr)
    return Status::Invalid("cu_seqlens_host: given without cu_seqlens");
  if (cu_host != nullptr) {
    // Named as the caller passed it: kCuda checks the host copy.
    const char* cu = cuda ? "cu_seqlens_host" : "cu_seqlens";
    if (cu_host[0] != 0) return Status::Invalid(cat(cu, ": expected ", cu, "[0] == 0, got ", cu_host[0]));
    for (int64_t n = 0; n < N; ++n)
      if (cu_host[n + 1] < cu_host[n])
        return Status::Invalid(cat(cu, ": expected non-decreasing values, but ", cu, "[", n + 1, "]=", cu_host[n + 1],
                                   " < ", cu, "[", n, "]=", cu_host[n]));
    if (cu_host[N] != T)
      return Status::Invalid(cat(cu, ": expected ", cu, "[num_seqs] == total_tokens=", T, ", got ", cu_host[N]));
    if (!cuda) {
      const Status st = check_host_copy(a.cu_seqlens, a.cu_seqlens_host, N);
      if (!st.ok()) return st;
    }
  }
  if (!cuda && N > 0) {
    const Status s = check_slot_indices("state_indices", a.state_indices, a.index_type,
                                        verify ? N * a.verify_slots : N, a.pool_size, "a padding entry");
    if (!s.ok()) return s;
  }
  // The lengths where they are on the host (kCuda: cu_seqlens_host or uniform
  // tokens; otherwise the kernel skips the tokens past a row's slots and records
  // it), num_accepted_tokens on the CPU backends (kCuda: device memory, clamped
  // and recorded by the kernel).
  if (verify && (cu_host != nullptr || a.cu_seqlens == nullptr)) {
    for (int64_t n = 0; n < N; ++n) {
      const int64_t t0 = cu_host != nullptr ? cu_host[n] : n * a.tokens_per_seq;
      const int64_t t1 = cu_host != nullptr ? cu_host[n + 1] : t0 + a.tokens_per_seq;
      if (t1 - t0 > a.verify_slots)
        return Status::Invalid(cat("verify_slots: sequence ", n, " has ", t1 - t0, " tokens, more than its ",
                                   a.verify_slots, " slots (the columns of state_indices [N, verify_slots])"));
    }
  }
  if (!cuda && verify) {
    for (int64_t n = 0; n < N; ++n) {
      if (a.num_accepted_tokens != nullptr) {
        const int64_t acc = index_at(a.num_accepted_tokens, a.index_type, n);
        if (acc < 1 || acc > a.verify_slots)
          return Status::Invalid(cat("num_accepted_tokens: entry ", n, " is ", acc, ", expected a value in [1, ",
                                     a.verify_slots, "]"));
      }
    }
  }
  // The log decays of the tokens the step reads (host memory for the CPU backends;
  // kCuda reads a value above 0 as 0 and records it for check_device_faults): a
  // padding entry's tokens are skipped, so whatever they hold is not refused.
  if (!safe_gate && !cuda) {
    const int64_t C = verify ? a.verify_slots : 1;
    for (int64_t n = 0; n < N; ++n) {
      const int64_t start = a.num_accepted_tokens != nullptr ? index_at(a.num_accepted_tokens, a.index_type, n) - 1 : 0;
      if (index_at(a.state_indices, a.index_type, n * C + start) < 0) continue;
      const int64_t t0 = cu_host != nullptr ? cu_host[n] : n * a.tokens_per_seq;
      const int64_t t1 = cu_host != nullptr ? cu_host[n + 1] : t0 + a.tokens_per_seq;
      if (const Status s = check_log_decays(a, t0, t1, HV, K); !s.ok()) return s;
    }
  }
  if (cuda) return sm90::check_decode_supported(a);
  return Status::Ok();
}
}  // namespace

Status decode(const DecodeArgs& args, Backend backend, void* stream) {
  return api::guarded(backend, "decode", [&]() -> Status {
    Status s = validate_decode(args, backend);
    if (!s.ok()) return s;
    if (args.num_seqs == 0) return Status::Ok();
    if (backend == Backend::kCuda) return sm90::decode(args, stream);
    std::vector<int64_t> wide;  // int32 boundaries widened for the CPU backends
    DenseInputs dense;          // strided token tensors made dense
    // The token recurrence is the decode algorithm.
    return cpu::decode_f64(with_dense_inputs(with_int64_cu_seqlens(args, wide), dense));
  });
}

const char* to_string(IndexType type) {
  switch (type) {
    case IndexType::kInt32: return "kInt32";
    case IndexType::kInt64: return "kInt64";
  }
  return "unknown";
}

}  // namespace flashkda
