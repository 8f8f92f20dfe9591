// Outputs that share memory with another argument (validate.cpp, decode.cpp,
// segment_summaries.cpp).
//
// A forward or decode step reads its inputs while it writes its outputs, in an
// order that differs between backends (and, on kCuda, between CTAs of one
// launch), so an output that shares bytes with an input or another output gives
// a result that depends on that order: a silent wrong answer. The validators
// refuse every overlap they can be sure of, naming both arguments; the in-place
// forms the API documents (a forward's final_state = initial_state, a state pool
// updated in place) are not overlaps in this sense.
//
// Sure means: one of the two arguments is dense (every byte of its range is its
// own) and one of the other's runs has a byte in that range (an exact test: a
// dense out in a middle slot of a strided pool, or among the tokens of a strided
// q, is refused; one that lies only in the gaps between the other's runs is
// not). Strided views whose ranges interleave without sharing bytes (q, k and v
// as slices of one fused projection output) are what engines pass, so two
// strided arguments whose ranges merely meet are left alone.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "api/validation_util.h"
#include "common/sequences.h"

namespace flashkda::validation {

// The bytes of one argument: n_outer x n_inner runs of `run` bytes, run (i, j)
// at ptr + i·s_outer + j·s_inner (strides >= 0, in bytes).
struct ArgBytes {
  const char* name = "";
  const void* ptr = nullptr;
  int64_t run = 0;
  int64_t n_outer = 1, s_outer = 0;
  int64_t n_inner = 1, s_inner = 0;

  bool empty() const { return ptr == nullptr || run <= 0 || n_outer <= 0 || n_inner <= 0; }
  // [lo, hi): 128-bit, since a range validated in elements may pass 2^63 bytes.
  unsigned __int128 lo() const { return reinterpret_cast<uintptr_t>(ptr); }
  unsigned __int128 hi() const {
    return lo() + static_cast<unsigned __int128>(n_outer - 1) * static_cast<uint64_t>(s_outer) +
           static_cast<unsigned __int128>(n_inner - 1) * static_cast<uint64_t>(s_inner) + static_cast<uint64_t>(run);
  }
  // Every byte of [lo, hi) is the argument's: the runs tile the range, one
  // dimension inside the other (either way round).
  bool dense() const { return tiles(n_inner, s_inner, n_outer, s_outer) || tiles(n_outer, s_outer, n_inner, s_inner); }

 private:
  bool tiles(int64_t n_in, int64_t s_in, int64_t n_out, int64_t s_out) const {
    unsigned __int128 block = static_cast<uint64_t>(run);
    if (n_in > 1) {
      if (s_in != run) return false;
      block *= static_cast<uint64_t>(n_in);
    }
    return n_out == 1 || static_cast<unsigned __int128>(static_cast<uint64_t>(s_out)) == block;
  }
};

// A dense argument of `bytes` bytes.
inline ArgBytes dense_bytes(const char* name, const void* ptr, int64_t bytes) {
  ArgBytes b;
  b.name = name;
  b.ptr = ptr;
  b.run = bytes;
  return b;
}

// `count` rows of `row_bytes` bytes, `stride_bytes` apart (pool slots).
inline ArgBytes row_bytes(const char* name, const void* ptr, int64_t count, int64_t row_bytes, int64_t stride_bytes) {
  ArgBytes b = dense_bytes(name, ptr, row_bytes);
  b.n_outer = count;
  b.s_outer = stride_bytes;
  return b;
}

// A strided token tensor (ForwardArgs' / DecodeArgs' *_token_stride, *_head_stride)
// over `tokens` tokens of its own elements (bf16; g and beta bf16 or fp32).
inline ArgBytes token_view_bytes(const TokenView& x, const void* ptr, int64_t tokens) {
  ArgBytes b = dense_bytes(x.name, ptr, x.width * x.elem_bytes);
  b.n_outer = tokens;
  b.s_outer = x.token_stride * x.elem_bytes;
  b.n_inner = x.heads;
  b.s_inner = x.head_stride * x.elem_bytes;
  return b;
}

// Whether some run of y has a byte in [a, b). A run starting at r meets it when
// r < b and r + run > a. Along one dimension the starts rise with the index, so
// for each index of the dimension with fewer entries (heads, or a pool's single
// row of them) the first start past a − run along the other is the only one to
// test: O(min(n_outer, n_inner)).
inline bool any_run_meets(const ArgBytes& y, unsigned __int128 a, unsigned __int128 b) {
  using u128 = unsigned __int128;
  const bool outer_few = y.n_outer <= y.n_inner;
  const int64_t n_few = outer_few ? y.n_outer : y.n_inner, n_many = outer_few ? y.n_inner : y.n_outer;
  const u128 s_few = static_cast<uint64_t>(outer_few ? y.s_outer : y.s_inner);
  const u128 s_many = static_cast<uint64_t>(outer_few ? y.s_inner : y.s_outer);
  const u128 run = static_cast<uint64_t>(y.run);
  for (int64_t f = 0; f < n_few; ++f) {
    const u128 base = y.lo() + static_cast<u128>(f) * s_few;
    u128 i = 0;  // the first index along `many` whose run ends past a
    if (base + run <= a) {
      if (s_many == 0 || n_many == 1) continue;
      i = (a - run - base) / s_many + 1;  // base + i·s_many + run > a
    }
    if (i < static_cast<u128>(n_many) && base + i * s_many < b) return true;
  }
  return false;
}

// Whether x and y certainly share a byte (see the header comment).
inline bool surely_overlap(const ArgBytes& x, const ArgBytes& y) {
  if (x.empty() || y.empty()) return false;
  if (x.hi() <= y.lo() || y.hi() <= x.lo()) return false;
  return (x.dense() && any_run_meets(y, x.lo(), x.hi())) || (y.dense() && any_run_meets(x, y.lo(), y.hi()));
}

// Two arguments that may be the same memory (the documented in-place forms):
// allowed when their pointers are equal and `same_layout` holds.
struct InPlace {
  const char* written;
  const char* other;
  bool same_layout;
};

// The first written argument that surely overlaps another written one or a read
// one, as an error naming both; Ok when there is none.
inline Status check_overlaps(const std::vector<ArgBytes>& written, const std::vector<ArgBytes>& read,
                             std::initializer_list<InPlace> in_place = {}) {
  auto allowed = [&](const ArgBytes& w, const ArgBytes& o) {
    for (const InPlace& p : in_place)
      if (std::string(p.written) == w.name && std::string(p.other) == o.name)
        return p.same_layout && w.ptr == o.ptr;
    return false;
  };
  auto refuse = [](const ArgBytes& w, const ArgBytes& o) {
    return Status::Invalid(cat(w.name, ": shares memory with ", o.name, " (", w.name, " at ", w.ptr, ", ", o.name,
                               " at ", o.ptr, "); expected an output with memory of its own, since what a call "
                               "reads while it writes there depends on the order of its work"));
  };
  for (auto w = written.begin(); w != written.end(); ++w) {
    for (auto o = w + 1; o != written.end(); ++o)
      if (surely_overlap(*w, *o) && !allowed(*w, *o) && !allowed(*o, *w)) return refuse(*o, *w);
    for (const ArgBytes& r : read)
      if (surely_overlap(*w, r) && !allowed(*w, r)) return refuse(*w, r);
  }
  return Status::Ok();
}

// Bytes of a given argument ([dims] of elem-byte elements); 0 when absent (or
// when the count overflows, which the validators refuse before they get here).
inline int64_t arg_bytes(const void* ptr, std::initializer_list<int64_t> dims, int64_t elem) {
  int64_t n = 0;
  return ptr != nullptr && tensor_fits(dims, elem, &n) ? n * elem : 0;
}

// What the token inputs of ForwardArgs or DecodeArgs read: q, k, v, g, beta over
// `tokens` tokens, A_log, dt_bias and the N + 1 boundaries (forward, decode and
// segment_summaries).
template <class Args>
std::vector<ArgBytes> token_input_bytes(const Args& a, int64_t HV, int64_t N, int64_t tokens) {
  const int64_t K = a.head_dim_k, V = a.head_dim_v;
  const std::array<TokenView, 5> views = token_views(a, a.num_heads, HV, K, V);
  return {token_view_bytes(views[0], a.q, tokens), token_view_bytes(views[1], a.k, tokens),
          token_view_bytes(views[2], a.v, tokens), token_view_bytes(views[3], a.g, tokens),
          token_view_bytes(views[4], a.beta, tokens), dense_bytes("A_log", a.A_log, arg_bytes(a.A_log, {HV}, 4)),
          dense_bytes("dt_bias", a.dt_bias, arg_bytes(a.dt_bias, {HV, K}, 4)),
          dense_bytes("cu_seqlens", a.cu_seqlens, arg_bytes(a.cu_seqlens, {N + 1}, 8)),
          dense_bytes("cu_seqlens_int32", a.cu_seqlens_int32, arg_bytes(a.cu_seqlens_int32, {N + 1}, 4))};
}
// A forward's (ForwardArgs: the flattened batch's tokens, its N sequences).
inline std::vector<ArgBytes> forward_input_bytes(const ForwardArgs& a) {
  return token_input_bytes(a, value_heads(a), num_sequences(a), a.batch * a.seqlen);
}

// Every output of a forward (ForwardArgs) against every argument; validate()
// runs it after its other checks (validate.cpp).
Status check_forward_overlaps(const ForwardArgs& a);
// The same for a decode step (decode.cpp).
Status check_decode_overlaps(const DecodeArgs& a);
// The `bytes` of scratch a forward writes at `workspace` (kCuda) against every
// argument of `a`: a workspace inside out or an input would be a silent wrong
// answer (forward.cpp, before the launch; validate.cpp).
Status check_workspace_overlaps(const ForwardArgs& a, const void* workspace, int64_t bytes);

}  // namespace flashkda::validation
