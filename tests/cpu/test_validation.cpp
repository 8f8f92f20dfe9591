// flashkda::validate / forward: one test per rule; every message must name the
// argument it is about.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "api/forward_internal.h"
#include "api/overlap.h"
#include "flashkda/flashkda.h"
#include "tests/common/decode_problem.h"
#include "tests/common/kda_problem.h"

namespace {

using flashkda::Backend;
using flashkda::DType;
using flashkda::ForwardArgs;
using flashkda::Status;
using flashkda::StatusCode;
using flashkda::testing::HostProblem;
using flashkda::testing::ProblemSpec;

// A small valid problem with its output buffers.
struct Fixture {
  HostProblem p;
  std::vector<uint16_t> out;
  std::vector<float> fin;
  ForwardArgs args;

  explicit Fixture(ProblemSpec spec = small_spec(), uint64_t seed = 7) : p(flashkda::testing::make_problem(spec, seed)) {
    out.assign(p.out_elems(), 0);
    fin.assign(p.state_elems(), 0.f);
    args = p.host_args(out.data(), spec.final_state == DType::kNone ? nullptr : fin.data());
  }
  static ProblemSpec small_spec() {
    ProblemSpec s;
    s.batch = 1;
    s.seqlen = 20;
    s.heads = 2;
    s.head_dim = 32;
    return s;
  }
  static ProblemSpec varlen_spec() {
    ProblemSpec s = small_spec();
    s.seqlens = {5, 0, 12};
    return s;
  }
};

// Expects `args` to be rejected by validate() AND by forward() with `code`, with a
// message containing every string in `needles`.
void expect_rejected(const ForwardArgs& args, Backend backend, StatusCode code,
                     std::initializer_list<const char*> needles) {
  const Status v = flashkda::validate(args, backend);
  EXPECT_EQ(v.code, code) << flashkda::to_string(v.code) << ": " << v.message;
  for (const char* n : needles) EXPECT_NE(v.message.find(n), std::string::npos) << "'" << n << "' not in: " << v.message;
  const Status f = flashkda::forward(args, backend, nullptr, 0, nullptr);
  EXPECT_EQ(f.code, v.code);
  EXPECT_EQ(f.message, v.message);
  size_t ws = 123;
  const Status w = flashkda::workspace_size(args, backend, &ws);
  EXPECT_EQ(w.code, v.code);
}

void expect_invalid(const ForwardArgs& args, std::initializer_list<const char*> needles,
                    Backend backend = Backend::kCpuChunked) {
  expect_rejected(args, backend, StatusCode::kInvalidArgument, needles);
}

TEST(Validation, ValidArgumentsPass) {
  Fixture f;
  for (Backend b : {Backend::kCpuReference, Backend::kCpuChunked}) {
    const Status s = flashkda::validate(f.args, b);
    EXPECT_TRUE(s.ok()) << s.message;
    size_t ws = 123;
    EXPECT_TRUE(flashkda::workspace_size(f.args, b, &ws).ok());
    EXPECT_EQ(ws, 0u);  // the CPU backends need no workspace
  }
  Fixture v(Fixture::varlen_spec());
  EXPECT_TRUE(flashkda::validate(v.args, Backend::kCpuChunked).ok());
  EXPECT_TRUE(flashkda::forward(v.args, Backend::kCpuChunked, nullptr, 0, nullptr).ok());
}

TEST(Validation, NullRequiredPointers) {
  const char* names[] = {"q", "k", "v", "g", "beta", "A_log", "dt_bias", "out"};
  for (const char* name : names) {
    Fixture f;
    ForwardArgs a = f.args;
    const std::string n = name;
    if (n == "q") a.q = nullptr;
    if (n == "k") a.k = nullptr;
    if (n == "v") a.v = nullptr;
    if (n == "g") a.g = nullptr;
    if (n == "beta") a.beta = nullptr;
    if (n == "A_log") a.A_log = nullptr;
    if (n == "dt_bias") a.dt_bias = nullptr;
    if (n == "out") a.out = nullptr;
    SCOPED_TRACE(n);
    expect_invalid(a, {(n + ": null pointer").c_str()});
  }
}

TEST(Validation, EmptyTensorsMayBeNull) {
  // seqlen == 0: q, k, v, g, beta, out have no elements; null is accepted.
  Fixture f;
  ForwardArgs a = f.args;
  a.seqlen = 0;
  a.q = a.k = a.v = a.g = a.beta = nullptr;
  a.out = nullptr;
  EXPECT_TRUE(flashkda::validate(a, Backend::kCpuChunked).ok()) << flashkda::validate(a, Backend::kCpuChunked).message;
  a.A_log = nullptr;  // A_log always has HV elements
  expect_invalid(a, {"A_log", "null pointer"});
}

TEST(Validation, MisalignedPointersCpu) {
  Fixture f;
  {
    ForwardArgs a = f.args;
    a.q = reinterpret_cast<const char*>(f.args.q) + 1;
    expect_invalid(a, {"q:", "2-byte aligned"});
  }
  {
    ForwardArgs a = f.args;
    a.A_log = reinterpret_cast<const float*>(reinterpret_cast<const char*>(f.args.A_log) + 2);
    expect_invalid(a, {"A_log:", "4-byte aligned"});
  }
  {
    ForwardArgs a = f.args;
    a.final_state = reinterpret_cast<char*>(f.args.final_state) + 2;  // fp32 state
    expect_invalid(a, {"final_state:", "4-byte aligned"});
  }
}

TEST(Validation, MisalignedPointersCuda) {
  // Argument errors are kInvalidArgument for kCuda too, whether or not it is built.
  Fixture f;
  {
    ForwardArgs a = f.args;
    a.v = reinterpret_cast<const char*>(f.args.v) + 8;  // 2-byte aligned, not 16
    expect_invalid(a, {"v:", "16-byte aligned"}, Backend::kCuda);
  }
  {
    ForwardArgs a = f.args;
    a.initial_state = reinterpret_cast<const char*>(f.args.initial_state) + 4;
    expect_invalid(a, {"initial_state:", "16-byte aligned"}, Backend::kCuda);
  }
  {
    ForwardArgs a = f.args;
    a.dt_bias = reinterpret_cast<const float*>(reinterpret_cast<const char*>(f.args.dt_bias) + 2);
    expect_invalid(a, {"dt_bias:", "4-byte aligned"}, Backend::kCuda);
  }
}

TEST(Validation, BadBatch) {
  Fixture f;
  ForwardArgs a = f.args;
  a.batch = 0;
  expect_invalid(a, {"batch:", ">= 1", "got 0"});
}

TEST(Validation, NegativeSeqlen) {
  Fixture f;
  ForwardArgs a = f.args;
  a.seqlen = -1;
  expect_invalid(a, {"seqlen:", "got -1"});
}

TEST(Validation, BadNumHeads) {
  Fixture f;
  ForwardArgs a = f.args;
  a.num_heads = 0;
  expect_invalid(a, {"num_heads:", "got 0"});
}

TEST(Validation, ValueHeadsNotAMultiple) {
  ProblemSpec s = Fixture::small_spec();
  s.heads = 4;
  Fixture f(s);
  ForwardArgs a = f.args;
  a.num_v_heads = 6;
  expect_invalid(a, {"num_v_heads:", "multiple of num_heads=4, got 6"});
  a.num_v_heads = -4;
  expect_invalid(a, {"num_v_heads:", "got -4"});
}

TEST(Validation, ValueHeadsZeroMeansH) {
  Fixture f;
  ForwardArgs a = f.args;
  a.num_v_heads = 0;
  EXPECT_TRUE(flashkda::validate(a, Backend::kCpuChunked).ok());
}

TEST(Validation, BadHeadDims) {
  Fixture f;
  ForwardArgs a = f.args;
  a.head_dim_k = 0;
  expect_invalid(a, {"head_dim_k:", "got 0"});
  a = f.args;
  a.head_dim_v = -3;
  expect_invalid(a, {"head_dim_v:", "got -3"});
  a = f.args;
  // Valid shapes the CPU backends (head dims 1-256) do not run.
  a.head_dim_k = 300;
  expect_rejected(a, Backend::kCpuChunked, StatusCode::kNotSupported, {"head_dim_k:", "kCpuChunked", "[1, 256]", "got 300"});
  a = f.args;
  a.head_dim_v = 257;
  expect_rejected(a, Backend::kCpuReference, StatusCode::kNotSupported, {"head_dim_v:", "[1, 256]", "got 257"});
}

TEST(Validation, ScaleNotFinite) {
  Fixture f;
  ForwardArgs a = f.args;
  a.scale = std::numeric_limits<float>::infinity();
  expect_invalid(a, {"scale:", "finite"});
  a.scale = std::nanf("");
  expect_invalid(a, {"scale:", "finite"});
}

TEST(Validation, LowerBoundZero) {
  Fixture f;
  ForwardArgs a = f.args;
  a.lower_bound = 0.f;
  expect_invalid(a, {"lower_bound:", "[-5, 0)", "got 0"});
  a.lower_bound = 0.5f;
  expect_invalid(a, {"lower_bound: expected a finite value in [-5, 0), got 0.5"});
}

TEST(Validation, LowerBoundBelowMinusFive) {
  Fixture f;
  ForwardArgs a = f.args;
  a.lower_bound = -5.1f;
  expect_invalid(a, {"lower_bound:", "[-5, 0)", "got -5.1"});
  // One float below the bound prints as itself, not as the bound.
  a.lower_bound = std::nextafter(-5.f, -6.f);
  expect_invalid(a, {"lower_bound: expected a finite value in [-5, 0), got -5.0000005"});
}

TEST(Validation, LowerBoundNaN) {
  Fixture f;
  ForwardArgs a = f.args;
  a.lower_bound = std::nanf("");
  expect_invalid(a, {"lower_bound:", "[-5, 0)"});
  a.lower_bound = -std::numeric_limits<float>::infinity();
  expect_invalid(a, {"lower_bound:"});
}

TEST(Validation, LowerBoundEdgesAccepted) {
  Fixture f;
  ForwardArgs a = f.args;
  for (float lb : {-5.f, -1e-6f, -1.f}) {
    a.lower_bound = lb;
    EXPECT_TRUE(flashkda::validate(a, Backend::kCpuChunked).ok()) << lb;
  }
}

TEST(Validation, StatePointerWithoutDtype) {
  Fixture f;
  ForwardArgs a = f.args;
  a.initial_state_dtype = DType::kNone;
  expect_invalid(a, {"initial_state: pointer given but initial_state_dtype is kNone"});
  a = f.args;
  a.final_state_dtype = DType::kNone;
  expect_invalid(a, {"final_state: pointer given but final_state_dtype is kNone"});
}

TEST(Validation, StateDtypeWithoutPointer) {
  Fixture f;
  ForwardArgs a = f.args;
  a.initial_state = nullptr;
  expect_invalid(a, {"initial_state:", "null pointer", "kFP32"});
  a = f.args;
  a.final_state = nullptr;
  expect_invalid(a, {"final_state:", "null pointer", "kFP32"});
}

TEST(Validation, StateDtypeMismatch) {
  Fixture f;
  ForwardArgs a = f.args;
  a.final_state_dtype = DType::kBF16;  // initial is kFP32
  expect_invalid(a, {"final_state_dtype:", "kFP32", "kBF16"});
  // Only one state given: any dtype is fine.
  a.initial_state = nullptr;
  a.initial_state_dtype = DType::kNone;
  EXPECT_TRUE(flashkda::validate(a, Backend::kCpuChunked).ok());
}

TEST(Validation, UnknownStateDtype) {
  Fixture f;
  ForwardArgs a = f.args;
  a.initial_state_dtype = static_cast<DType>(9);
  expect_invalid(a, {"initial_state_dtype:", "unknown value 9"});
}

TEST(Validation, UnknownBackend) {
  Fixture f;
  expect_invalid(f.args, {"backend:", "unknown value 7"}, static_cast<Backend>(7));
}

TEST(Validation, CuSeqlensRequiresBatchOne) {
  Fixture f(Fixture::varlen_spec());
  ForwardArgs a = f.args;
  a.batch = 2;
  expect_invalid(a, {"cu_seqlens: requires batch == 1, got batch=2"});
}

TEST(Validation, CuSeqlensNeedsSequences) {
  Fixture f(Fixture::varlen_spec());
  ForwardArgs a = f.args;
  a.num_seqs = 0;
  expect_invalid(a, {"num_seqs:", "got 0"});
}

TEST(Validation, CuSeqlensNotStartingAtZero) {
  Fixture f(Fixture::varlen_spec());
  std::vector<int64_t> cu = f.p.cu_seqlens;  // {0, 5, 5, 17}
  cu[0] = 1;
  ForwardArgs a = f.args;
  a.cu_seqlens = cu.data();
  expect_invalid(a, {"cu_seqlens:", "cu_seqlens[0] == 0", "got 1"});
}

TEST(Validation, CuSeqlensDecreasing) {
  Fixture f(Fixture::varlen_spec());
  std::vector<int64_t> cu = f.p.cu_seqlens;  // {0, 5, 5, 17}
  cu[2] = 4;
  ForwardArgs a = f.args;
  a.cu_seqlens = cu.data();
  expect_invalid(a, {"cu_seqlens:", "non-decreasing", "cu_seqlens[2]=4"});
}

TEST(Validation, CuSeqlensNotEndingAtSeqlen) {
  Fixture f(Fixture::varlen_spec());
  std::vector<int64_t> cu = f.p.cu_seqlens;
  cu.back() = 16;
  ForwardArgs a = f.args;
  a.cu_seqlens = cu.data();
  expect_invalid(a, {"cu_seqlens:", "seqlen=17", "got 16"});
}

TEST(Validation, CuSeqlensHostCopyCheckedForCuda) {
  // kCuda validates the optional host copy (the device copy cannot be read).
  Fixture f(Fixture::varlen_spec());
  std::vector<int64_t> cu = f.p.cu_seqlens;
  cu[1] = 20;
  ForwardArgs a = f.args;
  a.cu_seqlens_host = cu.data();
  expect_invalid(a, {"cu_seqlens_host:", "non-decreasing"}, Backend::kCuda);
}

TEST(Validation, CuSeqlensHostCopyMustBeTheCopyOnCpu) {
  // The CPU backends read cu_seqlens itself: a host copy that disagrees is refused,
  // an equal one accepted.
  Fixture f(Fixture::varlen_spec());
  std::vector<int64_t> cu = f.p.cu_seqlens;
  ForwardArgs a = f.args;
  a.cu_seqlens_host = cu.data();
  for (Backend b : {Backend::kCpuReference, Backend::kCpuChunked}) EXPECT_TRUE(flashkda::validate(a, b).ok());
  cu[2] += 1;
  expect_invalid(a, {"cu_seqlens_host: expected a copy of cu_seqlens", "cu_seqlens_host[2]"});
}

TEST(Validation, SizeOverflow) {
  Fixture f;
  ForwardArgs a = f.args;
  a.seqlen = int64_t{1} << 40;
  a.num_heads = int64_t{1} << 20;
  a.num_v_heads = 0;
  expect_invalid(a, {"q:", "overflows int64"});
  a = f.args;
  a.batch = int64_t{1} << 62;
  expect_invalid(a, {"overflows int64"});
}

// Sizes whose counts would wrap before any tensor is read: a status naming the
// argument, never an exception, a wrapped count or a read past a buffer.
TEST(Validation, CountsThatWouldWrapAreStatuses) {
  Fixture f(Fixture::varlen_spec());
  // int32 boundaries: num_seqs + 1 of them widened to int64 must be countable.
  std::vector<int32_t> cu32(f.p.cu_seqlens.begin(), f.p.cu_seqlens.end());
  ForwardArgs a = f.args;
  a.cu_seqlens = nullptr;
  a.cu_seqlens_int32 = cu32.data();
  a.num_seqs = std::numeric_limits<int64_t>::max();
  for (Backend b : {Backend::kCpuChunked, Backend::kCuda}) expect_invalid(a, {"num_seqs:", "overflow"}, b);
  // More tokens than int32 boundaries can reach: refused on every backend (kCuda
  // cannot read the boundaries on the host).
  a.num_seqs = static_cast<int64_t>(cu32.size()) - 1;
  a.seqlen = int64_t{1} << 31;
  for (Backend b : {Backend::kCpuChunked, Backend::kCuda})
    expect_invalid(a, {"cu_seqlens_int32:", "cannot reach seqlen"}, b);
  // A host copy of boundaries that are not given: refused, not run as a B·T batch.
  Fixture g;
  a = g.args;
  a.cu_seqlens_host = f.p.cu_seqlens.data();
  for (Backend b : {Backend::kCpuChunked, Backend::kCuda}) expect_invalid(a, {"cu_seqlens_host:", "without"}, b);
  // Checkpoints of a batch of 2^40 empty rows: counted without a list of the rows
  // (that list threw std::bad_alloc out of validate()).
  std::vector<float> ck(16);
  a = g.args;
  a.batch = int64_t{1} << 40;
  a.seqlen = 0;
  flashkda::testing::clear_states(a);
  a.checkpoints = ck.data();
  a.checkpoints_dtype = DType::kFP32;
  a.checkpoint_interval = 16;
  a.checkpoints_capacity = 1;
  for (Backend b : {Backend::kCpuReference, Backend::kCpuChunked}) {
    Status st;
    EXPECT_NO_THROW(st = flashkda::validate(a, b));
    EXPECT_TRUE(st.ok()) << st.message;  // empty rows have no checkpoints
  }
}

// The CPU backends' state pool with slot checkpoints keeps the state at every 16
// tokens: where that count times a state's floats overflows int64, NotSupported
// naming the argument, before the scratch is sized.
TEST(Validation, SlotCheckpointScratchThatWouldWrapIsNotSupported) {
  ProblemSpec spec = Fixture::small_spec();
  spec.head_dim = 256;
  spec.heads = 1;
  Fixture f(spec);
  ForwardArgs a = f.args;
  a.num_v_heads = 1 << 8;
  a.seqlen = int64_t{1} << 44;  // (2^44 / 16) · 2^8 · 256 · 256 = 2^64 floats
  a.initial_state = a.final_state = nullptr;
  a.initial_state_dtype = a.final_state_dtype = DType::kNone;
  std::vector<float> pool(16);
  const int64_t no_slot = -1, offsets[2] = {16, -1}, slots[2] = {0, -1};
  a.state_pool = pool.data();
  a.state_pool_dtype = DType::kFP32;
  a.pool_size = 1;
  a.state_indices = &no_slot;
  a.state_index_type = flashkda::IndexType::kInt64;
  a.slot_checkpoint_offsets = offsets;
  a.slot_checkpoint_slots = slots;
  // The shapes claim far more than the buffers hold (nothing of them is read before
  // the scratch is sized): the token tensors, out and the pool are given apart
  // from each other and from the small host arrays, so that their claimed extents
  // do not meet and validate()'s overlap check lets the call reach the sizing.
  auto far = [](int shift) { return reinterpret_cast<void*>(uintptr_t{1} << shift); };
  a.q = a.k = a.v = a.g = a.beta = far(61);  // inputs may share memory
  a.out = far(62);
  a.state_pool = far(60);
  const Status st = flashkda::forward(a, Backend::kCpuChunked, nullptr, 0, nullptr);
  EXPECT_EQ(st.code, StatusCode::kNotSupported) << st.message;
  EXPECT_NE(st.message.find("slot_checkpoint_offsets:"), std::string::npos) << st.message;
}

TEST(Validation, CudaUnavailableGivesStatusNotCrash) {
  std::string why;
  if (flashkda::cuda_backend_available(&why)) GTEST_SKIP() << "a CUDA device is present; covered by the gpu tests";
  EXPECT_FALSE(why.empty());
  // A shape the kernels support (K = V = 128, HV = H), so that the failure is about
  // the build or the device. Host pointers (16-byte aligned): the call must fail
  // cleanly, with CUDA not compiled in (stub: "not built") or compiled in without a
  // device (CUDA compiled in, as on CI, but no GPU).
  ProblemSpec spec = Fixture::small_spec();
  spec.head_dim = 128;
  Fixture f(spec);
  const Status s = flashkda::forward(f.args, Backend::kCuda, nullptr, 0, nullptr);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.code == StatusCode::kNotSupported || s.code == StatusCode::kCudaError)
      << flashkda::to_string(s.code) << ": " << s.message;
  std::string lower = s.message;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  EXPECT_TRUE(lower.find("cuda") != std::string::npos || lower.find("device") != std::string::npos) << s.message;
  size_t ws = 0;
  (void)flashkda::workspace_size(f.args, Backend::kCuda, &ws);  // must not crash either
}

TEST(Validation, WorkspaceSizeNullOutput) {
  Fixture f;
  const Status s = flashkda::workspace_size(f.args, Backend::kCpuChunked, nullptr);
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument);
  EXPECT_NE(s.message.find("bytes"), std::string::npos);
}

// The Python binding's path: workspace_size validates, then forward_prevalidated
// runs without validating again. Same results as forward on the CPU backends.
TEST(Validation, ForwardPrevalidatedMatchesForward) {
  for (const ProblemSpec& spec : {Fixture::small_spec(), Fixture::varlen_spec()}) {
    for (Backend b : {Backend::kCpuReference, Backend::kCpuChunked}) {
      Fixture a(spec), p(spec);
      size_t ws = 123;
      ASSERT_TRUE(flashkda::workspace_size(p.args, b, &ws).ok());
      const Status sa = flashkda::forward(a.args, b, nullptr, 0, nullptr);
      const Status sp = flashkda::api::forward_prevalidated(p.args, b, nullptr, ws, nullptr);
      ASSERT_TRUE(sa.ok()) << sa.message;
      ASSERT_TRUE(sp.ok()) << sp.message;
      EXPECT_EQ(a.out, p.out);
      EXPECT_EQ(a.fin, p.fin);
    }
  }
}

TEST(Validation, ToStringNames) {
  EXPECT_STREQ(flashkda::to_string(DType::kBF16), "kBF16");
  EXPECT_STREQ(flashkda::to_string(Backend::kCpuChunked), "kCpuChunked");
  EXPECT_STREQ(flashkda::to_string(StatusCode::kNotSupported), "kNotSupported");
  EXPECT_NE(std::string(flashkda::to_string(static_cast<Backend>(42))).find("unknown"), std::string::npos);
}

}  // namespace

// An output that shares memory with another argument is refused by name
// (api/overlap.h), where the overlap is certain; the documented in-place forms and
// inputs that share memory with each other are not overlaps.
TEST(Validation, OutputsSharingMemoryAreRefusedByName) {
  Fixture base;  // q, k, v, g: [1, 20, 2, 32] bf16; final state fp32 [1, 2, 32, 32]
  const ForwardArgs& a0 = base.args;
  ASSERT_TRUE(flashkda::validate(a0, Backend::kCpuChunked).ok());
  // One buffer holding two copies of k: k at its start, out half a row further on.
  std::vector<uint16_t> both(2 * base.p.k.size());
  std::copy(base.p.k.begin(), base.p.k.end(), both.begin());
  std::copy(base.p.k.begin(), base.p.k.end(), both.begin() + static_cast<std::ptrdiff_t>(base.p.k.size()));
  std::vector<float> init(base.p.state_elems()), fin2(2 * base.p.state_elems());
  std::vector<float> big(1 << 16);
  struct Case {
    const char* what;
    void (*edit)(ForwardArgs&, uint16_t*, float*, float*, float*);
    std::vector<const char*> needles;
  };
  const Case cases[] = {
      {"out part way into k", [](ForwardArgs& a, uint16_t* kk, float*, float*, float*) {
         a.k = kk;
         a.out = kk + 16;
       }, {"out: shares memory with k"}},
      {"out is q", [](ForwardArgs& a, uint16_t*, float*, float*, float*) { a.out = const_cast<void*>(a.q); },
       {"out: shares memory with q"}},
      {"final_state over out", [](ForwardArgs& a, uint16_t*, float*, float*, float*) {
         a.final_state = a.out;
       }, {"final_state: shares memory with out"}},
      {"A_log inside final_state", [](ForwardArgs& a, uint16_t*, float*, float*, float*) {
         a.A_log = static_cast<const float*>(a.final_state) + 8;
       }, {"final_state: shares memory with A_log"}},
      {"final_state part way into initial_state", [](ForwardArgs& a, uint16_t*, float* init, float*, float* two) {
         a.initial_state = two;
         a.initial_state_dtype = DType::kFP32;
         a.final_state = two + 4;
         (void)init;
       }, {"final_state: shares memory with initial_state"}},
      {"checkpoints over the final state", [](ForwardArgs& a, uint16_t*, float*, float* big, float*) {
         a.final_state = big;
         a.checkpoints = big + 64;
         a.checkpoints_dtype = DType::kFP32;
         a.checkpoint_interval = 16;
         a.checkpoints_capacity = 2;
       }, {"checkpoints: shares memory with final_state"}},
  };
  for (const Case& c : cases) {
    ForwardArgs a = a0;
    c.edit(a, both.data(), init.data(), big.data(), fin2.data());
    SCOPED_TRACE(c.what);
    for (Backend b : {Backend::kCpuReference, Backend::kCpuChunked})
      expect_rejected(a, b, StatusCode::kInvalidArgument, {c.needles[0]});
  }

  // Not overlaps: the final state over the initial state itself (in place), inputs
  // that share memory (q = k), and strided views of one fused row that interleave
  // without sharing a byte (q and k side by side in each token's row, out apart).
  ForwardArgs in_place = a0;
  std::copy(base.fin.begin(), base.fin.end(), init.begin());
  in_place.initial_state = init.data();
  in_place.initial_state_dtype = DType::kFP32;
  in_place.final_state = init.data();
  EXPECT_TRUE(flashkda::validate(in_place, Backend::kCpuChunked).ok());
  ForwardArgs shared_inputs = a0;
  shared_inputs.k = shared_inputs.q;
  EXPECT_TRUE(flashkda::validate(shared_inputs, Backend::kCpuChunked).ok());
  const int64_t T = base.p.tokens(), H = base.p.H, K = base.p.K, row = 2 * H * K;
  std::vector<uint16_t> fused(static_cast<size_t>(T * row));
  ForwardArgs views = a0;
  views.q = fused.data();
  views.k = fused.data() + H * K;
  views.q_token_stride = views.k_token_stride = row;
  const Status st = flashkda::validate(views, Backend::kCpuChunked);
  EXPECT_TRUE(st.ok()) << st.message;
}

// A batch of empty sequences with no state to write has nothing to do: Ok at once
// on every CPU backend, with no scratch and no allocation proportional to the
// batch (2^40 sequences). One too large to index names what sets its size.
TEST(Validation, EmptySequencesWithNothingToWriteCostNothing) {
  Fixture base;
  ForwardArgs a = base.args;
  a.batch = int64_t{1} << 40;
  a.seqlen = 0;
  a.initial_state = a.final_state = nullptr;
  a.initial_state_dtype = a.final_state_dtype = DType::kNone;
  for (Backend b : {Backend::kCpuReference, Backend::kCpuChunked}) {
    size_t ws = 1;
    const Status sized = workspace_size(a, b, &ws);
    EXPECT_TRUE(sized.ok()) << sized.message;
    EXPECT_EQ(ws, 0u);
    const Status st = forward(a, b, nullptr, 0, nullptr);
    EXPECT_TRUE(st.ok()) << to_string(b) << ": " << st.message;
  }
  a.batch = int64_t{1} << 62;
  expect_rejected(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, {"batch: element count N*HV*V*K overflows"});
}

// The scratch a kCuda forward writes is checked against every argument before
// the launch (forward.cpp): a workspace inside out, an input or a pool slot would
// be a silent wrong answer. The check is pointer arithmetic, so it runs here.
TEST(Validation, WorkspaceSharingMemoryWithAnArgumentIsRefused) {
  Fixture base;  // q, k, v, g: [1, 20, 2, 32] bf16; out [1, 20, 2, 32] bf16; final state fp32
  using flashkda::validation::check_workspace_overlaps;
  // out with 512 bytes of its own buffer on either side, so that its neighbours are known.
  const int64_t out_bytes = static_cast<int64_t>(base.out.size()) * 2;
  std::vector<char> padded(static_cast<size_t>(out_bytes + 1024));
  ForwardArgs a = base.args;
  a.out = padded.data() + 512;
  const char* out = padded.data() + 512;
  struct Case {
    const char* what;
    const void* ws;
    int64_t bytes;
    const char* needle;  // nullptr: accepted
  };
  std::vector<char> own(4096);
  const Case cases[] = {
      {"its own memory", own.data(), 4096, nullptr},
      {"over out", out, 256, "workspace: shares memory with out"},
      {"ending one byte into out", out - 255, 256, "workspace: shares memory with out"},
      {"ending just before out", out - 256, 256, nullptr},
      {"starting just past out", out + out_bytes, 256, nullptr},
      {"starting at out's last byte", out + out_bytes - 1, 256, "workspace: shares memory with out"},
      {"inside q", static_cast<const char*>(a.q) + 64, 16, "workspace: shares memory with q"},
      {"inside the final state", base.fin.data() + 100, 4, "workspace: shares memory with final_state"},
      {"over A_log", a.A_log, 1, "workspace: shares memory with A_log"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const Status st = check_workspace_overlaps(a, c.ws, c.bytes);
    if (c.needle == nullptr) {
      EXPECT_TRUE(st.ok()) << st.message;
    } else {
      EXPECT_EQ(st.code, StatusCode::kInvalidArgument);
      EXPECT_NE(st.message.find(c.needle), std::string::npos) << st.message;
    }
  }
  // A pool's slots strided two slots apart: scratch in the gap between slot 0 and
  // slot 1 shares no byte with the pool; scratch in slot 1 does.
  const int64_t slot = base.p.H * base.p.V * base.p.K;
  std::vector<float> big(static_cast<size_t>(6 * slot));
  std::vector<int32_t> slots = {0};
  ForwardArgs pooled = a;
  flashkda::testing::use_state_pool(pooled, big.data(), DType::kFP32, 3, slots.data());
  pooled.pool_stride = 2 * slot;
  ASSERT_TRUE(flashkda::validate(pooled, Backend::kCpuChunked).ok());
  EXPECT_TRUE(check_workspace_overlaps(pooled, big.data() + slot, slot * 4).ok());
  const Status in_slot = check_workspace_overlaps(pooled, big.data() + 2 * slot + 8, 64);
  EXPECT_NE(in_slot.message.find("workspace: shares memory with state_pool"), std::string::npos) << in_slot.message;
}

// The overlap test is exact where one side is dense: a dense out in a middle slot
// of a pool whose slots are strided (neither end of the pool's range inside out),
// or among the tokens of a strided q, is refused; a dense out that lies only in
// the gaps between q's token rows shares no byte and is accepted.
TEST(Validation, DenseOutputsInsideStridedArgumentsAreRefusedExactly) {
  Fixture base;  // q, k, v, g: [1, 20, 2, 32] bf16
  const ForwardArgs& a0 = base.args;
  const int64_t T = base.p.tokens(), H = base.p.H, K = base.p.K, V = base.p.V;
  const int64_t out_elems = T * H * V, slot = H * V * K;  // bf16 out; fp32 slots
  // A pool of 3 slots, one slot's room apart: slot 1 sits at 2·slot floats.
  std::vector<float> big(static_cast<size_t>(6 * slot));
  std::vector<int32_t> slots = {0};
  ForwardArgs pooled = a0;
  flashkda::testing::use_state_pool(pooled, big.data(), DType::kFP32, 3, slots.data());
  pooled.pool_stride = 2 * slot;
  {
    const Status st = flashkda::validate(pooled, Backend::kCpuChunked);
    ASSERT_TRUE(st.ok()) << st.message;
  }
  ASSERT_LE(out_elems * 2, slot * 4) << "out fits in one slot";
  pooled.out = big.data() + 2 * slot;  // pool slot 1
  for (Backend b : {Backend::kCpuReference, Backend::kCpuChunked})
    expect_rejected(pooled, b, StatusCode::kInvalidArgument, {"state_pool: shares memory with out"});
  pooled.out = big.data() + slot;  // the gap between slots 0 and 1: no shared byte
  {
    const Status st = flashkda::validate(pooled, Backend::kCpuChunked);
    EXPECT_TRUE(st.ok()) << st.message;
  }

  // q with a token stride of `gap` elements: each token's H·K row, then a gap
  // that holds all of out.
  const int64_t gap = H * K + out_elems;
  std::vector<uint16_t> wide(static_cast<size_t>(T * gap));
  ForwardArgs strided = a0;
  strided.q = wide.data();
  strided.q_token_stride = gap;
  strided.out = wide.data() + H * K;  // in the gap after token 0's row of q
  {
    const Status st = flashkda::validate(strided, Backend::kCpuChunked);
    EXPECT_TRUE(st.ok()) << st.message;
  }
  strided.out = wide.data() + H * K - 8;  // its first 8 elements are q's token 0
  expect_rejected(strided, Backend::kCpuChunked, StatusCode::kInvalidArgument, {"out: shares memory with q"});
  strided.q_token_stride = 3 * H * K;  // q's tokens 1.. now inside out
  strided.out = wide.data() + 2 * H * K;
  expect_rejected(strided, Backend::kCpuChunked, StatusCode::kInvalidArgument, {"out: shares memory with q"});
}

// The same rules for a decode step: out inside the pool, per-token states over
// the pool and an out pool part way into the pool are refused; an out pool that
// is the pool itself (same stride) is the in-place step.
TEST(Validation, DecodeOutputsSharingMemoryAreRefusedByName) {
  flashkda::testing::DecodeSpec spec;
  spec.num_seqs = 2;
  spec.tokens_per_seq = 2;
  spec.heads = 2;
  spec.head_dim = 16;
  spec.per_token_states = false;
  const flashkda::testing::DecodeProblem p = flashkda::testing::make_decode_problem(spec, 21);
  std::vector<uint16_t> out(static_cast<size_t>(p.T * p.HV * p.V));
  std::vector<uint8_t> pool = p.pool_bytes();
  const flashkda::DecodeArgs a0 = p.args(out.data(), pool.data(), nullptr);
  ASSERT_TRUE(flashkda::validate_decode(a0, Backend::kCpuChunked).ok());
  auto rejected = [&](flashkda::DecodeArgs a, const char* needle) {
    const Status st = flashkda::validate_decode(a, Backend::kCpuChunked);
    EXPECT_EQ(st.code, StatusCode::kInvalidArgument) << needle;
    EXPECT_NE(st.message.find(needle), std::string::npos) << st.message;
  };
  flashkda::DecodeArgs a = a0;
  a.out = pool.data() + 64;
  rejected(a, "state_pool: shares memory with out");
  a = a0;
  a.per_token_states = pool.data();
  rejected(a, "per_token_states: shares memory with state_pool");
  a = a0;
  a.state_out_pool = pool.data() + 16;
  rejected(a, "state_out_pool: shares memory with state_pool");
  a = a0;
  a.out = const_cast<void*>(a.v);
  rejected(a, "out: shares memory with v");
  a = a0;
  a.state_out_pool = pool.data();  // the pool itself, same stride: in place
  const Status st = flashkda::validate_decode(a, Backend::kCpuChunked);
  EXPECT_TRUE(st.ok()) << st.message;
  // Slots two slots' room apart: out in slot 1 is refused though neither end of
  // the pool's range is inside it; out in the gap after slot 0 is not an overlap.
  const size_t slot_bytes = pool.size() / static_cast<size_t>(p.pool_size);
  std::vector<uint8_t> spread(2 * pool.size());
  a = a0;
  a.state_pool = spread.data();
  a.pool_stride = 2 * p.per_slot;
  ASSERT_LE(out.size() * 2, slot_bytes);
  a.out = spread.data() + 2 * slot_bytes;
  rejected(a, "state_pool: shares memory with out");
  a.out = spread.data() + slot_bytes;
  const Status gap = flashkda::validate_decode(a, Backend::kCpuChunked);
  EXPECT_TRUE(gap.ok()) << gap.message;
}
