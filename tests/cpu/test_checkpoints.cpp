// Checkpoints for prefix caching (ForwardArgs::checkpoints) on the CPU backends:
// entry offset(n) + j is, bit for bit, the final state of the same backend run on
// the first j·c tokens of sequence n (j = 0: the initial state), in the key-major
// layout of fla's intermediate states or value-major; nothing past the last entry
// is written; bad arguments are named.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "common/sequences.h"
#include "cpu_test_util.h"

namespace flashkda::testing {
namespace {

constexpr int64_t kLargestInterval = INT64_MAX / 16 * 16;

struct CheckpointCase {
  Backend backend;
  int64_t interval;
  DType dtype;
  bool value_major;
};

std::string case_name(const CheckpointCase& c) {
  return std::string(c.backend == Backend::kCpuReference ? "reference" : "chunked") + "_c" +
         std::to_string(c.interval) + (c.dtype == DType::kFP32 ? "_fp32" : "_bf16") +
         (c.value_major ? "_value_major" : "_key_major");
}

class Checkpoints : public ::testing::TestWithParam<CheckpointCase> {};

void check(const HostProblem& p, const CheckpointCase& cc) {
  const int64_t HV = p.HV, K = p.K, V = p.V, c = cc.interval;
  const std::vector<SequenceSpan> spans = sequence_spans(p.host_args(nullptr, nullptr), p.cu_seqlens.data());
  int64_t total = 0;
  // ceil(length / c), written so that it cannot overflow for an interval near 2^63.
  for (const SequenceSpan& s : spans) total += s.length > 0 ? (s.length - 1) / c + 1 : 0;
  const int64_t capacity = total + 2;  // two spare entries: never written
  const size_t elem = cc.dtype == DType::kFP32 ? 4 : 2;
  std::vector<unsigned char> buf(static_cast<size_t>(capacity * HV * K * V) * elem, 0xA5);
  const std::vector<unsigned char> untouched = buf;
  std::vector<uint16_t> out(p.out_elems());
  std::vector<float> fin(p.state_elems());
  ForwardArgs a = p.host_args(out.data(), fin.data());
  a.checkpoints = buf.data();
  a.checkpoints_dtype = cc.dtype;
  a.checkpoint_interval = c;
  a.checkpoints_capacity = capacity;
  a.checkpoints_value_major = cc.value_major;
  const Status st = forward(a, cc.backend, nullptr, 0, nullptr);
  ASSERT_TRUE(st.ok()) << st.message;

  // The outputs and the final state are those of a run without checkpoints.
  const RunResult plain = run_backend(p, cc.backend == Backend::kCpuReference ? Which::kReference : Which::kChunked);
  EXPECT_EQ(out, plain.out);
  EXPECT_EQ(fin, plain.final_f32);

  int64_t entry = 0;
  for (size_t n = 0; n < spans.size(); ++n) {
    for (int64_t j = 0; j * c < spans[n].length; ++j, ++entry) {
      const std::vector<float> want = prefix_state(p, static_cast<int64_t>(n), j * c, cc.backend, initial_of(p, static_cast<int64_t>(n)));
      int64_t bad = 0;
      for (int64_t h = 0; h < HV; ++h)
        for (int64_t e = 0; e < V; ++e)
          for (int64_t d = 0; d < K; ++d) {
            const float w = want[static_cast<size_t>((h * V + e) * K + d)];
            const int64_t at = (entry * HV + h) * K * V + (cc.value_major ? e * K + d : d * V + e);
            if (cc.dtype == DType::kFP32) {
              float got;
              std::memcpy(&got, &buf[static_cast<size_t>(at) * 4], 4);
              bad += std::memcmp(&got, &w, 4) != 0;
            } else {
              uint16_t got;
              std::memcpy(&got, &buf[static_cast<size_t>(at) * 2], 2);
              bad += got != float_to_bf16(w);
            }
          }
      EXPECT_EQ(bad, 0) << "sequence " << n << ", checkpoint " << j << " (entry " << entry << ")";
    }
  }
  ASSERT_EQ(entry, total);
  const size_t used = static_cast<size_t>(total * HV * K * V) * elem;
  EXPECT_EQ(0, std::memcmp(buf.data() + used, untouched.data() + used, buf.size() - used))
      << "entries past the last checkpoint were written";
}

// Varlen with GVA, K != V, an empty sequence, lengths on and off the interval.
TEST_P(Checkpoints, EachIsThePrefixRunsFinalState) {
  ProblemSpec spec;
  spec.seqlens = {70, 0, 33, 128};
  spec.heads = 2;
  spec.v_heads = 4;
  check(make_problem_kv(spec, 16, 24, 71), GetParam());
}

INSTANTIATE_TEST_SUITE_P(
    Cases, Checkpoints,
    ::testing::Values(CheckpointCase{Backend::kCpuReference, 16, DType::kFP32, false},
                      CheckpointCase{Backend::kCpuReference, 64, DType::kBF16, false},
                      CheckpointCase{Backend::kCpuChunked, 16, DType::kFP32, true},
                      CheckpointCase{Backend::kCpuChunked, 64, DType::kFP32, false},
                      CheckpointCase{Backend::kCpuChunked, 32, DType::kBF16, true},
                      // The largest interval: one entry (the initial state) a non-empty
                      // sequence. length + interval − 1 overflowed int64, and a
                      // 70-token sequence got no entry.
                      CheckpointCase{Backend::kCpuReference, kLargestInterval, DType::kFP32, false},
                      CheckpointCase{Backend::kCpuChunked, kLargestInterval, DType::kFP32, false}),
    [](const auto& info) { return case_name(info.param); });

// A B·T batch: sequence n's entries start at n·ceil(T/c).
TEST(CheckpointsBatch, EntriesOfEqualSequences) {
  ProblemSpec spec;
  spec.batch = 3;
  spec.seqlen = 50;
  spec.heads = 1;
  spec.head_dim = 16;
  check(make_problem(spec, 72), {Backend::kCpuChunked, 32, DType::kFP32, false});
}

TEST(CheckpointsValidation, BadArgumentsAreNamed) {
  ProblemSpec spec;
  spec.seqlens = {70, 33};
  spec.heads = 1;
  spec.head_dim = 16;
  const HostProblem p = make_problem(spec, 73);
  std::vector<float> buf(static_cast<size_t>(8 * 16 * 16));
  std::vector<uint16_t> out(p.out_elems());
  auto base = [&] {
    ForwardArgs a = p.host_args(out.data(), nullptr);
    a.final_state_dtype = DType::kNone;
    a.checkpoints = buf.data();
    a.checkpoints_dtype = DType::kFP32;
    a.checkpoint_interval = 32;
    a.checkpoints_capacity = 8;
    return a;
  };
  const auto expect = expect_invalid;
  EXPECT_TRUE(validate(base(), Backend::kCpuChunked).ok());
  ForwardArgs a = base();
  a.checkpoint_interval = 24;
  expect(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, "checkpoint_interval: expected a positive multiple of 16");
  a = base();
  a.checkpoints_capacity = 4;  // ceil(70/32) + ceil(33/32) = 3 + 2 = 5
  expect(a, Backend::kCpuReference, StatusCode::kInvalidArgument, "the sequences need 5 checkpoints");
  a = base();
  a.checkpoints_dtype = DType::kNone;
  expect(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, "checkpoints_dtype");
  a = base();
  a.checkpoints = nullptr;
  expect(a, Backend::kCpuChunked, StatusCode::kInvalidArgument,
         "checkpoints: expected a buffer of checkpoints_capacity = 8 entries, got a null pointer");
  // An empty buffer (capacity 0, null or not) is refused by the entries the
  // sequences need, and accepted where they need none.
  a = base();
  a.checkpoints = nullptr;
  a.checkpoints_capacity = 0;
  expect(a, Backend::kCpuReference, StatusCode::kInvalidArgument, "the sequences need 5 checkpoints");
  a.checkpoints_capacity = -1;
  expect(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, "checkpoints_capacity: expected a value >= 0, got -1");
  {
    ProblemSpec empty_spec = spec;
    empty_spec.seqlens = {0, 0};
    const HostProblem e = make_problem(empty_spec, 74);
    for (void* buffer : {static_cast<void*>(nullptr), static_cast<void*>(buf.data())}) {
      ForwardArgs z = e.host_args(out.data(), nullptr);
      z.final_state_dtype = DType::kNone;
      z.checkpoints = buffer;
      z.checkpoints_dtype = DType::kFP32;
      z.checkpoint_interval = 32;
      z.checkpoints_capacity = 0;
      for (const Backend b : {Backend::kCpuReference, Backend::kCpuChunked}) {
        const Status st = forward(z, b, nullptr, 0, nullptr);
        EXPECT_TRUE(st.ok()) << st.message;
      }
    }
  }
  a = base();
  a.checkpoints = reinterpret_cast<char*>(buf.data()) + 2;
  expect(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, "checkpoints: expected a 4-byte aligned");
  {
    // kCuda writes checkpoints (it may still be unavailable here, for its own reason).
    const Status cuda = validate(base(), Backend::kCuda);
    EXPECT_EQ(cuda.message.find("checkpoints"), std::string::npos) << cuda.message;
  }
}

}  // namespace
}  // namespace flashkda::testing
