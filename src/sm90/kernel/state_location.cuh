// Where the recurrent state of one (sequence, value head) comes from and goes
// to: the dense initial_state / final_state tensors [N, HV, V, K], or a slot of
// the state pool, in place. Row i, key j of the state is element offset + i·K + j
// (64-bit) of `in` / `out`, K = kDim (the caller's head dim); offset + j·V + i
// where key_major (the dense tensors as [N, HV, K, V]: ForwardArgs::states_key_major).
//
// state_indices live on the device: an index past the pool is skipped (no read,
// no write, the sequence starts from zero) and recorded by the prologue kernel
// (device_faults.h); a negative one means "no slot".
#pragma once
#include <cstdint>

#include "sm90/kernel/params.h"
#include "sm90/kernel/shared_storage.cuh"

namespace flashkda::sm90 {

struct StateLocation {
  const void* in;
  void* out;
  int32_t in_type, out_type;  // StateType; kStateNone: start from zero / write nothing
  int64_t offset;             // element offset of row 0, key 0
  bool key_major;             // [K, V] rather than [V, K]
};

// Sequence n's pool slot as the caller gave it (negative: none).
__device__ __forceinline__ int64_t state_slot(const FwdParams& p, int64_t n) {
  return p.index_is_int64 ? static_cast<const int64_t*>(p.state_indices)[n]
                          : static_cast<int64_t>(static_cast<const int32_t*>(p.state_indices)[n]);
}

template <int kDim>
__device__ __forceinline__ StateLocation state_location(const FwdParams& p, int seq, int v_head) {
  StateLocation l;
  if (p.state_pool == nullptr) {
    l.in = p.initial_state;
    l.out = p.final_state;
    l.in_type = p.initial_state_type;
    l.out_type = p.final_state_type;
    l.offset = (static_cast<int64_t>(seq) * p.num_v_heads + v_head) * kDim * kDim;
    l.key_major = p.states_key_major != 0;
    return l;
  }
  const int64_t slot = state_slot(p, seq);
  const bool in_pool = slot >= 0 && slot < p.pool_size;
  l.in = l.out = p.state_pool;
  l.out_type = in_pool ? p.pool_type : kStateNone;
  l.in_type = in_pool && (p.has_initial_state == nullptr || p.has_initial_state[seq] != 0) ? p.pool_type : kStateNone;
  l.offset = in_pool ? slot * p.pool_stride + static_cast<int64_t>(v_head) * kDim * kDim : 0;
  l.key_major = false;
  return l;
}

}  // namespace flashkda::sm90
