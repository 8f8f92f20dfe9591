// The forward on a state pool for the CPU backends (ForwardArgs::state_pool):
// the oracle twin of an in-place kernel. Each sequence's slot is read into a
// dense initial state (zero without a slot or without a state), the backend runs
// on dense states, and every final state with a slot goes back to it. Arguments
// reaching here passed validate(): the indices are below pool_size.
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/sequences.h"
#include "cpu/cpu_backends.h"

namespace flashkda::cpu {

Status forward_on_pool(const ForwardArgs& args, const std::function<Status(const ForwardArgs&)>& run) {
  const int64_t N = num_sequences(args), HV = value_heads(args), K = args.head_dim_k, V = args.head_dim_v;
  const size_t elem = args.state_pool_dtype == DType::kFP32 ? 4 : 2;
  const size_t per_slot = static_cast<size_t>(HV * V * K) * elem;
  const int64_t stride = args.pool_stride == 0 ? HV * V * K : args.pool_stride;
  auto* pool = static_cast<unsigned char*>(args.state_pool);
  auto slot_of = [&](int64_t n) -> int64_t {
    return args.state_index_type == IndexType::kInt64 ? static_cast<const int64_t*>(args.state_indices)[n]
                                                      : static_cast<const int32_t*>(args.state_indices)[n];
  };
  std::vector<unsigned char> initial(static_cast<size_t>(N) * per_slot, 0), final_(initial.size(), 0);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t s = slot_of(n);
    const bool has = s >= 0 && (args.has_initial_state == nullptr || args.has_initial_state[n] != 0);
    if (has) std::memcpy(&initial[static_cast<size_t>(n) * per_slot], pool + static_cast<size_t>(s * stride) * elem, per_slot);
  }
  ForwardArgs dense = args;
  dense.state_pool = nullptr;
  dense.state_pool_dtype = DType::kNone;
  dense.state_indices = nullptr;
  dense.has_initial_state = nullptr;
  dense.initial_state = initial.data();
  dense.initial_state_dtype = args.state_pool_dtype;
  dense.final_state = final_.data();
  dense.final_state_dtype = args.state_pool_dtype;
  const Status st = run(dense);
  if (!st.ok()) return st;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t s = slot_of(n);
    if (s >= 0) std::memcpy(pool + static_cast<size_t>(s * stride) * elem, &final_[static_cast<size_t>(n) * per_slot], per_slot);
  }
  return Status::Ok();
}

}  // namespace flashkda::cpu
