// Random calls of the chunked CPU backend (kCpuChunked, the fp32 chunk-16
// algorithm the kernels run) against the float64 reference, every feature drawn
// at once (tests/common/random_calls.h says which; head dims 16-64 keep the
// reference quick): the results sequence by sequence, entry by entry and slot by
// slot within spec section 2's bars, and nothing written outside the tensors or
// into what no sequence owns. Drawn as the GPU's random calls are (the head dims
// apart), so the oracle those are judged against is itself judged on the features
// meeting.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>

#include "tests/common/accuracy_bars.h"
#include "tests/common/random_calls.h"

namespace flashkda::testing {
namespace {

using namespace random_calls;

// out after both sides' bf16 rounding: the reference's rounding adds at most
// 2^-9 of each element (relative). fp32 states and checkpoints: the chunked
// backend's own bar (test_chunked.cpp), far inside spec section 2's (these draws
// measured <= 1.2e-6); through bf16, the spec's.
constexpr double kBf16Rounding = 1.0 / 512;
constexpr double kChunkedFp32StateBar = 1e-4;
constexpr int kCalls = 200;

class CpuRandomCalls : public ::testing::TestWithParam<int> {};

TEST_P(CpuRandomCalls, MatchTheReference) {
  const Call c = draw_call(static_cast<uint64_t>(GetParam()), HeadDims::kSmall);
  SCOPED_TRACE(c.what);
  const Results ref = run_on_host(c, Backend::kCpuReference);
  const Results got = run_on_host(c, Backend::kCpuChunked);
  const Worst w = compare(c, got, ref, Bars{kOutBar + kBf16Rounding, kChunkedFp32StateBar, kBf16StateBar});
  std::printf("[ errors ] random call %d %s: out %.3e state %.3e checkpoints %.3e\n", GetParam(), c.what.c_str(),
              w.out, w.state, w.checkpoints);
}

INSTANTIATE_TEST_SUITE_P(Seeds, CpuRandomCalls, seeds(kCalls));

}  // namespace
}  // namespace flashkda::testing
