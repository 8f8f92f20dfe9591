// The forward on a state pool for the CPU backends (ForwardArgs::state_pool):
// the oracle twin of an in-place kernel. Each sequence's slot is read into a
// dense initial state (zero without a slot or without a state), the backend runs
// on dense states, every final state with a slot goes back to it, and then the
// slot checkpoints are written. Arguments reaching here passed validate(): the
// indices are below pool_size and the offsets on 16-token boundaries.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/sequences.h"
#include "common/bf16.h"
#include "cpu/checkpoints.h"
#include "cpu/cpu_backends.h"

namespace flashkda::cpu {

Status forward_on_pool(const ForwardArgs& args, const std::function<Status(const ForwardArgs&)>& run) {
  const int64_t N = num_sequences(args), HV = value_heads(args), K = args.head_dim_k, V = args.head_dim_v;
  const int64_t per_state = HV * V * K;
  const size_t elem = args.state_pool_dtype == DType::kFP32 ? 4 : 2;
  const size_t per_slot = static_cast<size_t>(per_state) * elem;
  const int64_t stride = args.pool_stride == 0 ? per_state : args.pool_stride;
  auto* pool = static_cast<unsigned char*>(args.state_pool);
  auto index = [&](const void* indices, int64_t i) { return index_at(indices, args.state_index_type, i); };
  auto slot_bytes = [&](int64_t s) { return pool + static_cast<size_t>(s * stride) * elem; };
  std::vector<unsigned char> initial(static_cast<size_t>(N) * per_slot, 0), final_(initial.size(), 0);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t s = index(args.state_indices, n);
    const bool has = s >= 0 && (args.has_initial_state == nullptr || args.has_initial_state[n] != 0);
    if (has) std::memcpy(&initial[static_cast<size_t>(n) * per_slot], slot_bytes(s), per_slot);
  }
  ForwardArgs dense = args;
  dense.state_pool = nullptr;
  dense.state_pool_dtype = DType::kNone;
  dense.state_indices = nullptr;
  dense.has_initial_state = nullptr;
  dense.slot_checkpoint_offsets = nullptr;
  dense.slot_checkpoint_slots = nullptr;
  dense.initial_state = initial.data();
  dense.initial_state_dtype = args.state_pool_dtype;
  dense.final_state = final_.data();
  dense.final_state_dtype = args.state_pool_dtype;

  // Slot checkpoints: the backend writes the state at every 16-token boundary
  // (fp32, value-major) into scratch; the requested ones, and any checkpoints the
  // caller asked for, are taken from there (the same roundings as written directly:
  // every checkpoint passes through fp32).
  const bool slot_checkpoints = args.slot_checkpoint_offsets != nullptr;
  const std::vector<SequenceSpan> spans = sequence_spans(args, args.cu_seqlens);
  std::vector<float> every16;
  std::vector<int64_t> first16;
  if (slot_checkpoints) {
    dense.checkpoint_interval = 16;
    first16 = checkpoint_offsets(spans, 16);
    int64_t scratch = 0;
    if (__builtin_mul_overflow(first16.back(), per_state, &scratch))
      return Status::NotSupported("slot_checkpoint_offsets: the states at every 16 tokens (" +
                                  std::to_string(first16.back()) + " x " + std::to_string(per_state) +
                                  " floats) overflow int64 on the CPU backends");
    every16.assign(static_cast<size_t>(scratch), 0.f);
    dense.checkpoints = every16.empty() ? nullptr : every16.data();
    dense.checkpoints_dtype = DType::kFP32;
    dense.checkpoints_capacity = first16.back();
    dense.checkpoints_value_major = true;
  }
  const Status st = run(dense);
  if (!st.ok()) return st;

  for (int64_t n = 0; n < N; ++n) {
    const int64_t s = index(args.state_indices, n);
    if (s >= 0) std::memcpy(slot_bytes(s), &final_[static_cast<size_t>(n) * per_slot], per_slot);
  }
  if (!slot_checkpoints) return Status::Ok();
  if (args.checkpoints != nullptr) {
    const std::vector<int64_t> first = checkpoint_offsets(spans, args.checkpoint_interval);
    const int64_t step = args.checkpoint_interval / 16;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < first[static_cast<size_t>(n) + 1] - first[static_cast<size_t>(n)]; ++j)
        for (int64_t hv = 0; hv < HV; ++hv)
          write_checkpoint(args, first[static_cast<size_t>(n)] + j, hv,
                           &every16[static_cast<size_t>((first16[static_cast<size_t>(n)] + j * step) * per_state +
                                                        hv * V * K)]);
  }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < kSlotCheckpointsPerSequence; ++i) {
      const int64_t off = args.slot_checkpoint_offsets[n * kSlotCheckpointsPerSequence + i];
      const int64_t s = index(args.slot_checkpoint_slots, n * kSlotCheckpointsPerSequence + i);
      if (off < 0 || s < 0) continue;
      if (off == spans[static_cast<size_t>(n)].length) {  // the final state
        std::memcpy(slot_bytes(s), &final_[static_cast<size_t>(n) * per_slot], per_slot);
        continue;
      }
      const float* src = &every16[static_cast<size_t>((first16[static_cast<size_t>(n)] + off / 16) * per_state)];
      unsigned char* dst = slot_bytes(s);
      for (int64_t e = 0; e < per_state; ++e) {
        if (args.state_pool_dtype == DType::kFP32) std::memcpy(dst + e * 4, &src[e], 4);
        else {
          const uint16_t b = float_to_bf16(src[e]);
          std::memcpy(dst + e * 2, &b, 2);
        }
      }
    }
  return Status::Ok();
}

}  // namespace flashkda::cpu
