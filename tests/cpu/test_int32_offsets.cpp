// cu_seqlens as int32 (ForwardArgs::cu_seqlens_int32, vLLM's offsets) on the CPU
// backends: bitwise the int64 run (forward, a state pool with checkpoints, segment
// summaries), its values checked like the int64 ones, and named errors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cpu_test_util.h"

namespace flashkda::testing {
namespace {

TEST(Int32Offsets, ForwardIsBitwiseTheInt64Run) {
  const HostProblem p = varlen_gva_problem(81);
  const std::vector<int32_t> cu32(p.cu_seqlens.begin(), p.cu_seqlens.end());
  for (const Backend backend : {Backend::kCpuReference, Backend::kCpuChunked}) {
    std::vector<uint16_t> o64(p.out_elems()), o32(p.out_elems());
    std::vector<float> f64(p.state_elems()), f32(p.state_elems());
    // Checkpoints too: their offsets come from the boundaries.
    std::vector<float> c64(static_cast<size_t>(8 * p.HV * p.V * p.K)), c32(c64.size());
    ForwardArgs a = p.host_args(o64.data(), f64.data());
    a.checkpoints = c64.data();
    a.checkpoints_dtype = DType::kFP32;
    a.checkpoint_interval = 32;
    a.checkpoints_capacity = 8;
    ASSERT_TRUE(forward(a, backend, nullptr, 0, nullptr).ok());
    ForwardArgs b = a;
    b.out = o32.data();
    b.final_state = f32.data();
    b.checkpoints = c32.data();
    b.cu_seqlens = nullptr;
    b.cu_seqlens_host = nullptr;
    b.cu_seqlens_int32 = cu32.data();
    const Status st = forward(b, backend, nullptr, 0, nullptr);
    ASSERT_TRUE(st.ok()) << st.message;
    EXPECT_EQ(o32, o64);
    EXPECT_EQ(f32, f64);
    EXPECT_EQ(c32, c64);

    // Segment summaries read the same boundaries.
    const std::vector<int64_t> segs = {0, 37, 37, 101, 110, 122};
    std::vector<float> M64, B64, M32, B32;
    ASSERT_TRUE(summaries_of(p.host_args(nullptr, nullptr), segs, backend, M64, B64).ok());
    ForwardArgs in32 = p.host_args(nullptr, nullptr);
    in32.cu_seqlens = nullptr;
    in32.cu_seqlens_host = nullptr;
    in32.cu_seqlens_int32 = cu32.data();
    const Status ss = summaries_of(in32, segs, backend, M32, B32);
    ASSERT_TRUE(ss.ok()) << ss.message;
    EXPECT_EQ(M32, M64);
    EXPECT_EQ(B32, B64);
  }
}

TEST(Int32Offsets, BadArgumentsAreNamed) {
  const HostProblem p = varlen_gva_problem(82);
  std::vector<int32_t> cu32(p.cu_seqlens.begin(), p.cu_seqlens.end());
  std::vector<uint16_t> out(p.out_elems());
  std::vector<float> fin(p.state_elems());
  ForwardArgs a = p.host_args(out.data(), fin.data());
  a.cu_seqlens_host = nullptr;
  a.cu_seqlens_int32 = cu32.data();
  expect_invalid(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, "cu_seqlens_int32: given together with cu_seqlens");
  a.cu_seqlens = nullptr;
  EXPECT_TRUE(validate(a, Backend::kCpuChunked).ok());
  // kCuda reads int32 boundaries on the device: no longer refused for them (it
  // may still be unavailable here, for its own reason).
  {
    const Status cuda = validate(a, Backend::kCuda);
    EXPECT_EQ(cuda.message.find("cu_seqlens_int32"), std::string::npos) << cuda.message;
  }
  // The boundaries are checked as int64 ones; the messages name the caller's argument.
  cu32[0] = 1;
  expect_invalid(a, Backend::kCpuChunked, StatusCode::kInvalidArgument,
                 "cu_seqlens_int32: expected cu_seqlens_int32[0] == 0, got 1");
  cu32[0] = 0;
  cu32[2] = 10;  // below cu[1] = 37
  expect_invalid(a, Backend::kCpuReference, StatusCode::kInvalidArgument,
                 "cu_seqlens_int32: expected non-decreasing values, got cu_seqlens_int32[2]=10");
  cu32[2] = 37;
  cu32.back() = 130;  // T = 122
  expect_invalid(a, Backend::kCpuReference, StatusCode::kInvalidArgument, "== seqlen=122");
  cu32.back() = 122;
  a.batch = 2;
  expect_invalid(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, "cu_seqlens_int32: requires batch == 1");
  a.batch = 1;
  // A sequence count no host array can hold: named, not an internal error.
  a.num_seqs = int64_t{1} << 58;
  expect_invalid(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, "num_seqs: 288230376151711744 + 1 boundaries");
  a.num_seqs = 0;
  expect_invalid(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, "num_seqs");
}

}  // namespace
}  // namespace flashkda::testing
