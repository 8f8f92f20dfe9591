// Helpers shared by the argument validators (validate.cpp, decode.cpp).
#pragma once
#include <array>
#include <charconv>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/gate.h"
#include "common/sequences.h"
#include "flashkda/flashkda.h"

namespace flashkda::validation {


inline constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
inline constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
// Head dimensions the CPU backends accept (any value in this range).
inline constexpr int64_t kCpuMaxHeadDim = 256;
// kCuda's forward loads rows of q, k, v, g as 16-byte vectors (TMA and vector
// copies): their pointers and strides must keep every row on a 16-byte boundary.
inline constexpr int64_t kCudaRowAlignBytes = 16;

// Floats print as the shortest text that reads back as the same float, so that a
// value just outside a range does not print as the bound it missed (a stream's 6
// digits print -5.00000048 as "got -5"), and -5.1f still prints as -5.1.
inline void put_part(std::ostringstream& os, float x) {
  char text[32];
  const std::to_chars_result r = std::to_chars(text, text + sizeof(text), x);
  os.write(text, r.ptr - text);
}
inline bool known_dtype(DType d) { return d == DType::kNone || d == DType::kBF16 || d == DType::kFP32; }
// A DType by name; a value outside the enum (through the C ABI) with its number.
inline void put_part(std::ostringstream& os, DType d) {
  if (known_dtype(d)) os << to_string(d);
  else os << "unknown value " << static_cast<int32_t>(d);
}
template <typename T>
void put_part(std::ostringstream& os, const T& x) {
  os << x;
}
template <typename... Ts>
std::string cat(const Ts&... parts) {
  std::ostringstream os;
  (put_part(os, parts), ...);
  return os.str();
}

// head_dim_k and head_dim_v: below 1 an invalid argument; above `max`, what
// `runner()` names (a backend, or the decode) runs, a valid shape it does not run
// (kNotSupported). `runner` is called only for that message.
template <typename Runner>
Status check_head_dims(int64_t head_dim_k, int64_t head_dim_v, int64_t max, Runner&& runner) {
  for (const auto& [name, dim] : {std::pair<const char*, int64_t>{"head_dim_k", head_dim_k}, {"head_dim_v", head_dim_v}}) {
    if (dim < 1) return Status::Invalid(cat(name, ": expected a value >= 1, got ", dim));
    if (dim > max) return Status::NotSupported(cat(name, ": ", runner(), " runs head dims in [1, ", max, "], got ", dim));
  }
  return Status::Ok();
}

inline bool known_backend(Backend b) {
  return b == Backend::kCpuReference || b == Backend::kCpuChunked || b == Backend::kCuda;
}
inline Status check_backend(Backend b) {
  if (known_backend(b)) return Status::Ok();
  return Status::Invalid(cat("backend: unknown value ", static_cast<int32_t>(b),
                             " (expected kCpuReference=0, kCpuChunked=1 or kCuda=2)"));
}

// a*b for non-negative a, b; false on int64 overflow.
inline bool mul_ok(int64_t a, int64_t b, int64_t* r) {
  if (a != 0 && b > kInt64Max / a) return false;
  *r = a * b;
  return true;
}

inline bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; }

// What int32 boundaries (cu_seqlens_int32, forward or decode) need before they
// are checked as int64 ones: given alone, at least `min_seqs` sequences, aligned,
// and `tokens` (the last boundary) within int32 — past 2^31 - 1 no int32
// boundaries are valid, which kCuda could not see on the host. `tokens_name`
// names the count in the message.
template <class Args>
Status check_int32_boundaries(const Args& a, int64_t min_seqs, int64_t tokens, const char* tokens_name) {
  if (a.cu_seqlens != nullptr)
    return Status::Invalid("cu_seqlens_int32: given together with cu_seqlens (expected one of the two)");
  if (a.num_seqs < min_seqs)
    return Status::Invalid(cat("num_seqs: expected a value >= ", min_seqs, " with cu_seqlens_int32, got ", a.num_seqs));
  if (!aligned(a.cu_seqlens_int32, 4)) return Status::Invalid("cu_seqlens_int32: expected a 4-byte aligned pointer");
  if (tokens > kInt32Max)
    return Status::Invalid(cat("cu_seqlens_int32: int32 boundaries cannot reach ", tokens_name, "=", tokens,
                               " (more than 2^31 - 1 tokens: pass int64 cu_seqlens)"));
  return Status::Ok();
}

// The checks of validate_as_int64_boundaries run on an int64 copy passed as
// cu_seqlens: their messages name the caller's cu_seqlens_int32 instead (not
// cu_seqlens_host, which keeps its name).
inline Status named_int32_boundaries(Status s) {
  if (s.ok()) return s;
  static const std::string kFrom = "cu_seqlens", kTo = "cu_seqlens_int32";
  std::string m;
  for (size_t i = 0; i < s.message.size();) {
    if (s.message.compare(i, kFrom.size(), kFrom) == 0 && s.message.compare(i + kFrom.size(), 1, "_") != 0) {
      m += kTo;
      i += kFrom.size();
    } else {
      m += s.message[i++];
    }
  }
  s.message = std::move(m);
  return s;
}

// int32 boundaries (cu_seqlens_int32, forward or decode) validated as the int64
// ones they stand for, by `validate_args`. kCuda reads them on the device, where
// the kernels clamp and record their values as for int64 ones: they are checked
// through a stand-in int64 pointer that is never read here (a cu_seqlens_host
// copy, if given, is checked). The CPU backends widen them on the host.
template <class Args, class Validate>
Status validate_as_int64_boundaries(const Args& a, bool cuda, Validate&& validate_args) {
  // num_seqs + 1 boundaries, widened to int64 on the host: their count must fit
  // (otherwise num_seqs + 1 and the pointer arithmetic over them wrap, and the
  // widened copy comes out shorter than the num_seqs + 1 entries read from it).
  if (a.num_seqs > kInt64Max / 8 - 1)
    return Status::Invalid(cat("num_seqs: ", a.num_seqs, " + 1 int64 boundaries overflow int64 (cu_seqlens_int32)"));
  if (cuda) {
    Args b = a;
    b.cu_seqlens_int32 = nullptr;
    b.cu_seqlens = reinterpret_cast<const int64_t*>(uintptr_t{8});
    return named_int32_boundaries(validate_args(b));
  }
  std::vector<int64_t> wide;
  try {
    wide.reserve(static_cast<size_t>(a.num_seqs + 1));
  } catch (const std::exception&) {  // bad_alloc, length_error: no such array on the host
    return Status::Invalid(cat("num_seqs: ", a.num_seqs, " + 1 boundaries in cu_seqlens_int32 do not fit in host "
                               "memory (expected the number of sequences)"));
  }
  return named_int32_boundaries(validate_args(with_int64_cu_seqlens(a, wide)));
}

// Sequence boundaries readable on the host: cu[0] == 0, non-decreasing, cu[N] == T
// (the flattened B·T tokens); the messages call them `name`.
inline Status check_host_boundaries(const char* name, const int64_t* cu, int64_t N, int64_t T) {
  if (cu[0] != 0) return Status::Invalid(cat(name, ": expected ", name, "[0] == 0, got ", cu[0]));
  for (int64_t n = 1; n <= N; ++n)
    if (cu[n] < cu[n - 1])
      return Status::Invalid(cat(name, ": expected non-decreasing values, got ", name, "[", n, "]=", cu[n], " < ",
                                 name, "[", n - 1, "]=", cu[n - 1]));
  if (cu[N] != T)
    return Status::Invalid(cat(name, ": expected ", name, "[num_seqs=", N, "] == seqlen=", T, ", got ", cu[N]));
  return Status::Ok();
}

// The CPU backends read cu_seqlens itself on the host; a host copy given with it
// must be that copy (a copy that disagrees is a caller's bug that would otherwise
// pass unnoticed there and change the plan on kCuda).
inline Status check_host_copy(const int64_t* cu, const int64_t* copy, int64_t N) {
  if (copy == nullptr) return Status::Ok();
  for (int64_t n = 0; n <= N; ++n)
    if (copy[n] != cu[n])
      return Status::Invalid(cat("cu_seqlens_host: expected a copy of cu_seqlens, but cu_seqlens_host[", n, "]=",
                                 copy[n], " where cu_seqlens[", n, "]=", cu[n]));
  return Status::Ok();
}

// Strided token tensors (ForwardArgs' and DecodeArgs' *_token_stride and
// *_head_stride, in elements of each tensor's dtype) over `tokens` tokens: any
// non-negative strides (reads only: overlapping views are harmless), the farthest
// element addressable in int64 bytes; with `row_aligned` (kCuda's forward copies
// rows of q, k, v, g as 16-byte vectors) strides of q, k, v, g that are multiples
// of 16 bytes: 8 bf16 or 4 fp32 elements (beta is read element by element).
template <class Args>
Status check_token_views(const Args& a, int64_t tokens, int64_t H, int64_t HV, int64_t K, int64_t V,
                         bool row_aligned) {
  const std::array<TokenView, 5> views = token_views(a, H, HV, K, V);
  for (const TokenView& x : views) {
    if (x.given_token_stride < 0 || x.given_head_stride < 0)
      return Status::Invalid(cat(x.name, "_token_stride / ", x.name, "_head_stride: expected values >= 0 (0: dense), got ",
                                 x.given_token_stride, " / ", x.given_head_stride));
    // In bytes: the overlap checks and the kernels form byte offsets from these
    // strides. Counted in elements, a stride near 2^62 passed and the CPU
    // backend's copy then read far outside the tensor.
    const int64_t max_elems = kInt64Max / x.elem_bytes;
    const int64_t last_token = tokens > 0 ? tokens - 1 : 0;
    int64_t a1 = 0, a2 = 0;
    if (x.token_stride > max_elems || x.head_stride > max_elems || !mul_ok(last_token, x.token_stride, &a1) ||
        !mul_ok(x.heads - 1, x.head_stride, &a2) || a1 > max_elems - a2 - x.width)
      return Status::Invalid(cat(x.name, "_token_stride / ", x.name, "_head_stride: the farthest byte (token ",
                                 last_token, ", head ", x.heads - 1, ") overflows int64 with strides ",
                                 x.token_stride, " / ", x.head_stride, " (elements of ", x.elem_bytes, " bytes)"));
  }
  if (row_aligned)
    for (const TokenView& x : views) {
      if (std::string(x.name) == "beta") continue;
      const int64_t row_elems = kCudaRowAlignBytes / x.elem_bytes;
      if (x.given_token_stride % row_elems != 0 || x.given_head_stride % row_elems != 0)
        return Status::Invalid(cat(x.name, "_token_stride / ", x.name, "_head_stride: backend kCuda needs ",
                                   "multiples of ", row_elems, " elements (16-byte aligned rows), got ",
                                   x.given_token_stride, " / ", x.given_head_stride));
    }
  return Status::Ok();
}

// What g and beta hold (ForwardArgs, DecodeArgs): a known gate_form, and g_dtype
// and beta_dtype kBF16 or kFP32 (checked before anything sizes g or beta by them).
template <class Args>
Status check_gate_inputs(const Args& a) {
  if (a.gate_form != GateForm::kSafeGate && a.gate_form != GateForm::kLogDecay)
    return Status::Invalid(cat("gate_form: unknown value ", static_cast<int32_t>(a.gate_form),
                               " (expected kSafeGate=0 or kLogDecay=1)"));
  for (const auto& [name, dtype] : {std::pair<const char*, DType>{"g_dtype", a.g_dtype}, {"beta_dtype", a.beta_dtype}})
    if (dtype != DType::kBF16 && dtype != DType::kFP32)
      return Status::Invalid(cat(name, ": expected kBF16 or kFP32, got ", dtype));
  return Status::Ok();
}

// With GateForm::kLogDecay on a CPU backend (g in host memory): the g of tokens
// [token_begin, token_end) are log decays, <= 0. A value above 0 is a growth, which
// the recurrence is not defined for and the chunked algorithm's exponents assume
// away; it is refused naming the first (token, head, channel). NaN passes (it
// propagates to the outputs like any NaN input), and so does -inf (a decay of 0).
template <class Args>
Status check_log_decays(const Args& a, int64_t token_begin, int64_t token_end, int64_t HV, int64_t K) {
  const TokenView g = token_views(a, a.num_heads, HV, K, a.head_dim_v)[3];
  for (int64_t t = token_begin; t < token_end; ++t)
    for (int64_t h = 0; h < HV; ++h)
      for (int64_t d = 0; d < K; ++d) {
        const float x = load_gate_input(a.g, a.g_dtype, t * g.token_stride + h * g.head_stride + d);
        if (x > 0.f)
          return Status::Invalid(cat("g: expected log decays <= 0 with gate_form kLogDecay (the natural log of ",
                                     "each channel's decay), got ", x, " at token ", t, ", head ", h, ", channel ", d));
      }
  return Status::Ok();
}

// Element count and byte count of one tensor; false when either overflows int64.
inline bool tensor_fits(std::initializer_list<int64_t> dims, int64_t elem_bytes, int64_t* elems) {
  int64_t n = 1;
  for (int64_t d : dims)
    if (!mul_ok(n, d, &n)) return false;
  int64_t bytes;
  if (!mul_ok(n, elem_bytes, &bytes)) return false;
  *elems = n;
  return true;
}


// Slot indices in host memory (forward's state pool, decode): the first entry
// >= pool_size as an error naming the argument `name`, else Ok. Negative entries
// are allowed (`negative` says what they mean, for the message).
inline Status check_slot_indices(const char* name, const void* indices, IndexType type, int64_t count,
                                 int64_t pool_size, const char* negative) {
  for (int64_t n = 0; n < count; ++n) {
    const int64_t idx = index_at(indices, type, n);
    if (idx >= pool_size)
      return Status::Invalid(cat(name, ": entry ", n, " is ", idx, ", expected < pool_size=", pool_size,
                                 " (or negative for ", negative, ")"));
  }
  return Status::Ok();
}


}  // namespace flashkda::validation
