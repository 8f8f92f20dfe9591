// The forward on a state pool (ForwardArgs::state_pool) on the CPU backends:
// bitwise the dense forward from the gathered slots, final states back in their
// slots, nothing else of the pool touched (other slots and the padding between
// slots keep their bytes), negative indices and has_initial_state = 0 start from
// zero; the C ABI gives the same bits; bad arguments are named.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "cpu_test_util.h"
#include "flashkda/flashkda_c.h"

namespace flashkda::testing {
namespace {

// Varlen with GVA and an empty sequence: N = 4, H = 2, HV = 4, K = V = 32.
HostProblem pool_problem(uint64_t seed) { return varlen_gva_problem(seed); }

constexpr int64_t kPoolSize = 7;
constexpr int64_t kSlotPadding = 8;  // elements of padding after each slot (pool_stride > HV·V·K)

struct PoolCase {
  DType dtype;
  IndexType index_type;
};

class StatePool : public ::testing::TestWithParam<std::tuple<Backend, PoolCase>> {};

// Bytes of a pool of kPoolSize slots filled with a recognisable pattern.
std::vector<unsigned char> patterned_pool(size_t bytes) {
  std::vector<unsigned char> pool(bytes);
  for (size_t i = 0; i < bytes; ++i) pool[i] = static_cast<unsigned char>((i * 131 + 7) & 0xff);
  // A valid number in every element would also do; the pattern makes any stray write visible.
  return pool;
}

TEST_P(StatePool, EqualsTheDenseForwardAndTouchesOnlyItsSlots) {
  const Backend backend = std::get<0>(GetParam());
  const PoolCase pc = std::get<1>(GetParam());
  HostProblem p = pool_problem(61);
  const int64_t N = p.N, HV = p.HV, K = p.K, V = p.V, per_slot = HV * V * K, stride = per_slot + kSlotPadding;
  const size_t elem = pc.dtype == DType::kFP32 ? 4 : 2;
  // Slots: sequence 0 -> 5, 1 -> none, 2 -> 2 (but no state yet), 3 -> 0.
  const std::vector<int64_t> slots = {5, -1, 2, 0};
  const std::vector<uint8_t> has = {1, 1, 0, 1};
  std::vector<int32_t> idx32(slots.begin(), slots.end());
  std::vector<unsigned char> pool = patterned_pool(static_cast<size_t>(kPoolSize * stride) * elem);
  // Real states in the slots that are read (the pattern would not be a sane state).
  std::mt19937_64 rng(62);
  std::normal_distribution<float> normal(0.f, 0.1f);
  for (int64_t s : {5, 0}) {
    for (int64_t e = 0; e < per_slot; ++e) {
      const float x = normal(rng);
      unsigned char* at = pool.data() + static_cast<size_t>(s * stride + e) * elem;
      if (pc.dtype == DType::kFP32) std::memcpy(at, &x, 4);
      else {
        const uint16_t b = float_to_bf16(x);
        std::memcpy(at, &b, 2);
      }
    }
  }
  const std::vector<unsigned char> before = pool;

  // The dense twin: initial states gathered by hand.
  std::vector<unsigned char> dense_init(static_cast<size_t>(N * per_slot) * elem, 0), dense_final(dense_init.size());
  for (int64_t n = 0; n < N; ++n)
    if (slots[static_cast<size_t>(n)] >= 0 && has[static_cast<size_t>(n)])
      std::memcpy(&dense_init[static_cast<size_t>(n * per_slot) * elem],
                  &pool[static_cast<size_t>(slots[static_cast<size_t>(n)] * stride) * elem],
                  static_cast<size_t>(per_slot) * elem);
  std::vector<uint16_t> out_dense(p.out_elems()), out_pool(p.out_elems());
  ForwardArgs d = p.host_args(out_dense.data(), nullptr);
  d.initial_state = dense_init.data();
  d.initial_state_dtype = pc.dtype;
  d.final_state = dense_final.data();
  d.final_state_dtype = pc.dtype;
  Status st = forward(d, backend, nullptr, 0, nullptr);
  ASSERT_TRUE(st.ok()) << st.message;

  ForwardArgs a = p.host_args(out_pool.data(), nullptr);
  a.initial_state = nullptr;
  a.initial_state_dtype = DType::kNone;
  a.final_state = nullptr;
  a.final_state_dtype = DType::kNone;
  a.state_pool = pool.data();
  a.state_pool_dtype = pc.dtype;
  a.pool_size = kPoolSize;
  a.pool_stride = stride;
  a.state_indices = pc.index_type == IndexType::kInt64 ? static_cast<const void*>(slots.data())
                                                       : static_cast<const void*>(idx32.data());
  a.state_index_type = pc.index_type;
  a.has_initial_state = has.data();
  st = forward(a, backend, nullptr, 0, nullptr);
  ASSERT_TRUE(st.ok()) << st.message;

  EXPECT_EQ(out_pool, out_dense);
  for (int64_t s = 0; s < kPoolSize; ++s) {
    int64_t seq = -1;
    for (int64_t n = 0; n < N; ++n)
      if (slots[static_cast<size_t>(n)] == s) seq = n;
    const size_t off = static_cast<size_t>(s * stride) * elem, bytes = static_cast<size_t>(per_slot) * elem;
    if (seq >= 0)
      EXPECT_EQ(0, std::memcmp(&pool[off], &dense_final[static_cast<size_t>(seq * per_slot) * elem], bytes))
          << "slot " << s << " should hold sequence " << seq << "'s final state";
    else
      EXPECT_EQ(0, std::memcmp(&pool[off], &before[off], bytes)) << "slot " << s << " was written";
    // The padding after every slot is never written.
    EXPECT_EQ(0, std::memcmp(&pool[off + bytes], &before[off + bytes], static_cast<size_t>(kSlotPadding) * elem))
        << "padding after slot " << s;
  }

  // The C ABI: the same bits.
  std::vector<unsigned char> pool_c = before;
  std::vector<uint16_t> out_c(p.out_elems());
  flashkda_forward_args c{};
  flashkda_forward_args_init(&c);
  ForwardArgs ac = a;
  ac.out = out_c.data();
  ac.state_pool = pool_c.data();
  c.q = ac.q; c.k = ac.k; c.v = ac.v; c.g = ac.g; c.beta = ac.beta; c.A_log = ac.A_log; c.dt_bias = ac.dt_bias;
  c.out = ac.out; c.cu_seqlens = ac.cu_seqlens; c.num_seqs = ac.num_seqs; c.batch = ac.batch; c.seqlen = ac.seqlen;
  c.num_heads = ac.num_heads; c.num_v_heads = ac.num_v_heads; c.head_dim_k = ac.head_dim_k;
  c.head_dim_v = ac.head_dim_v; c.scale = ac.scale; c.lower_bound = ac.lower_bound;
  c.state_pool = ac.state_pool; c.state_pool_dtype = static_cast<int32_t>(ac.state_pool_dtype);
  c.pool_size = ac.pool_size; c.pool_stride = ac.pool_stride; c.state_indices = ac.state_indices;
  c.state_index_type = static_cast<int32_t>(ac.state_index_type); c.has_initial_state = ac.has_initial_state;
  ASSERT_EQ(flashkda_forward(&c, static_cast<int32_t>(backend), nullptr, 0, nullptr), FLASHKDA_STATUS_OK)
      << flashkda_last_error();
  EXPECT_EQ(out_c, out_pool);
  EXPECT_EQ(pool_c, pool);
}

INSTANTIATE_TEST_SUITE_P(
    Pools, StatePool,
    ::testing::Combine(::testing::Values(Backend::kCpuReference, Backend::kCpuChunked),
                       ::testing::Values(PoolCase{DType::kFP32, IndexType::kInt32},
                                         PoolCase{DType::kFP32, IndexType::kInt64},
                                         PoolCase{DType::kBF16, IndexType::kInt32})),
    [](const auto& info) {
      const PoolCase pc = std::get<1>(info.param);
      return std::string(std::get<0>(info.param) == Backend::kCpuReference ? "reference" : "chunked") + "_" +
             (pc.dtype == DType::kFP32 ? "fp32" : "bf16") + "_" +
             (pc.index_type == IndexType::kInt64 ? "int64" : "int32");
    });

// Without has_initial_state every sequence with a slot starts from it; a pool
// with the default stride (0 = HV·V·K, slots back to back).
TEST(StatePoolDefaults, NoMaskAndDenseSlots) {
  HostProblem p = pool_problem(63);
  const int64_t per_slot = p.HV * p.V * p.K;
  std::vector<float> pool(static_cast<size_t>(3 * per_slot));
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = 0.05f * static_cast<float>((i * 37) % 11) - 0.25f;
  const std::vector<int32_t> slots = {2, 1, -1, 0};
  std::vector<float> init(static_cast<size_t>(p.N * per_slot), 0.f), fin(init.size());
  for (int64_t n = 0; n < p.N; ++n)
    if (slots[static_cast<size_t>(n)] >= 0)
      std::memcpy(&init[static_cast<size_t>(n * per_slot)], &pool[static_cast<size_t>(slots[static_cast<size_t>(n)] * per_slot)],
                  static_cast<size_t>(per_slot) * 4);
  std::vector<uint16_t> o1(p.out_elems()), o2(p.out_elems());
  ForwardArgs d = p.host_args(o1.data(), nullptr);
  d.initial_state = init.data();
  d.final_state = fin.data();
  d.final_state_dtype = DType::kFP32;
  ASSERT_TRUE(forward(d, Backend::kCpuChunked, nullptr, 0, nullptr).ok());
  ForwardArgs a = p.host_args(o2.data(), nullptr);
  a.initial_state = nullptr;
  a.initial_state_dtype = DType::kNone;
  a.final_state_dtype = DType::kNone;
  a.state_pool = pool.data();
  a.state_pool_dtype = DType::kFP32;
  a.pool_size = 3;
  a.state_indices = slots.data();
  const Status st = forward(a, Backend::kCpuChunked, nullptr, 0, nullptr);
  ASSERT_TRUE(st.ok()) << st.message;
  EXPECT_EQ(o1, o2);
  for (int64_t n : {0, 1, 3})
    EXPECT_EQ(0, std::memcmp(&pool[static_cast<size_t>(slots[static_cast<size_t>(n)] * per_slot)],
                             &fin[static_cast<size_t>(n * per_slot)], static_cast<size_t>(per_slot) * 4))
        << "sequence " << n;
}

// Slot checkpoints (vLLM's "align" mode) with the pool, together with regular
// checkpoints: each written slot holds, bit for bit in the pool's dtype, the final
// state of the same backend run on that prefix from the sequence's slot state; an
// offset equal to the length gives the final state; negative offsets or slots
// write nothing; the regular checkpoints are those of the dense run.
TEST(StatePoolSlotCheckpoints, EachSlotHoldsThePrefixRunsState) {
  for (const Backend backend : {Backend::kCpuReference, Backend::kCpuChunked})
    for (const DType dtype : {DType::kFP32, DType::kBF16}) {
      HostProblem p = pool_problem(65);  // lengths 37, 0, 64, 21
      const int64_t N = p.N, per_slot = p.HV * p.V * p.K;
      const size_t elem = dtype == DType::kFP32 ? 4 : 2;
      constexpr int64_t kSlots = 12;
      std::vector<unsigned char> pool = patterned_pool(static_cast<size_t>(kSlots * per_slot) * elem);
      // Sequence states in slots 0..3 (readable numbers), the rest patterned.
      std::vector<std::vector<float>> init(static_cast<size_t>(N));
      for (int64_t n = 0; n < N; ++n) {
        init[static_cast<size_t>(n)] = initial_of(p, n);
        for (int64_t e = 0; e < per_slot; ++e) {
          float x = init[static_cast<size_t>(n)][static_cast<size_t>(e)];
          if (dtype == DType::kBF16) x = bf16_to_float(float_to_bf16(x));  // what the slot can hold
          init[static_cast<size_t>(n)][static_cast<size_t>(e)] = x;
          unsigned char* at = pool.data() + static_cast<size_t>(n * per_slot + e) * elem;
          if (dtype == DType::kFP32) std::memcpy(at, &x, 4);
          else {
            const uint16_t b = float_to_bf16(x);
            std::memcpy(at, &b, 2);
          }
        }
      }
      const std::vector<unsigned char> before = pool;
      const std::vector<int32_t> slots = {0, 1, 2, 3};
      // [n][i]: (offset, slot). Sequence 0: 16 -> 5, 32 -> 6; 1 (empty): negative
      // offsets with slots 9, 10; 2: 48 -> 7, 64 (its length: the final state) -> 11;
      // 3: 16 -> 8, and 16 with a negative slot.
      const std::vector<int64_t> offsets = {16, 32, -1, -1, 48, 64, 16, 16};
      const std::vector<int32_t> ck_slots = {5, 6, 9, 10, 7, 11, 8, -1};
      // Regular checkpoints every 32 tokens, fp32 value-major: 2 + 0 + 2 + 1 = 5 entries.
      std::vector<float> ck(static_cast<size_t>(5 * per_slot), std::nanf(""));
      std::vector<uint16_t> out(p.out_elems());
      ForwardArgs a = p.host_args(out.data(), nullptr);
      a.initial_state = nullptr;
      a.initial_state_dtype = DType::kNone;
      a.final_state_dtype = DType::kNone;
      a.state_pool = pool.data();
      a.state_pool_dtype = dtype;
      a.pool_size = kSlots;
      a.state_indices = slots.data();
      a.slot_checkpoint_offsets = offsets.data();
      a.slot_checkpoint_slots = ck_slots.data();
      a.checkpoints = ck.data();
      a.checkpoints_dtype = DType::kFP32;
      a.checkpoint_interval = 32;
      a.checkpoints_capacity = 5;
      a.checkpoints_value_major = true;
      const Status st = forward(a, backend, nullptr, 0, nullptr);
      ASSERT_TRUE(st.ok()) << st.message;

      auto slot_matches = [&](int64_t s, const std::vector<float>& want) {
        int64_t bad = 0;
        for (int64_t e = 0; e < per_slot; ++e) {
          const unsigned char* at = pool.data() + static_cast<size_t>(s * per_slot + e) * elem;
          if (dtype == DType::kFP32) bad += std::memcmp(at, &want[static_cast<size_t>(e)], 4) != 0;
          else {
            uint16_t b;
            std::memcpy(&b, at, 2);
            bad += b != float_to_bf16(want[static_cast<size_t>(e)]);
          }
        }
        return bad;
      };
      const std::string where = std::string(to_string(backend)) + (dtype == DType::kFP32 ? " fp32" : " bf16");
      EXPECT_EQ(slot_matches(5, prefix_state(p, 0, 16, backend, init[0])), 0) << where << ": slot 5";
      EXPECT_EQ(slot_matches(6, prefix_state(p, 0, 32, backend, init[0])), 0) << where << ": slot 6";
      EXPECT_EQ(slot_matches(7, prefix_state(p, 2, 48, backend, init[2])), 0) << where << ": slot 7";
      EXPECT_EQ(slot_matches(11, prefix_state(p, 2, 64, backend, init[2])), 0) << where << ": slot 11 (the final state)";
      EXPECT_EQ(slot_matches(8, prefix_state(p, 3, 16, backend, init[3])), 0) << where << ": slot 8";
      EXPECT_EQ(slot_matches(0, prefix_state(p, 0, 37, backend, init[0])), 0) << where << ": slot 0 (final)";
      for (int64_t s : {4, 9, 10})
        EXPECT_EQ(0, std::memcmp(pool.data() + static_cast<size_t>(s * per_slot) * elem,
                                 before.data() + static_cast<size_t>(s * per_slot) * elem,
                                 static_cast<size_t>(per_slot) * elem))
            << where << ": slot " << s << " was written";
      // The regular checkpoints: entries of sequences 0 (0, 32), 2 (0, 32), 3 (0).
      const int64_t entry_seq[] = {0, 0, 2, 2, 3}, entry_tokens[] = {0, 32, 0, 32, 0};
      for (int64_t e = 0; e < 5; ++e) {
        const std::vector<float> want = prefix_state(p, entry_seq[e], entry_tokens[e], backend, init[static_cast<size_t>(entry_seq[e])]);
        EXPECT_EQ(0, std::memcmp(&ck[static_cast<size_t>(e * per_slot)], want.data(), static_cast<size_t>(per_slot) * 4))
            << where << ": checkpoint entry " << e;
      }
    }
}

TEST(StatePoolValidation, BadArgumentsAreNamed) {
  HostProblem p = pool_problem(64);
  const int64_t per_slot = p.HV * p.V * p.K;
  std::vector<float> pool(static_cast<size_t>(4 * per_slot), 0.f);
  std::vector<int32_t> slots = {0, 1, 2, 3};
  std::vector<uint16_t> out(p.out_elems());
  auto base = [&] {
    ForwardArgs a = p.host_args(out.data(), nullptr);
    a.initial_state = nullptr;
    a.initial_state_dtype = DType::kNone;
    a.final_state_dtype = DType::kNone;
    a.state_pool = pool.data();
    a.state_pool_dtype = DType::kFP32;
    a.pool_size = 4;
    a.state_indices = slots.data();
    return a;
  };
  const auto expect = expect_invalid;
  EXPECT_TRUE(validate(base(), Backend::kCpuChunked).ok());
  ForwardArgs key_major = base();  // the layout of dense states only: slots are [HV, V, K]
  key_major.states_key_major = true;
  expect(key_major, Backend::kCpuChunked, StatusCode::kInvalidArgument, "states_key_major: set with a state_pool");
  ForwardArgs a = base();
  a.initial_state = p.init_f32.data();
  a.initial_state_dtype = DType::kFP32;
  expect(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, "state_pool: given together with initial_state");
  a = base();
  a.state_pool_dtype = DType::kNone;
  expect(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, "state_pool_dtype");
  a = base();
  a.pool_size = 0;
  expect(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, "pool_size");
  a = base();
  a.pool_stride = per_slot - 1;
  expect(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, "pool_stride");
  a = base();
  a.state_indices = nullptr;
  expect(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, "state_indices: null pointer");
  a = base();
  a.state_index_type = static_cast<IndexType>(5);
  expect(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, "state_index_type");
  slots[2] = 4;  // == pool_size
  expect(base(), Backend::kCpuReference, StatusCode::kInvalidArgument, "state_indices: entry 2 is 4");
  slots[2] = 2;
  a = base();
  a.state_pool = nullptr;
  a.state_pool_dtype = DType::kNone;
  expect(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, "state_indices: given without state_pool");
  a.state_indices = nullptr;
  a.state_pool_dtype = DType::kFP32;
  expect(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, "state_pool: null pointer but state_pool_dtype is kFP32");
  a.state_pool_dtype = DType::kNone;
  const std::vector<uint8_t> has(static_cast<size_t>(p.N), 1);
  a.has_initial_state = has.data();
  expect(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, "has_initial_state: given without state_pool");
  a = base();
  a.state_pool = reinterpret_cast<char*>(pool.data()) + 2;
  expect(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, "state_pool: expected a 4-byte aligned");
  {
    // kCuda runs on a pool whose slots stay 16-byte aligned.
    const Status cuda = validate(base(), Backend::kCuda);
    EXPECT_EQ(cuda.message.find("state_pool"), std::string::npos) << cuda.message;
    a = base();
    a.pool_stride = per_slot + 2;
    expect(a, Backend::kCuda, StatusCode::kInvalidArgument, "pool_stride: backend kCuda needs a multiple of 4");
  }
  // Slot checkpoints: offsets on 16-token boundaries within the sequence, slots in the pool.
  std::vector<int64_t> offsets = {16, -1, -1, -1, 32, -1, -1, -1};  // lengths 37, 0, 64, 21
  std::vector<int32_t> ck_slots = {1, -1, -1, -1, 2, -1, -1, -1};
  a = base();
  a.slot_checkpoint_offsets = offsets.data();
  a.slot_checkpoint_slots = ck_slots.data();
  EXPECT_TRUE(validate(a, Backend::kCpuChunked).ok());
  offsets[0] = 24;
  expect(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, "slot_checkpoint_offsets: entry [0, 0] is 24");
  offsets[0] = 48;  // past sequence 0's 37 tokens
  expect(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, "in [16, 37]");
  // A negative slot is "none" whatever its offset, as every backend runs it
  // (kCuda records no fault for it): entry [0, 1] has offset 8 and no slot.
  offsets[0] = 16;
  offsets[1] = 8;
  EXPECT_TRUE(validate(a, Backend::kCpuChunked).ok());
  EXPECT_TRUE(validate(a, Backend::kCpuReference).ok());
  offsets[1] = -1;
  ck_slots[4] = 4;
  expect(a, Backend::kCpuChunked, StatusCode::kInvalidArgument,
         "slot_checkpoint_slots: entry [2, 0] is 4, expected < pool_size=4");
  // A negative offset is "none" whatever its slot (kCuda neither reads that slot
  // nor records a fault for it): entry [2, 0] keeps slot 4 with no offset.
  offsets[4] = -1;
  EXPECT_TRUE(validate(a, Backend::kCpuChunked).ok());
  EXPECT_TRUE(validate(a, Backend::kCpuReference).ok());
  offsets[4] = 32;
  ck_slots[4] = 2;
  a.slot_checkpoint_slots = nullptr;
  expect(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, "slot_checkpoint_slots: null pointer");
  a = p.host_args(out.data(), nullptr);
  a.final_state_dtype = DType::kNone;
  a.slot_checkpoint_offsets = offsets.data();
  a.slot_checkpoint_slots = ck_slots.data();
  expect(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, "need a state_pool");
}

}  // namespace
}  // namespace flashkda::testing
