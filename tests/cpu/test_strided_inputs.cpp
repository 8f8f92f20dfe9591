// Strided token tensors (ForwardArgs::*_token_stride / *_head_stride) on the CPU
// backends: q, k, v, g and beta as views of one fused per-token projection give
// bitwise the dense run (forward, through the C ABI, and segment summaries);
// negative strides, and strides kCuda cannot read as 16-byte rows, are rejected by name.
#include <gtest/gtest.h>

#include <vector>

#include "cpu_test_util.h"
#include "flashkda/flashkda_c.h"

namespace flashkda::testing {
namespace {

// Per token: [q (H·K) | k (H·K) | v (HV·V) | g (HV·K) | beta (HV) | pad], so every
// tensor has token stride `width` and its natural head stride.
struct Fused {
  std::vector<uint16_t> buf;
  int64_t width = 0, q0 = 0, k0 = 0, v0 = 0, g0 = 0, beta0 = 0;
};

Fused fuse(const HostProblem& p) {
  const int64_t T = p.B * p.T, H = p.H, HV = p.HV, K = p.K, V = p.V;
  Fused f;
  f.q0 = 0;
  f.k0 = H * K;
  f.v0 = 2 * H * K;
  f.g0 = f.v0 + HV * V;
  f.beta0 = f.g0 + HV * K;
  f.width = f.beta0 + HV + 8;  // padding after beta
  f.buf.assign(static_cast<size_t>(T * f.width), 0x7fc1);  // NaN bits in the padding
  for (int64_t t = 0; t < T; ++t) {
    uint16_t* row = f.buf.data() + t * f.width;
    for (int64_t i = 0; i < H * K; ++i) row[f.q0 + i] = p.q[static_cast<size_t>(t * H * K + i)];
    for (int64_t i = 0; i < H * K; ++i) row[f.k0 + i] = p.k[static_cast<size_t>(t * H * K + i)];
    for (int64_t i = 0; i < HV * V; ++i) row[f.v0 + i] = p.v[static_cast<size_t>(t * HV * V + i)];
    for (int64_t i = 0; i < HV * K; ++i) row[f.g0 + i] = p.g[static_cast<size_t>(t * HV * K + i)];
    for (int64_t i = 0; i < HV; ++i) row[f.beta0 + i] = p.beta[static_cast<size_t>(t * HV + i)];
  }
  return f;
}

ForwardArgs strided_args(const HostProblem& p, const Fused& f, void* out, void* fin) {
  ForwardArgs a = p.host_args(out, fin);
  a.q = f.buf.data() + f.q0;
  a.k = f.buf.data() + f.k0;
  a.v = f.buf.data() + f.v0;
  a.g = f.buf.data() + f.g0;
  a.beta = f.buf.data() + f.beta0;
  a.q_token_stride = a.k_token_stride = a.v_token_stride = a.g_token_stride = a.beta_token_stride = f.width;
  a.q_head_stride = a.k_head_stride = p.K;
  a.v_head_stride = p.V;
  a.g_head_stride = p.K;
  a.beta_head_stride = 1;
  return a;
}

TEST(StridedInputs, FusedProjectionViewsAreBitwiseTheDenseRun) {
  ProblemSpec spec;
  spec.seqlens = {37, 0, 64, 21};
  spec.heads = 2;
  spec.v_heads = 4;
  const HostProblem p = make_problem_kv(spec, 32, 16, 91);
  const Fused f = fuse(p);
  for (const Backend backend : {Backend::kCpuReference, Backend::kCpuChunked}) {
    const RunResult dense = run_backend(p, backend == Backend::kCpuReference ? Which::kReference : Which::kChunked);
    std::vector<uint16_t> out(p.out_elems());
    std::vector<float> fin(p.state_elems());
    const ForwardArgs a = strided_args(p, f, out.data(), fin.data());
    const Status st = forward(a, backend, nullptr, 0, nullptr);
    ASSERT_TRUE(st.ok()) << st.message;
    EXPECT_EQ(out, dense.out);
    EXPECT_EQ(fin, dense.final_f32);

    // Segment summaries read the views too.
    const std::vector<int64_t> segs = {0, 37, 101, 122};
    std::vector<float> M1, B1, M2, B2;
    ASSERT_TRUE(summaries_of(p.host_args(nullptr, nullptr), segs, backend, M1, B1).ok());
    ASSERT_TRUE(summaries_of(strided_args(p, f, nullptr, nullptr), segs, backend, M2, B2).ok());
    EXPECT_EQ(M1, M2);
    EXPECT_EQ(B1, B2);
  }
}

TEST(StridedInputs, BadStridesAreNamed) {
  ProblemSpec spec;
  spec.seqlen = 20;
  spec.heads = 1;
  spec.head_dim = 16;
  const HostProblem p = make_problem(spec, 92);
  const Fused f = fuse(p);
  std::vector<uint16_t> out(p.out_elems());
  std::vector<float> fin(p.state_elems());
  ForwardArgs a = strided_args(p, f, out.data(), fin.data());
  EXPECT_TRUE(validate(a, Backend::kCpuChunked).ok());
  {
    // kCuda copies 16-byte rows: strides must be multiples of 8 elements.
    ForwardArgs c = a;
    c.q_token_stride = 8 * (f.width / 8 + 1) + 4;
    expect_invalid(c, Backend::kCuda, StatusCode::kInvalidArgument, "q_token_stride / q_head_stride: backend kCuda");
    c = a;
    c.q_token_stride = c.k_token_stride = c.v_token_stride = c.g_token_stride = 8 * (f.width / 8 + 1);
    const Status cuda = validate(c, Backend::kCuda);
    EXPECT_EQ(cuda.message.find("stride"), std::string::npos) << cuda.message;
  }
  a.g_head_stride = -16;
  expect_invalid(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, "g_token_stride / g_head_stride");
  a.g_head_stride = 16;
  a.v_token_stride = int64_t{1} << 62;
  expect_invalid(a, Backend::kCpuChunked, StatusCode::kInvalidArgument,
                 "v_token_stride / v_head_stride: the farthest byte");
  a.v_token_stride = 0;
  // Within int64 as elements but not as bytes (2 bytes an element): counted in
  // elements this passed, and the CPU backend's copy read far outside q.
  a.q_head_stride = int64_t{1} << 62;  // one head: the stride's own bytes overflow
  expect_invalid(a, Backend::kCpuChunked, StatusCode::kInvalidArgument,
                 "q_token_stride / q_head_stride: the farthest byte (token 19, head 0)");
  a.q_head_stride = 0;
  a.q_token_stride = (int64_t{1} << 62) / 19 + 1;  // 19 · stride + 16 < 2^63, but not < 2^62
  expect_invalid(a, Backend::kCpuReference, StatusCode::kInvalidArgument,
                 "q_token_stride / q_head_stride: the farthest byte (token 19, head 0)");
  a.q_token_stride = 0;
  EXPECT_TRUE(validate(a, Backend::kCpuChunked).ok());
}

}  // namespace
}  // namespace flashkda::testing
