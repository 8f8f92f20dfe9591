// Everything the forward kernel reads from the host, in one struct passed by value.
#pragma once
#include <cstdint>

#include "sm90/device_faults.h"

namespace flashkda::sm90 {

// State tensor element type as the kernel sees it (mirrors flashkda::DType).
enum StateType : int32_t { kStateNone = 0, kStateBF16 = 1, kStateFP32 = 2 };

struct FwdParams {
  // bf16 tensors as raw 16-bit patterns; shapes as in flashkda::ForwardArgs.
  const uint16_t* q;     // [B*T, H,  K]
  const uint16_t* k;     // [B*T, H,  K]
  const uint16_t* v;     // [B*T, HV, V]
  const uint16_t* g;     // [B*T, HV, K]
  const uint16_t* beta;  // [B*T, HV]
  const float* A_log;    // [HV]
  const float* dt_bias;  // [HV, K]
  uint16_t* out;         // [B*T, HV, V]

  const void* initial_state;  // [N, HV, V, K] or null
  void* final_state;          // [N, HV, V, K] or null
  int32_t initial_state_type;
  int32_t final_state_type;

  const int64_t* cu_seqlens;  // [N+1] device pointer, or null: sequence n = batch row n
  int64_t seqlen;             // tokens per batch row when cu_seqlens is null
  int64_t total_tokens;       // B·T: cu_seqlens values are clamped to [0, total_tokens]

  int32_t num_seqs;    // N
  int32_t num_heads;   // H
  int32_t num_v_heads; // HV
  int32_t v_split;     // recurrence CTAs sharing one (sequence, head), each owning V / v_split rows

  // Workspace: one ChunkOperands record per (chunk slot, value head), written by
  // the prologue kernel and read by the recurrence kernel (tile_scheduler.cuh
  // says which slot a chunk has).
  void* chunk_records;
  int64_t num_slots;

  float scale;
  float lower_bound_log2e;  // lower_bound · log2(e): the gate works in base 2
};

}  // namespace flashkda::sm90
