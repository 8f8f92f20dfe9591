// flashkda::validate: every rule of the contract (spec sections 1-2) that can be
// checked on the host, with messages that name the argument and what was expected.
//
// Order: backend, shapes, what g and beta hold, size overflow, null pointers,
// scalars, state dtypes, alignment, sequence boundaries, the CPU backends' log
// decays, and last the backend's own shape support (for kCuda:
// sm90::check_supported, which answers kNotSupported). Shape errors come before
// anything that uses the shapes, so every later product is known to fit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "common/sequences.h"
#include "flashkda/flashkda.h"
#include "sm90/sm90_forward.h"
#include "api/guarded.h"
#include "api/overlap.h"
#include "api/validation_util.h"

namespace flashkda {
using namespace validation;

namespace {
Status validate_impl(const ForwardArgs& a, Backend backend);
}  // namespace

// No exception crosses the API: the checks below may allocate (int32 boundaries
// widened, the spans of varlen checkpoints) and a failed allocation is a status.
Status validate(const ForwardArgs& a, Backend backend) {
  return api::guarded(backend, "validate", [&] {
    const Status s = validate_impl(a, backend);
    return s.ok() ? check_forward_overlaps(a) : s;
  });
}

namespace api {
Status validate_without_overlaps(const ForwardArgs& a, Backend backend) {
  return guarded(backend, "validate", [&] { return validate_impl(a, backend); });
}
}  // namespace api

// After validate_impl: every size below fits in int64 (checked there).
namespace {
// What a forward reads besides its token inputs' views.
std::vector<ArgBytes> forward_read_bytes(const ForwardArgs& a) {
  const int64_t HV = value_heads(a), K = a.head_dim_k, V = a.head_dim_v;
  const int64_t N = num_sequences(a);
  const int64_t index_bytes = a.state_index_type == IndexType::kInt64 ? 8 : 4;
  const int64_t n_slot_ck = N * kSlotCheckpointsPerSequence;  // N + 1 boundaries fit in int64 bytes
  std::vector<ArgBytes> read = forward_input_bytes(a);
  for (const ArgBytes& b :
       {dense_bytes("initial_state", a.initial_state,
                    arg_bytes(a.initial_state, {N, HV, V, K}, dtype_bytes(a.initial_state_dtype))),
        dense_bytes("state_indices", a.state_indices, arg_bytes(a.state_indices, {N}, index_bytes)),
        dense_bytes("has_initial_state", a.has_initial_state, arg_bytes(a.has_initial_state, {N}, 1)),
        dense_bytes("slot_checkpoint_offsets", a.slot_checkpoint_offsets,
                    arg_bytes(a.slot_checkpoint_offsets, {n_slot_ck}, 8)),
        dense_bytes("slot_checkpoint_slots", a.slot_checkpoint_slots,
                    arg_bytes(a.slot_checkpoint_slots, {n_slot_ck}, index_bytes))})
    read.push_back(b);
  return read;
}
// What a forward writes (the pool is read too).
std::vector<ArgBytes> forward_written_bytes(const ForwardArgs& a) {
  const int64_t HV = value_heads(a), K = a.head_dim_k, V = a.head_dim_v;
  const int64_t N = num_sequences(a), tokens = a.batch * a.seqlen, slot = HV * V * K;
  const int64_t pool_elem = dtype_bytes(a.state_pool_dtype);
  const int64_t pool_stride = a.pool_stride == 0 ? slot : a.pool_stride;
  return {dense_bytes("out", a.out, arg_bytes(a.out, {tokens, HV, V}, 2)),
          dense_bytes("final_state", a.final_state,
                      arg_bytes(a.final_state, {N, HV, V, K}, dtype_bytes(a.final_state_dtype))),
          row_bytes("state_pool", a.state_pool, a.pool_size, arg_bytes(a.state_pool, {HV, V, K}, pool_elem),
                    pool_stride * pool_elem),
          dense_bytes("checkpoints", a.checkpoints,
                      arg_bytes(a.checkpoints, {a.checkpoints_capacity, HV, K, V}, dtype_bytes(a.checkpoints_dtype))),
          dense_bytes("summaries_M", a.summaries_M, arg_bytes(a.summaries_M, {N, HV, K, K}, 4)),
          dense_bytes("summaries_B", a.summaries_B, arg_bytes(a.summaries_B, {N, HV, V, K}, 4))};
}
}  // namespace

Status validation::check_forward_overlaps(const ForwardArgs& a) {
  return check_overlaps(forward_written_bytes(a), forward_read_bytes(a), {{"final_state", "initial_state", true}});
}

Status validation::check_workspace_overlaps(const ForwardArgs& a, const void* workspace, int64_t bytes) {
  std::vector<ArgBytes> others = forward_read_bytes(a);
  for (const ArgBytes& b : forward_written_bytes(a)) others.push_back(b);
  return check_overlaps({dense_bytes("workspace", workspace, bytes)}, others);
}

namespace {
Status validate_impl(const ForwardArgs& a, Backend backend) {
  // ---- backend -------------------------------------------------------------
  if (const Status s = check_backend(backend); !s.ok()) return s;
  const bool cuda = backend == Backend::kCuda;

  // ---- int32 boundaries: checked as the int64 ones they stand for --------------
  if (a.cu_seqlens_int32 != nullptr) {
    // The last boundary is the token count: cu_seqlens requires batch == 1.
    if (const Status s = check_int32_boundaries(a, 1, a.seqlen, "seqlen"); !s.ok()) return s;
    return validate_as_int64_boundaries(a, cuda, [&](const ForwardArgs& b) { return validate_impl(b, backend); });
  }

  // ---- shapes --------------------------------------------------------------
  if (a.batch < 1) return Status::Invalid(cat("batch: expected a value >= 1, got ", a.batch));
  if (a.seqlen < 0) return Status::Invalid(cat("seqlen: expected a value >= 0, got ", a.seqlen));
  if (a.num_heads < 1) return Status::Invalid(cat("num_heads: expected a value >= 1, got ", a.num_heads));
  if (a.num_v_heads < 0 || (a.num_v_heads > 0 && a.num_v_heads % a.num_heads != 0))
    return Status::Invalid(cat("num_v_heads: expected 0 (= num_heads) or a positive multiple of num_heads=",
                               a.num_heads, ", got ", a.num_v_heads));
  // The CPU backends take any head dimension up to 256 (kCuda's set: check_supported below).
  if (const Status s = check_head_dims(a.head_dim_k, a.head_dim_v, cuda ? kInt64Max : kCpuMaxHeadDim,
                                       [&] { return cat("backend ", to_string(backend)); });
      !s.ok())
    return s;
  const bool varlen = a.cu_seqlens != nullptr;
  // As validate_decode and the Python binding: a host copy of boundaries that are
  // not given would be silently ignored (the call would run as a B·T batch).
  if (a.cu_seqlens_host != nullptr && !varlen)
    return Status::Invalid("cu_seqlens_host: given without cu_seqlens or cu_seqlens_int32 (expected the host copy "
                           "of one of them, with num_seqs)");
  if (varlen) {
    if (a.batch != 1)
      return Status::Invalid(cat("cu_seqlens: requires batch == 1, got batch=", a.batch));
    // N >= 1: a call with no sequences has no state shape to speak of; callers with
    // nothing to do simply do not call. (Zero-LENGTH sequences are fine.)
    if (a.num_seqs < 1)
      return Status::Invalid(cat("num_seqs: expected a value >= 1 with cu_seqlens, got ", a.num_seqs));
  }
  // What g and beta hold, and their dtypes (which the sizes below depend on).
  if (const Status s = check_gate_inputs(a); !s.ok()) return s;
  const bool safe_gate = a.gate_form == GateForm::kSafeGate;

  // ---- sizes: every tensor's element and byte count must fit in int64 --------
  const int64_t B = a.batch, T = a.seqlen, H = a.num_heads, HV = value_heads(a);
  const int64_t K = a.head_dim_k, V = a.head_dim_v;
  const int64_t N = num_sequences(a);
  int64_t n_qk = 0, n_v = 0, n_g = 0, n_beta = 0, n_state = 0, n_cu = 0;
  auto overflow = [&](const char* name, const char* formula) {
    return Status::Invalid(cat(name, ": element count ", formula, " overflows int64 (batch=", B, ", seqlen=", T,
                               ", num_heads=", H, ", num_v_heads=", HV, ", head_dim_k=", K,
                               ", head_dim_v=", V, ", num_seqs=", N, ")"));
  };
  if (!tensor_fits({B, T, H, K}, 2, &n_qk)) return overflow("q", "B*T*H*K");
  if (!tensor_fits({B, T, HV, V}, 2, &n_v)) return overflow("v", "B*T*HV*V");
  if (!tensor_fits({B, T, HV, K}, dtype_bytes(a.g_dtype), &n_g)) return overflow("g", "B*T*HV*K");
  if (!tensor_fits({B, T, HV}, dtype_bytes(a.beta_dtype), &n_beta)) return overflow("beta", "B*T*HV");
  if (!tensor_fits({HV, K}, 4, &n_state)) return overflow("dt_bias", "HV*K");
  // The per-sequence states' count: named after a state tensor given, else after
  // what sets N (a batch of empty sequences may still be too large to index).
  if (!tensor_fits({N, HV, V, K}, 4, &n_state))
    return overflow(a.initial_state != nullptr ? "initial_state"
                    : a.final_state != nullptr ? "final_state"
                    : varlen                    ? "num_seqs"
                                                : "batch",
                    "N*HV*V*K");
  int64_t n_summary_m = 0;
  if ((a.summaries_M != nullptr || a.summaries_B != nullptr) && !tensor_fits({N, HV, K, K}, 4, &n_summary_m))
    return overflow("summaries_M", "N*HV*K*K");
  if (varlen && !tensor_fits({N + 1}, 8, &n_cu)) return overflow("cu_seqlens", "num_seqs+1");
  // Token index arithmetic (b*T + t) also needs B*T*max(H,HV)*max(K,V) < 2^63: implied above.

  // ---- strided token tensors ---------------------------------------------------
  if (const Status s = check_token_views(a, B * T, H, HV, K, V, cuda); !s.ok()) return s;

  // ---- pointers: null --------------------------------------------------------
  // A tensor with zero elements (seqlen == 0) may come with a null pointer, as an
  // empty framework tensor does; it is never dereferenced.
  // A summaries call writes no out (ForwardArgs::summaries_M); a log decay reads
  // no A_log or dt_bias.
  const bool summaries_call = a.summaries_M != nullptr || a.summaries_B != nullptr;
  struct Req {
    const char* name;
    const void* ptr;
    int64_t elems;
  };
  const Req required[] = {
      {"q", a.q, n_qk},       {"k", a.k, n_qk},       {"v", a.v, n_v},
      {"g", a.g, n_g},        {"beta", a.beta, n_beta}, {"A_log", a.A_log, safe_gate ? HV : 0},
      {"dt_bias", a.dt_bias, safe_gate ? HV * K : 0}, {"out", a.out, summaries_call ? 0 : n_v},
  };
  for (const Req& r : required)
    if (r.ptr == nullptr && r.elems > 0) return Status::Invalid(cat(r.name, ": null pointer"));

  // ---- scalars ---------------------------------------------------------------
  if (!std::isfinite(a.scale)) return Status::Invalid(cat("scale: expected a finite value, got ", a.scale));
  // lower_bound in [-5, 0): the chunked algorithm (spec section 3) works with the
  // base-2 prefix sums G of a = lower_bound·sigmoid(..) over a 16-token chunk and
  // forms 2^G and 2^-G; |G| <= 16·|lower_bound|·log2(e), which must stay below 127
  // so that every 2^±G is a normal float (16·5·1.4427 = 115.4 < 127). Zero or
  // positive bounds would make the "decay" a growth and are not KDA. Not read with
  // a given log decay (GateForm::kLogDecay), whose chunks the backends bound
  // themselves (common/gate.h, kMaxChunkDecayLog2).
  if (safe_gate && !(std::isfinite(a.lower_bound) && a.lower_bound >= -5.f && a.lower_bound < 0.f))
    return Status::Invalid(cat("lower_bound: expected a finite value in [-5, 0), got ", a.lower_bound));

  // ---- states ----------------------------------------------------------------
  if (!known_dtype(a.initial_state_dtype))
    return Status::Invalid(cat("initial_state_dtype: unknown value ", static_cast<int32_t>(a.initial_state_dtype),
                               " (expected kNone=0, kBF16=1 or kFP32=2)"));
  if (!known_dtype(a.final_state_dtype))
    return Status::Invalid(cat("final_state_dtype: unknown value ", static_cast<int32_t>(a.final_state_dtype),
                               " (expected kNone=0, kBF16=1 or kFP32=2)"));
  if (a.initial_state != nullptr && a.initial_state_dtype == DType::kNone)
    return Status::Invalid("initial_state: pointer given but initial_state_dtype is kNone");
  if (a.initial_state == nullptr && a.initial_state_dtype != DType::kNone)
    return Status::Invalid(cat("initial_state: null pointer but initial_state_dtype is ",
                               a.initial_state_dtype, " (use kNone for no initial state)"));
  if (a.final_state != nullptr && a.final_state_dtype == DType::kNone)
    return Status::Invalid("final_state: pointer given but final_state_dtype is kNone");
  if (a.final_state == nullptr && a.final_state_dtype != DType::kNone)
    return Status::Invalid(cat("final_state: null pointer but final_state_dtype is ",
                               a.final_state_dtype, " (use kNone for no final state)"));
  if (a.initial_state != nullptr && a.final_state != nullptr && a.initial_state_dtype != a.final_state_dtype)
    return Status::Invalid(cat("final_state_dtype: expected the same dtype as initial_state_dtype (",
                               a.initial_state_dtype, ") when both states are given, got ",
                               a.final_state_dtype));

  // ---- state pool --------------------------------------------------------------
  const bool pool = a.state_pool != nullptr;
  int64_t pool_stride = 0;
  if (!pool) {
    if (a.state_pool_dtype != DType::kNone)
      return Status::Invalid(cat("state_pool: null pointer but state_pool_dtype is ", a.state_pool_dtype,
                                 " (use kNone without a pool)"));
    if (a.state_indices != nullptr) return Status::Invalid("state_indices: given without state_pool");
    if (a.has_initial_state != nullptr) return Status::Invalid("has_initial_state: given without state_pool");
  } else {
    if (a.initial_state != nullptr || a.final_state != nullptr)
      return Status::Invalid("state_pool: given together with initial_state / final_state (expected one or the "
                             "other: with a pool the states are read from and written to its slots)");
    if (a.states_key_major)
      return Status::Invalid("states_key_major: set with a state_pool (it is the layout of initial_state / "
                             "final_state; pool slots are [HV, V, K])");
    if (a.state_pool_dtype != DType::kFP32 && a.state_pool_dtype != DType::kBF16)
      return Status::Invalid(cat("state_pool_dtype: expected kFP32 or kBF16 with a state_pool, got ",
                                 a.state_pool_dtype));
    if (a.pool_size < 1) return Status::Invalid(cat("pool_size: expected a value >= 1, got ", a.pool_size));
    const int64_t per_slot = HV * V * K;  // fits: checked with the states above
    pool_stride = a.pool_stride == 0 ? per_slot : a.pool_stride;
    if (pool_stride < per_slot)
      return Status::Invalid(cat("pool_stride: expected 0 or at least num_v_heads*head_dim_v*head_dim_k = ", per_slot,
                                 " elements, got ", a.pool_stride));
    int64_t pool_elems = 0;
    if (!tensor_fits({a.pool_size, pool_stride}, 4, &pool_elems))
      return Status::Invalid(cat("pool_size: pool_size * pool_stride overflows int64 (", a.pool_size, " * ",
                                 pool_stride, ")"));
    if (a.state_index_type != IndexType::kInt32 && a.state_index_type != IndexType::kInt64)
      return Status::Invalid(cat("state_index_type: unknown value ", static_cast<int32_t>(a.state_index_type),
                                 " (expected kInt32=0 or kInt64=1)"));
    if (a.state_indices == nullptr) return Status::Invalid("state_indices: null pointer (required with state_pool)");
    // kCuda reads and writes a slot's rows as 8-byte (fp32) / 4-byte (bf16) pairs
    // from a 16-byte aligned pool: slots must keep that alignment.
    if (cuda && pool_stride % 4 != 0)
      return Status::Invalid(cat("pool_stride: backend kCuda needs a multiple of 4 elements (16-byte aligned "
                                 "slots), got ", pool_stride));
  }

  // ---- checkpoints -----------------------------------------------------------------
  // An interval with a null buffer is an empty buffer (capacity 0: a batch whose
  // sequences need no entry, e.g. all empty); any other null buffer is no checkpoints.
  const bool checkpoints = a.checkpoints != nullptr || a.checkpoint_interval != 0;
  if (!checkpoints) {
    if (a.checkpoints_dtype != DType::kNone || a.checkpoint_interval != 0 || a.checkpoints_capacity != 0)
      return Status::Invalid("checkpoints: null pointer but checkpoints_dtype / checkpoint_interval / "
                             "checkpoints_capacity set (leave them at their defaults without checkpoints)");
  } else {
    if (a.checkpoints_dtype != DType::kFP32 && a.checkpoints_dtype != DType::kBF16)
      return Status::Invalid(cat("checkpoints_dtype: expected kFP32 or kBF16 with checkpoints, got ",
                                 a.checkpoints_dtype));
    if (a.checkpoint_interval < 16 || a.checkpoint_interval % 16 != 0)
      return Status::Invalid(cat("checkpoint_interval: expected a positive multiple of 16, got ",
                                 a.checkpoint_interval));
    if (a.checkpoints_capacity < 0)
      return Status::Invalid(cat("checkpoints_capacity: expected a value >= 0, got ", a.checkpoints_capacity));
    if (a.checkpoints == nullptr && a.checkpoints_capacity > 0)
      return Status::Invalid(cat("checkpoints: expected a buffer of checkpoints_capacity = ", a.checkpoints_capacity,
                                 " entries, got a null pointer"));
    int64_t n_ck = 0;
    if (!tensor_fits({a.checkpoints_capacity, HV, K, V}, 4, &n_ck))
      return Status::Invalid(cat("checkpoints_capacity: capacity * HV * K * V overflows int64 (capacity ",
                                 a.checkpoints_capacity, ")"));
  }

  // ---- slot checkpoints (need the pool) ------------------------------------------
  const bool slot_checkpoints = a.slot_checkpoint_offsets != nullptr || a.slot_checkpoint_slots != nullptr;
  if (slot_checkpoints) {
    if (!pool)
      return Status::Invalid("slot_checkpoint_offsets: slot checkpoints need a state_pool (they are written to its slots)");
    if (a.slot_checkpoint_offsets == nullptr) return Status::Invalid("slot_checkpoint_offsets: null pointer");
    if (a.slot_checkpoint_slots == nullptr) return Status::Invalid("slot_checkpoint_slots: null pointer");
  }

  // ---- the two calls of a split forward (context parallelism) ------------------------
  if (summaries_call || a.resume_from_summaries) {
    const char* which = summaries_call ? "summaries_M" : "resume_from_summaries";
    if (summaries_call && (a.summaries_M == nullptr || a.summaries_B == nullptr))
      return Status::Invalid(cat(a.summaries_M == nullptr ? "summaries_M" : "summaries_B",
                                 ": null pointer (a summaries call takes both summaries_M and summaries_B)"));
    if (summaries_call && a.resume_from_summaries)
      return Status::Invalid("resume_from_summaries: set in a summaries call (summaries_M given); the resume is "
                             "the second call, without summaries_M / summaries_B");
    if (pool)
      return Status::Invalid(cat(which, ": not supported together with state_pool",
                                 summaries_call ? "" : " (pass the incoming states as initial_state, final_state)"));
    if (checkpoints || slot_checkpoints)
      return Status::Invalid(cat(which, ": not supported together with checkpoints or slot checkpoints"));
    if (summaries_call && (a.initial_state != nullptr || a.final_state != nullptr))
      return Status::Invalid("summaries_M: a summaries call reads no initial_state and writes no final_state "
                             "(expected both null; they belong to the resume call)");
  }

  // ---- pointers: alignment ---------------------------------------------------
  // kCuda loads bf16 tiles (and g's rows, bf16 or fp32) with 16-byte vector / TMA
  // accesses; the CPU backends need the natural alignment of the element type, as
  // does kCuda for beta, which it reads element by element.
  const uintptr_t tile_align = cuda ? kCudaRowAlignBytes : 2;
  const uintptr_t state_align = 16;  // kCuda; CPU: natural, below
  struct Al {
    const char* name;
    const void* ptr;
    uintptr_t align;
  };
  const Al alignments[] = {
      {"q", a.q, tile_align},
      {"k", a.k, tile_align},
      {"v", a.v, tile_align},
      {"g", a.g, cuda ? tile_align : static_cast<uintptr_t>(dtype_bytes(a.g_dtype))},
      {"out", a.out, tile_align},
      {"beta", a.beta, static_cast<uintptr_t>(dtype_bytes(a.beta_dtype))},
      {"A_log", a.A_log, 4},
      {"dt_bias", a.dt_bias, 4},
      {"initial_state", a.initial_state,
       cuda ? state_align : static_cast<uintptr_t>(dtype_bytes(a.initial_state_dtype))},
      {"final_state", a.final_state,
       cuda ? state_align : static_cast<uintptr_t>(dtype_bytes(a.final_state_dtype))},
      {"cu_seqlens", a.cu_seqlens, 8},
      {"cu_seqlens_host", a.cu_seqlens_host, 8},
      {"state_pool", a.state_pool, cuda ? state_align : static_cast<uintptr_t>(dtype_bytes(a.state_pool_dtype))},
      {"state_indices", a.state_indices, a.state_index_type == IndexType::kInt64 ? 8u : 4u},
      {"checkpoints", a.checkpoints, cuda ? state_align : static_cast<uintptr_t>(dtype_bytes(a.checkpoints_dtype))},
      {"slot_checkpoint_offsets", a.slot_checkpoint_offsets, 8},
      {"slot_checkpoint_slots", a.slot_checkpoint_slots, a.state_index_type == IndexType::kInt64 ? 8u : 4u},
      {"summaries_M", a.summaries_M, cuda ? state_align : 4u},
      {"summaries_B", a.summaries_B, cuda ? state_align : 4u},
  };
  for (const Al& x : alignments)
    if (x.ptr != nullptr && !aligned(x.ptr, x.align))
      return Status::Invalid(cat(x.name, ": expected a ", x.align, "-byte aligned pointer for backend ",
                                 to_string(backend), ", got ", x.ptr));

  // ---- sequence boundaries ---------------------------------------------------
  // The values can be checked where a host copy exists: args.cu_seqlens itself for
  // the CPU backends, args.cu_seqlens_host (optional) for kCuda. Device-only
  // boundaries are trusted.
  if (varlen) {
    const int64_t* cu = cuda ? a.cu_seqlens_host : a.cu_seqlens;
    if (cu != nullptr) {
      const Status st = check_host_boundaries(cuda ? "cu_seqlens_host" : "cu_seqlens", cu, N, T);
      if (!st.ok()) return st;
    }
    if (!cuda) {
      const Status st = check_host_copy(a.cu_seqlens, a.cu_seqlens_host, N);
      if (!st.ok()) return st;
    }
  }

  // ---- checkpoint capacity: the total Σ ceil(L_n / c), where the lengths are on the host
  if (checkpoints) {
    const int64_t c = a.checkpoint_interval;
    const int64_t* cu = cuda ? a.cu_seqlens_host : a.cu_seqlens;
    // A B·T batch: B·ceil(T/c) <= B·T, which fits (checked above); no vector of B spans.
    const int64_t need = !varlen          ? B * checkpoints_of(T, c)
                         : cu != nullptr ? checkpoint_offsets(sequence_spans(a, cu), c).back()
                                         : -1;
    if (need > a.checkpoints_capacity)
      return Status::Invalid(cat("checkpoints_capacity: the sequences need ", need, " checkpoints of ", c,
                                 " tokens (sum of ceil(length / ", c, ")), the checkpoints buffer holds ",
                                 a.checkpoints_capacity, " entries"));
  }

  // ---- slot indices (host memory for the CPU backends) -----------------------------
  if (pool && !cuda) {
    const Status s = check_slot_indices("state_indices", a.state_indices, a.state_index_type, N, a.pool_size, "no slot");
    if (!s.ok()) return s;
  }
  if (slot_checkpoints && !cuda) {
    const std::vector<SequenceSpan> spans = sequence_spans(a, a.cu_seqlens);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < kSlotCheckpointsPerSequence; ++i) {
        const int64_t e = n * kSlotCheckpointsPerSequence + i;
        const int64_t off = a.slot_checkpoint_offsets[e];
        const int64_t L = spans[static_cast<size_t>(n)].length;
        // An entry with a negative offset or a negative slot is "none" whatever the
        // other holds, as the backends run it (kCuda records no fault for it either).
        const int64_t slot = index_at(a.slot_checkpoint_slots, a.state_index_type, e);
        if (off < 0 || slot < 0) continue;
        if (slot >= a.pool_size)
          return Status::Invalid(cat("slot_checkpoint_slots: entry [", n, ", ", i, "] is ", slot,
                                     ", expected < pool_size=", a.pool_size, " (or negative for none)"));
        if (off < 16 || off % 16 != 0 || off > L)
          return Status::Invalid(cat("slot_checkpoint_offsets: entry [", n, ", ", i, "] is ", off,
                                     ", expected a multiple of 16 in [16, ", L, "] (the sequence's length) or negative"));
      }
  }

  // ---- log decays (host memory for the CPU backends; kCuda reads a value above 0
  // as 0 and records it for check_device_faults) -----------------------------------
  if (!safe_gate && !cuda) {
    const Status s = check_log_decays(a, 0, B * T, HV, K);
    if (!s.ok()) return s;
  }

  // ---- backend-specific shape support ------------------------------------------
  if (cuda) return sm90::check_supported(a);
  return Status::Ok();
}
}  // namespace

}  // namespace flashkda
