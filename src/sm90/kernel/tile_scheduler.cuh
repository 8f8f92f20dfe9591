// Which (sequence, value head, V-slice) a CTA works on, and that sequence's tokens.
#pragma once
#include <cstdint>

#include "sm90/kernel/params.h"

namespace flashkda::sm90 {

struct WorkTile {
  int seq;          // n
  int v_head;       // hv
  int qk_head;      // h = hv / (HV / H)
  int v_slice;      // which V / v_split rows of the state
  int64_t token_begin;  // first token (flattened B*T index)
  int64_t length;
};

// One CTA per tile, blockIdx.x = (seq · HV + hv) · v_split + slice: the CTAs of one
// (sequence, head) are neighbours so they share the prologue inputs through L2.
__device__ __forceinline__ WorkTile get_work_tile(const FwdParams& p) {
  WorkTile w;
  const int64_t idx = blockIdx.x;
  w.v_slice = static_cast<int>(idx % p.v_split);
  const int64_t sh = idx / p.v_split;
  w.v_head = static_cast<int>(sh % p.num_v_heads);
  w.seq = static_cast<int>(sh / p.num_v_heads);
  w.qk_head = w.v_head / (p.num_v_heads / p.num_heads);
  if (p.cu_seqlens != nullptr) {
    w.token_begin = p.cu_seqlens[w.seq];
    w.length = p.cu_seqlens[w.seq + 1] - w.token_begin;
  } else {
    w.token_begin = static_cast<int64_t>(w.seq) * p.seqlen;
    w.length = p.seqlen;
  }
  return w;
}

}  // namespace flashkda::sm90
