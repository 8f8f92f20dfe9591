// A block-wide exclusive prefix sum of one int64 a thread, for the set-up work
// of the prologue's set-up CTA that lists or numbers things per sequence (the
// periodic checkpoints' first entries, the device's segment plan): each pass
// over kThreads sequences scans the pass's values and carries its total.
#pragma once
#include <cstdint>

namespace flashkda::sm90 {

// The sum of `mine` over the threads before this one, `*total` the sum over all
// kThreads. `warp_sums`: kThreads / 32 int64 of shared memory, free again when it
// returns (its last barrier: the next call may rewrite it at once). Every thread
// of the CTA calls it.
template <int kThreads>
__device__ __forceinline__ int64_t block_exclusive_sum(int64_t mine, int64_t* warp_sums, int tid, int64_t* total) {
  constexpr int kWarps = kThreads / 32;
  const int warp = tid >> 5, lane = tid & 31;
  int64_t upto = mine;  // inclusive over the warp's lanes
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int64_t x = __shfl_up_sync(0xffffffffu, upto, d);
    if (lane >= d) upto += x;
  }
  if (lane == 31) warp_sums[warp] = upto;
  __syncthreads();
  int64_t before = upto - mine, all = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before += warp_sums[w];
    all += warp_sums[w];
  }
  __syncthreads();
  *total = all;
  return before;
}

}  // namespace flashkda::sm90
