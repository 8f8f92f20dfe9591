// The CPU decode: equal to the forward oracle run from the pooled state, padding
// and unused slots untouched, per-token states, the out pool, validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cpu/cpu_backends.h"
#include "tests/common/decode_problem.h"
#include "tests/common/kda_problem.h"

namespace flashkda::testing {
namespace {

// The forward oracle on sequence n's tokens, starting from its pooled state.
void forward_from_pool(const DecodeProblem& p, int64_t n, std::vector<float>* out, std::vector<float>* final_state) {
  const int64_t t0 = p.cu_seqlens.empty() ? n * p.spec.tokens_per_seq : p.cu_seqlens[n];
  const int64_t t1 = p.cu_seqlens.empty() ? t0 + p.spec.tokens_per_seq : p.cu_seqlens[n + 1];
  const int64_t L = t1 - t0;
  auto slice = [&](const std::vector<uint16_t>& x, int64_t width) {
    return std::vector<uint16_t>(x.begin() + t0 * width, x.begin() + t1 * width);
  };
  const auto q = slice(p.q, p.H * p.K), k = slice(p.k, p.H * p.K), v = slice(p.v, p.HV * p.V),
             g = slice(p.g, p.HV * p.K), beta = slice(p.beta, p.HV);
  std::vector<float> init(p.pool_f32.begin() + p.index(n) * p.per_slot,
                          p.pool_f32.begin() + (p.index(n) + 1) * p.per_slot);
  std::vector<uint16_t> out_bits(static_cast<size_t>(L * p.HV * p.V));
  final_state->assign(static_cast<size_t>(p.per_slot), 0.f);
  out->assign(out_bits.size(), 0.f);
  ForwardArgs a;
  a.q = q.data(); a.k = k.data(); a.v = v.data(); a.g = g.data(); a.beta = beta.data();
  a.A_log = p.A_log.data(); a.dt_bias = p.dt_bias.data(); a.out = out_bits.data();
  a.initial_state = init.data(); a.initial_state_dtype = DType::kFP32;
  a.final_state = final_state->data(); a.final_state_dtype = DType::kFP32;
  a.batch = 1; a.seqlen = L; a.num_heads = p.H; a.num_v_heads = p.HV; a.head_dim_k = p.K; a.head_dim_v = p.V;
  a.scale = p.scale; a.lower_bound = -5.f;
  ASSERT_TRUE(cpu::reference_forward_f64(a, out->data()).ok());
}

// Five sequences of 1-4 tokens, GVA, one padding entry.
DecodeSpec mixed_spec() {
  DecodeSpec spec;
  spec.seq_tokens = {1, 3, 2, 1, 4};
  spec.heads = 2;
  spec.v_heads = 4;
  spec.head_dim = 32;
  spec.padding_entries = 1;
  return spec;
}

TEST(Decode, MatchesForwardOracleFromPooledState) {
  const DecodeProblem p = make_decode_problem(mixed_spec(), 11);
  std::vector<uint16_t> out(static_cast<size_t>(p.T * p.HV * p.V), 0x7fc0);
  std::vector<uint8_t> pool = p.pool_bytes();
  const std::vector<uint8_t> before = pool;
  ASSERT_TRUE(decode(p.args(out.data(), pool.data(), nullptr), Backend::kCpuReference, nullptr).ok());
  const std::vector<float> after = state_bytes_to_float(pool, DType::kFP32);

  std::vector<bool> used(static_cast<size_t>(p.pool_size), false);
  for (int64_t n = 0; n < p.N; ++n) {
    if (p.index(n) < 0) continue;
    used[static_cast<size_t>(p.index(n))] = true;
    std::vector<float> ref_out, ref_state;
    forward_from_pool(p, n, &ref_out, &ref_state);
    const float* got_state = after.data() + p.index(n) * p.per_slot;
    EXPECT_LE(rel_rms(got_state, ref_state.data(), ref_state.size()), 1e-6) << "sequence " << n;
    const int64_t t0 = p.cu_seqlens[n];
    std::vector<float> got_out;
    for (size_t i = 0; i < ref_out.size(); ++i) got_out.push_back(bf16_to_float(out[t0 * p.HV * p.V + i]));
    // out is bf16 (its own rounding, ~1.6e-3 against the unrounded oracle).
    EXPECT_LE(rel_rms(got_out.data(), ref_out.data(), ref_out.size()), 3e-3) << "sequence " << n;
  }
  // Unused slots and the padding sequence's tokens are untouched.
  for (int64_t s = 0; s < p.pool_size; ++s)
    if (!used[static_cast<size_t>(s)])
      EXPECT_EQ(0, std::memcmp(pool.data() + s * p.per_slot * 4, before.data() + s * p.per_slot * 4, p.per_slot * 4))
          << "slot " << s;
  for (int64_t i = 0; i < p.cu_seqlens[1] * p.HV * p.V; ++i) ASSERT_EQ(out[i], 0x7fc0) << "padding output " << i;
}

// exp(A_log) past double's range where g + dt_bias is 0: the gate is sigmoid(0),
// as with any finite A_log (common/gate.h), not sigmoid(inf · 0) = NaN. With
// g = dt_bias = 0 everywhere, A_log = 710 or inf is bitwise the call with A_log = 0.
TEST(Decode, OverflowingExpALogAtAZeroGateArgument) {
  DecodeProblem p = make_decode_problem(mixed_spec(), 12);
  std::fill(p.g.begin(), p.g.end(), uint16_t{0});
  std::fill(p.dt_bias.begin(), p.dt_bias.end(), 0.f);
  auto run = [&](float a_log, Backend backend) {
    std::fill(p.A_log.begin(), p.A_log.end(), a_log);
    std::vector<uint16_t> out(static_cast<size_t>(p.T * p.HV * p.V), 0);
    std::vector<uint8_t> pool = p.pool_bytes();
    const Status st = decode(p.args(out.data(), pool.data(), nullptr), backend, nullptr);
    EXPECT_TRUE(st.ok()) << st.message;
    return std::pair{out, pool};
  };
  for (Backend backend : {Backend::kCpuReference, Backend::kCpuChunked}) {
    const auto plain = run(0.f, backend);
    for (const float a_log : {710.f, std::numeric_limits<float>::infinity()}) {
      const auto big = run(a_log, backend);
      EXPECT_EQ(big.first, plain.first) << to_string(backend) << ", A_log = " << a_log;
      EXPECT_EQ(big.second, plain.second) << to_string(backend) << ", A_log = " << a_log;
    }
  }
}

void expect_invalid(const Status& s, const char* name) {
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument) << s.message;
  EXPECT_NE(s.message.find(name), std::string::npos) << s.message;
}

// Token tensors as views of one fused projection output ([T, width] rows, each
// tensor a column range, heads padded apart): bitwise the dense decode on both
// CPU backends; a negative stride is refused by name.
TEST(Decode, StridedTokenViewsAreTheDenseDecode) {
  DecodeSpec spec;
  spec.num_seqs = 3;
  spec.tokens_per_seq = 2;
  spec.heads = 2;
  spec.v_heads = 4;
  spec.head_dim = 16;
  const DecodeProblem p = make_decode_problem(spec, 16);
  const FusedTokenViews fused = fused_token_views(p, /*pad=*/3);
  for (Backend b : {Backend::kCpuReference, Backend::kCpuChunked}) {
    std::vector<uint16_t> out_dense(static_cast<size_t>(p.T * p.HV * p.V)), out_view(out_dense.size());
    std::vector<uint8_t> pool_dense = p.pool_bytes(), pool_view = p.pool_bytes();
    ASSERT_TRUE(decode(p.args(out_dense.data(), pool_dense.data(), nullptr), b, nullptr).ok());
    DecodeArgs a = p.args(out_view.data(), pool_view.data(), nullptr);
    fused.apply(a, fused.data.data(), p);
    const Status s = decode(a, b, nullptr);
    ASSERT_TRUE(s.ok()) << s.message;
    EXPECT_EQ(out_view, out_dense) << to_string(b);
    EXPECT_EQ(pool_view, pool_dense) << to_string(b);
    a.v_head_stride = -1;
    expect_invalid(validate_decode(a, b), "v_token_stride / v_head_stride: expected values >= 0");
  }
}

// Head-major views (x.view(H, T, K).transpose(0, 1): token stride K, head stride
// T·K). The CUDA decode keeps strides as int32, so it refuses a view
// whose last head starts 2^31 elements or more in, naming the stride, before it
// asks for a device (an argument check); one head less is accepted. The CPU
// backends take any.
TEST(Decode, HeadStridesPastTheCudaOffsetsAreNamed) {
  DecodeSpec spec;
  spec.num_seqs = 2;
  spec.heads = 65;
  spec.head_dim = 16;
  const DecodeProblem p = make_decode_problem(spec, 18);
  std::vector<uint16_t> out(static_cast<size_t>(p.T * p.HV * p.V));
  std::vector<uint8_t> pool = p.pool_bytes();
  DecodeArgs a = p.args(out.data(), pool.data(), nullptr);
  a.q_token_stride = 16;
  a.q_head_stride = int64_t{1} << 25;  // 64 x 2^25 = 2^31: one past the last offset
  const Status st = validate_decode(a, Backend::kCuda);
  if (st.message.find("no CUDA kernels") != std::string::npos) GTEST_SKIP() << st.message;
  EXPECT_EQ(st.code, StatusCode::kNotSupported) << st.message;
  EXPECT_NE(st.message.find("q_head_stride: the CUDA decode needs (heads - 1) x head stride below 2^31 elements "
                            "(got 64 x 33554432)"),
            std::string::npos)
      << st.message;
  a.q_head_stride = (int64_t{1} << 25) - 1;  // 64 x (2^25 - 1) < 2^31
  const Status ok = validate_decode(a, Backend::kCuda);
  EXPECT_EQ(ok.message.find("q_head_stride"), std::string::npos) << ok.message;
  // A dense head stride (the row width) is bounded the same way: token strides
  // smaller than heads x width (overlapping tokens) leave 2^27 + 1 heads of 16
  // columns reaching 2^31. Only arguments are read: nothing this large exists.
  DecodeArgs wide = p.args(out.data(), pool.data(), nullptr);
  wide.num_heads = wide.num_v_heads = (int64_t{1} << 27) + 1;
  wide.pool_size = 1;
  wide.q_token_stride = wide.k_token_stride = wide.v_token_stride = wide.g_token_stride = 16;
  const Status dense = validate_decode(wide, Backend::kCuda);
  EXPECT_EQ(dense.code, StatusCode::kNotSupported) << dense.message;
  EXPECT_NE(dense.message.find("q_head_stride: the CUDA decode needs (heads - 1) x head stride below 2^31 elements "
                               "(got 134217728 x 16)"),
            std::string::npos)
      << dense.message;
}

TEST(Decode, PerTokenStatesAndOutPool) {
  DecodeSpec spec;
  spec.num_seqs = 3;
  spec.tokens_per_seq = 3;
  spec.heads = 2;
  spec.head_dim = 16;
  spec.per_token_states = true;
  spec.state_dtype = DType::kBF16;
  spec.int64_indices = true;
  const DecodeProblem p = make_decode_problem(spec, 12);
  std::vector<uint16_t> out(static_cast<size_t>(p.T * p.HV * p.V));
  const std::vector<uint8_t> pool = p.pool_bytes();
  std::vector<uint8_t> pool_in = pool, pool_out(pool.size(), 0xAB);
  std::vector<uint16_t> per_token(static_cast<size_t>(p.T * p.per_slot));
  DecodeArgs a = p.args(out.data(), pool_in.data(), per_token.data());
  a.state_out_pool = pool_out.data();
  ASSERT_TRUE(decode(a, Backend::kCpuChunked, nullptr).ok());
  EXPECT_EQ(pool_in, pool) << "with an out pool the input pool is read only";
  for (int64_t n = 0; n < p.N; ++n) {
    const int64_t slot = p.index(n), last = (n + 1) * spec.tokens_per_seq - 1;
    // The state after the sequence's last token is its final state, bitwise.
    EXPECT_EQ(0, std::memcmp(per_token.data() + last * p.per_slot, pool_out.data() + slot * p.per_slot * 2,
                             p.per_slot * 2));
  }
  // The state after the first token equals a one-token decode.
  DecodeSpec one = spec;
  one.tokens_per_seq = 1;
  DecodeProblem q1 = p;
  q1.spec = one;
  q1.T = p.N;
  auto take_first = [&](const std::vector<uint16_t>& x, int64_t width) {
    std::vector<uint16_t> y;
    for (int64_t n = 0; n < p.N; ++n)
      y.insert(y.end(), x.begin() + n * 3 * width, x.begin() + (n * 3 + 1) * width);
    return y;
  };
  q1.q = take_first(p.q, p.H * p.K); q1.k = take_first(p.k, p.H * p.K); q1.v = take_first(p.v, p.HV * p.V);
  q1.g = take_first(p.g, p.HV * p.K); q1.beta = take_first(p.beta, p.HV);
  std::vector<uint16_t> out1(static_cast<size_t>(p.N * p.HV * p.V));
  std::vector<uint8_t> pool1 = pool;
  ASSERT_TRUE(decode(q1.args(out1.data(), pool1.data(), nullptr), Backend::kCpuChunked, nullptr).ok());
  for (int64_t n = 0; n < p.N; ++n)
    EXPECT_EQ(0, std::memcmp(per_token.data() + n * 3 * p.per_slot, pool1.data() + p.index(n) * p.per_slot * 2,
                             p.per_slot * 2))
        << "sequence " << n;
}

// A sequence with no tokens (cu_seqlens[n] == cu_seqlens[n+1]) keeps its state:
// in place its slot is left bitwise as it was, and with an out pool the state is
// copied there; the sequences around it run as they would without it.
TEST(Decode, SequencesWithoutTokensKeepTheirState) {
  for (const DType dtype : {DType::kFP32, DType::kBF16}) {
    SCOPED_TRACE(to_string(dtype));
    DecodeSpec spec;
    spec.seq_tokens = {2, 0, 3, 0, 1, 0};
    spec.heads = 2;
    spec.v_heads = 4;
    spec.head_dim = 16;
    spec.state_dtype = dtype;
    const DecodeProblem p = make_decode_problem(spec, 29);
    const size_t es = dtype == DType::kFP32 ? 4 : 2, slot_bytes = static_cast<size_t>(p.per_slot) * es;
    const std::vector<uint8_t> initial = p.pool_bytes();
    std::vector<uint16_t> out(static_cast<size_t>(p.T * p.HV * p.V));
    std::vector<uint8_t> in_place = initial, pool_in = initial, pool_out(initial.size(), 0xAB);
    ASSERT_TRUE(decode(p.args(out.data(), in_place.data(), nullptr), Backend::kCpuReference, nullptr).ok());
    DecodeArgs a = p.args(out.data(), pool_in.data(), nullptr);
    a.state_out_pool = pool_out.data();
    ASSERT_TRUE(decode(a, Backend::kCpuReference, nullptr).ok());
    // The same call without the empty sequences.
    DecodeSpec dense = spec;
    dense.seq_tokens = {2, 3, 1};
    DecodeProblem d = p;
    d.spec = dense;
    d.N = 3;
    d.cu_seqlens = {0, 2, 5, 6};
    d.idx32 = {p.idx32[0], p.idx32[2], p.idx32[4]};
    d.idx64 = {p.idx64[0], p.idx64[2], p.idx64[4]};
    std::vector<uint16_t> out_dense(out.size());
    std::vector<uint8_t> pool_dense = initial;
    ASSERT_TRUE(decode(d.args(out_dense.data(), pool_dense.data(), nullptr), Backend::kCpuReference, nullptr).ok());
    EXPECT_EQ(out, out_dense);
    EXPECT_EQ(in_place, pool_dense) << "the empty sequences' slots are left as they were";
    for (int64_t n = 0; n < p.N; ++n) {
      const size_t off = static_cast<size_t>(p.index(n)) * slot_bytes;
      EXPECT_EQ(0, std::memcmp(pool_out.data() + off, in_place.data() + off, slot_bytes)) << "sequence " << n;
    }
    EXPECT_EQ(pool_in, initial) << "with an out pool the input pool is read only";
  }
}

Status decode_with(const DecodeProblem& p, void (*edit)(DecodeArgs&)) {
  std::vector<uint16_t> out(static_cast<size_t>(p.T * p.HV * p.V));
  std::vector<uint8_t> pool = p.pool_bytes();
  DecodeArgs a = p.args(out.data(), pool.data(), nullptr);
  edit(a);
  return decode(a, Backend::kCpuChunked, nullptr);
}


TEST(DecodeValidation, MessagesNameTheArgument) {
  DecodeSpec spec;
  spec.num_seqs = 2;
  spec.head_dim = 16;
  const DecodeProblem p = make_decode_problem(spec, 13);
  expect_invalid(decode_with(p, [](DecodeArgs& a) { a.lower_bound = 0.f; }), "lower_bound");
  expect_invalid(decode_with(p, [](DecodeArgs& a) { a.state_dtype = DType::kNone; }),
                 "state_dtype: expected kFP32 or kBF16, got kNone");
  expect_invalid(decode_with(p, [](DecodeArgs& a) { a.state_dtype = static_cast<DType>(5); }),
                 "state_dtype: expected kFP32 or kBF16, got value 5");
  expect_invalid(decode_with(p, [](DecodeArgs& a) { a.index_type = static_cast<IndexType>(9); }),
                 "index_type: unknown value 9 (expected kInt32=0 or kInt64=1)");
  expect_invalid(decode_with(p, [](DecodeArgs& a) { a.pool_stride = 5; }), "pool_stride");
  expect_invalid(decode_with(p, [](DecodeArgs& a) { a.total_tokens += 1; }), "total_tokens");
  expect_invalid(decode_with(p, [](DecodeArgs& a) { a.state_indices = nullptr; }), "state_indices");
  expect_invalid(decode_with(p, [](DecodeArgs& a) { a.pool_size = 1; }), "state_indices");
  expect_invalid(decode_with(p, [](DecodeArgs& a) { a.num_v_heads = 3; }), "num_v_heads");
  expect_invalid(decode_with(p, [](DecodeArgs& a) { a.tokens_per_seq = 0; }), "tokens_per_seq");
  expect_invalid(decode_with(p, [](DecodeArgs& a) { a.programmatic_dependent_launch = static_cast<PdlMode>(5); }),
                 "programmatic_dependent_launch");
  expect_invalid(decode_with(p, [](DecodeArgs& a) { a.head_dim_k = 0; }), "head_dim_k: expected a value >= 1, got 0");
  // A valid shape no backend runs: kNotSupported, naming the dimension.
  const Status big = decode_with(p, [](DecodeArgs& a) { a.head_dim_v = 300; });
  EXPECT_EQ(big.code, StatusCode::kNotSupported) << big.message;
  EXPECT_NE(big.message.find("head_dim_v: the decode runs head dims in [1, 256], got 300"), std::string::npos) << big.message;
}

// Counts that would wrap before anything is read: int32 boundaries of 2^62
// sequences (read past the widened copy before), a pool whose bytes overflow int64,
// a misaligned host copy of the boundaries on kCuda (named as passed).
TEST(DecodeValidation, CountsThatWouldWrapAreStatuses) {
  DecodeSpec spec;
  spec.num_seqs = 2;
  spec.head_dim = 16;
  const DecodeProblem p = make_decode_problem(spec, 15);
  std::vector<uint16_t> out(static_cast<size_t>(p.T * p.HV * p.V));
  std::vector<uint8_t> pool = p.pool_bytes();
  const DecodeArgs base = p.args(out.data(), pool.data(), nullptr);
  std::vector<int32_t> cu32 = {0, 1, 2};
  DecodeArgs a = base;
  a.cu_seqlens_int32 = cu32.data();
  a.num_seqs = int64_t{1} << 62;
  for (Backend b : {Backend::kCpuChunked, Backend::kCuda}) expect_invalid(validate_decode(a, b), "num_seqs");
  a.num_seqs = 2;
  a.total_tokens = int64_t{1} << 31;  // beyond what int32 boundaries reach
  for (Backend b : {Backend::kCpuChunked, Backend::kCuda}) expect_invalid(validate_decode(a, b), "cu_seqlens_int32");
  a = base;
  a.pool_stride = int64_t{1} << 61;  // 4-byte states: 2^63 bytes a slot
  expect_invalid(validate_decode(a, Backend::kCpuChunked), "pool_size");
  std::vector<int64_t> cu = {0, 1, 2, 0};
  a = base;
  a.cu_seqlens = cu.data();
  a.cu_seqlens_host = reinterpret_cast<const int64_t*>(reinterpret_cast<const char*>(cu.data()) + 4);
  expect_invalid(validate_decode(a, Backend::kCuda), "cu_seqlens_host");
  // On the CPU backends the host copy must be cu_seqlens' copy.
  std::vector<int64_t> copy = {0, 2, 2};
  a = base;
  a.cu_seqlens = cu.data();
  a.cu_seqlens_host = copy.data();
  expect_invalid(validate_decode(a, Backend::kCpuChunked), "cu_seqlens_host: expected a copy of cu_seqlens");
  copy[1] = 1;
  EXPECT_TRUE(validate_decode(a, Backend::kCpuChunked).ok());
}

// The CPU backends ignore the PDL mode, but validate_decode still rejects a value
// outside the enum (C++ callers can cast one in), whichever backend is asked.
TEST(DecodeValidation, PdlModeOutsideTheEnumIsRejected) {
  DecodeSpec spec;
  spec.head_dim = 16;
  const DecodeProblem p = make_decode_problem(spec, 14);
  std::vector<uint16_t> out(static_cast<size_t>(p.T * p.HV * p.V));
  std::vector<uint8_t> pool = p.pool_bytes();
  DecodeArgs a = p.args(out.data(), pool.data(), nullptr);
  EXPECT_EQ(a.programmatic_dependent_launch, PdlMode::kAuto);  // the default
  for (PdlMode m : {PdlMode::kOff, PdlMode::kAuto, PdlMode::kOn}) {
    a.programmatic_dependent_launch = m;
    for (Backend b : {Backend::kCpuReference, Backend::kCpuChunked}) {
      const Status s = validate_decode(a, b);
      EXPECT_TRUE(s.ok()) << static_cast<int>(m) << ": " << s.message;
    }
  }
  a.programmatic_dependent_launch = static_cast<PdlMode>(5);
  for (Backend b : {Backend::kCpuReference, Backend::kCpuChunked, Backend::kCuda}) {
    const Status s = validate_decode(a, b);
    EXPECT_EQ(s.code, StatusCode::kInvalidArgument) << s.message;
    EXPECT_EQ(s.message, "programmatic_dependent_launch: expected -1 (off), 0 (auto) or 1 (on), got 5");
  }
}

}  // namespace
}  // namespace flashkda::testing

namespace flashkda::testing {
namespace {

// Two sequences that name one slot run one after the other on the CPU backends
// (README, "Decode (serving)"): the call equals N calls that each run one
// sequence (the others padding), in sequence order, and gives the same bits on
// every repeat. Run as independent tasks (one value head: neighbouring tasks are
// the sharing sequences), the two raced on the slot: a later sequence read it
// before an earlier one wrote it back.
TEST(Decode, SequencesSharingASlotRunInOrder) {
  DecodeSpec spec;
  spec.seq_tokens = {4, 4, 2, 4, 3};
  spec.heads = 1;
  spec.head_dim = 128;
  DecodeProblem p = make_decode_problem(spec, 21);
  p.idx32[1] = p.idx32[0];  // sequences 0, 1 and 3 share a slot; 2 and 4 another
  p.idx32[3] = p.idx32[0];
  p.idx32[4] = p.idx32[2];
  const size_t out_elems = static_cast<size_t>(p.T * p.HV * p.V);
  for (const Backend backend : {Backend::kCpuReference, Backend::kCpuChunked}) {
    std::vector<uint16_t> want(out_elems, 0x7fc0);
    std::vector<uint8_t> want_pool = p.pool_bytes();
    for (int64_t n = 0; n < p.N; ++n) {
      DecodeProblem one = p;
      for (int64_t m = 0; m < p.N; ++m)
        if (m != n) one.idx32[m] = -1;
      std::vector<uint16_t> out(out_elems, 0x7fc0);
      ASSERT_TRUE(decode(one.args(out.data(), want_pool.data(), nullptr), backend, nullptr).ok());
      for (int64_t t = p.cu_seqlens[n]; t < p.cu_seqlens[n + 1]; ++t)
        std::copy(out.begin() + t * p.HV * p.V, out.begin() + (t + 1) * p.HV * p.V, want.begin() + t * p.HV * p.V);
    }
    for (int repeat = 0; repeat < 20; ++repeat) {
      std::vector<uint16_t> out(out_elems, 0x7fc0);
      std::vector<uint8_t> pool = p.pool_bytes();
      ASSERT_TRUE(decode(p.args(out.data(), pool.data(), nullptr), backend, nullptr).ok());
      ASSERT_EQ(out, want) << "call " << repeat;
      ASSERT_EQ(pool, want_pool) << "call " << repeat;
    }
  }
}

// int32 boundaries (DecodeArgs::cu_seqlens_int32): bitwise the int64 call; both
// kinds at once are refused by name; kCuda takes them (read on the device).
TEST(Decode, Int32BoundariesAreTheInt64Call) {
  const DecodeProblem p = make_decode_problem(mixed_spec(), 15);
  const std::vector<int32_t> cu32(p.cu_seqlens.begin(), p.cu_seqlens.end());
  std::vector<uint16_t> o64(static_cast<size_t>(p.T * p.HV * p.V), 0x7fc0), o32 = o64;
  std::vector<uint8_t> pool64 = p.pool_bytes(), pool32 = pool64;
  ASSERT_TRUE(decode(p.args(o64.data(), pool64.data(), nullptr), Backend::kCpuReference, nullptr).ok());
  DecodeArgs a = p.args(o32.data(), pool32.data(), nullptr);
  a.cu_seqlens = nullptr;
  a.cu_seqlens_host = nullptr;
  a.cu_seqlens_int32 = cu32.data();
  const Status st = decode(a, Backend::kCpuReference, nullptr);
  ASSERT_TRUE(st.ok()) << st.message;
  EXPECT_EQ(o32, o64);
  EXPECT_EQ(pool32, pool64);
  // Without a usable GPU kCuda answers for the device, never for the int32 boundaries.
  const Status cuda = validate_decode(a, Backend::kCuda);
  EXPECT_EQ(cuda.message.find("cu_seqlens_int32"), std::string::npos) << cuda.message;
  a.cu_seqlens = p.cu_seqlens.data();
  const Status both = validate_decode(a, Backend::kCpuReference);
  EXPECT_EQ(both.code, StatusCode::kInvalidArgument);
  EXPECT_NE(both.message.find("cu_seqlens_int32: given together with cu_seqlens"), std::string::npos) << both.message;
}

}  // namespace
}  // namespace flashkda::testing

namespace flashkda::testing {
namespace {

// Speculative verify on pool slots (DecodeArgs::verify_slots, num_accepted_tokens):
// each sequence starts from the slot of its last accepted token and writes the
// state after each token to that token's slot; the oracle is the plain decode
// from the same starting slot with per_token_states.
TEST(DecodeVerify, EachTokensStateGoesToItsSlot) {
  DecodeSpec spec;
  spec.seq_tokens = {3, 1, 2};
  spec.heads = 1;
  spec.v_heads = 2;
  spec.head_dim = 16;
  spec.extra_slots = 7;
  const DecodeProblem p = make_decode_problem(spec, 16);  // N = 3, 10 slots
  ASSERT_GE(p.pool_size, 10);
  constexpr int64_t C = 3;
  // Sequence n's slots: columns 0..2. Sequence 1 has one token and a negative
  // third column; sequence 2 skips the write of its first token.
  const std::vector<int32_t> idx = {0, 1, 2, 3, 4, -1, 5, -1, 6};
  const std::vector<int32_t> accepted = {2, 1, 3};  // start from columns 1, 0, 2
  std::vector<uint16_t> out(static_cast<size_t>(p.T * p.HV * p.V), 0x7fc0);
  std::vector<uint8_t> pool = p.pool_bytes();
  const std::vector<uint8_t> before = pool;
  DecodeArgs a = p.args(out.data(), pool.data(), nullptr);
  a.state_indices = idx.data();
  a.index_type = IndexType::kInt32;
  a.verify_slots = C;
  a.num_accepted_tokens = accepted.data();
  const Status st = decode(a, Backend::kCpuReference, nullptr);
  ASSERT_TRUE(st.ok()) << st.message;

  const size_t slot_bytes = static_cast<size_t>(p.per_slot) * 4;  // fp32 pool
  std::vector<bool> written(static_cast<size_t>(p.pool_size), false);
  for (int64_t n = 0; n < p.N; ++n) {
    const int64_t start = idx[static_cast<size_t>(n * C + accepted[static_cast<size_t>(n)] - 1)];
    const int64_t t0 = p.cu_seqlens[static_cast<size_t>(n)], tn = p.cu_seqlens[static_cast<size_t>(n) + 1] - t0;
    // The oracle: sequence n alone, from `start`, with per-token states.
    std::vector<uint8_t> pool2 = before;
    std::vector<uint16_t> out2(out.size(), 0x7fc0);
    std::vector<float> per_tok(static_cast<size_t>(p.T * p.per_slot));
    std::vector<int32_t> one(static_cast<size_t>(p.N), -1);
    one[static_cast<size_t>(n)] = static_cast<int32_t>(start);
    DecodeArgs b = p.args(out2.data(), pool2.data(), per_tok.data());
    b.state_indices = one.data();
    b.index_type = IndexType::kInt32;
    ASSERT_TRUE(decode(b, Backend::kCpuReference, nullptr).ok());
    for (int64_t t = 0; t < tn; ++t) {
      for (int64_t e = 0; e < p.HV * p.V; ++e)
        EXPECT_EQ(out[static_cast<size_t>((t0 + t) * p.HV * p.V + e)], out2[static_cast<size_t>((t0 + t) * p.HV * p.V + e)]);
      const int64_t s = idx[static_cast<size_t>(n * C + t)];
      if (s < 0) continue;
      written[static_cast<size_t>(s)] = true;
      EXPECT_EQ(0, std::memcmp(pool.data() + s * slot_bytes, per_tok.data() + (t0 + t) * p.per_slot, slot_bytes))
          << "sequence " << n << ", token " << t << ", slot " << s;
    }
  }
  for (int64_t s = 0; s < p.pool_size; ++s)
    if (!written[static_cast<size_t>(s)])
      EXPECT_EQ(0, std::memcmp(pool.data() + s * slot_bytes, before.data() + s * slot_bytes, slot_bytes))
          << "slot " << s << " was written";

  // Bad values, named.
  std::vector<int32_t> bad = accepted;
  bad[1] = 0;
  a.num_accepted_tokens = bad.data();
  Status v = validate_decode(a, Backend::kCpuReference);
  EXPECT_NE(v.message.find("num_accepted_tokens: entry 1 is 0"), std::string::npos) << v.message;
  a.num_accepted_tokens = accepted.data();
  a.verify_slots = 2;  // sequence 0 has 3 tokens
  v = validate_decode(a, Backend::kCpuReference);
  EXPECT_NE(v.message.find("verify_slots: sequence 0 has 3 tokens"), std::string::npos) << v.message;
  a.verify_slots = C;
  // kCuda runs it (without a usable GPU it answers for the device, never for verify).
  const Status cuda = validate_decode(a, Backend::kCuda);
  EXPECT_EQ(cuda.message.find("verify"), std::string::npos) << cuda.message;
}

// One column (fla's serving form with no draft tokens): state_indices [N, 1] with
// num_accepted_tokens, every count 1, is the plain [N] decode step, bitwise on
// both CPU backends; any other count, or a second token, is named.
TEST(DecodeVerify, OneColumnIsThePlainStep) {
  DecodeSpec spec;
  spec.seq_tokens = {1, 1, 1, 1};
  spec.heads = 2;
  spec.head_dim = 16;
  spec.extra_slots = 3;
  const DecodeProblem p = make_decode_problem(spec, 17);
  const std::vector<int32_t> idx = {2, -1, 0, 5};  // one padding entry
  const std::vector<int32_t> ones(idx.size(), 1);
  for (Backend be : {Backend::kCpuReference, Backend::kCpuChunked}) {
    std::vector<uint16_t> out_ref(static_cast<size_t>(p.T * p.HV * p.V), 0x7fc0), out = out_ref;
    std::vector<uint8_t> pool_ref = p.pool_bytes(), pool = pool_ref;
    DecodeArgs ref = p.args(out_ref.data(), pool_ref.data(), nullptr);
    ref.state_indices = idx.data();
    ref.index_type = IndexType::kInt32;
    ASSERT_TRUE(decode(ref, be, nullptr).ok());
    DecodeArgs a = ref;
    a.out = out.data();
    a.state_pool = pool.data();
    a.verify_slots = 1;
    a.num_accepted_tokens = ones.data();
    const Status st = decode(a, be, nullptr);
    ASSERT_TRUE(st.ok()) << st.message;
    EXPECT_EQ(out, out_ref);
    EXPECT_EQ(pool, pool_ref);

    std::vector<int32_t> two = ones;
    two[3] = 2;
    a.num_accepted_tokens = two.data();
    Status v = validate_decode(a, be);
    EXPECT_NE(v.message.find("num_accepted_tokens: entry 3 is 2, expected a value in [1, 1]"), std::string::npos)
        << v.message;
    a.num_accepted_tokens = ones.data();
    a.cu_seqlens = nullptr;
    a.cu_seqlens_host = nullptr;
    a.tokens_per_seq = 2;  // two tokens a sequence, one slot each
    a.total_tokens = 2 * p.N;
    v = validate_decode(a, be);
    EXPECT_NE(v.message.find("verify_slots: sequence 0 has 2 tokens"), std::string::npos) << v.message;
  }
  // num_accepted_tokens still needs the 2-d form.
  DecodeArgs plain = p.args(nullptr, nullptr, nullptr);
  plain.state_indices = idx.data();
  plain.index_type = IndexType::kInt32;
  plain.num_accepted_tokens = ones.data();
  const Status v = validate_decode(plain, Backend::kCpuReference);
  EXPECT_NE(v.message.find("num_accepted_tokens: needs verify_slots >= 1"), std::string::npos) << v.message;
}

}  // namespace
}  // namespace flashkda::testing
