// Faults in device-resident arguments, recorded by the kernels.
//
// Some arguments live in device memory and cannot be checked on the host without
// a synchronisation: the values of cu_seqlens (forward and decode, int64 or
// int32) and state_indices (decode, and the forward on a pool), and log decays
// (g with GateForm::kLogDecay, read as 0 where above 0). Whatever they hold, no kernel reads or writes outside the
// tensors it was given: a sequence's bounds are clamped to [0, T] (begin <= end),
// an index past the pool is skipped. The kernel that meets such a value also
// records it on its device; check_device_faults() (flashkda.h) turns the record
// into an error naming the argument and clears it.
//
// The record is a __device__ global of the translation unit whose kernels write
// it (the prologue's for the forward, the decode's), reached by the kernels
// directly: a module global is placed anew with every context, so no address is
// cached on the host (a cached one would point into freed memory after
// cudaDeviceReset). Each such unit exports a take function for the host.
#pragma once
#include <cstdint>

#ifdef __CUDACC__
#include <cuda_runtime.h>
#endif

namespace flashkda::sm90 {

// What was wrong, one bit per (call, argument).
enum DeviceFaultKind : int {
  kFaultForwardCuSeqlens = 0,  // forward: cu_seqlens not 0 = c[0] <= c[1] <= ... <= c[N] = T
  kFaultDecodeCuSeqlens = 1,   // decode: the same rule for its cu_seqlens
  kFaultDecodeStateIndex = 2,  // decode: state_indices[n] >= the pool size
  kFaultForwardStateIndex = 3, // forward on a pool: state_indices[n] >= the pool size
  kFaultForwardSlotCheckpoint = 4,  // forward: a slot checkpoint's offset or slot out of range
  kFaultDecodeAcceptedTokens = 5,   // decode, verify: num_accepted_tokens[n] outside [1, verify_slots]
  kFaultDecodeVerifyLength = 6,     // decode, verify: sequence n has more tokens than verify_slots
  kFaultForwardGate = 7,  // forward, GateForm::kLogDecay: a log decay above 0 (index: its chunk's first token)
  kFaultDecodeGate = 8,   // decode, GateForm::kLogDecay: a log decay above 0 (index: its token)
  kNumDeviceFaultKinds = 9,
};

// The record: which kinds happened, and the lowest offending position of each
// (sequence n, or a token for the gates; ~0 when none).
struct DeviceFaults {
  unsigned int kinds;
  unsigned int reserved;
  unsigned long long first_index[kNumDeviceFaultKinds];
};
constexpr unsigned long long kNoFaultIndex = ~0ull;

#ifdef __CUDACC__
// The take functions of the recording units: read and clear their record,
// ordered on `stream` (the copy to *taken completes before they return).
cudaError_t take_forward_faults(cudaStream_t stream, DeviceFaults* taken);
cudaError_t take_decode_faults(cudaStream_t stream, DeviceFaults* taken);

// [begin, end) of sequence n from device-resident offsets, clamped so that
// 0 <= begin <= end <= total; `valid` says whether they needed no clamping and
// fit the rule 0 = c[0] <= c[1] <= ... <= c[N] = total.
struct ClampedSpan {
  int64_t begin, end;
  bool valid;
};
__device__ __forceinline__ int64_t clamp_offset(int64_t x, int64_t lo, int64_t hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}
// Sequence n's span from its two boundary values b = cu[n], e = cu[n + 1].
__device__ __forceinline__ ClampedSpan clamped_span_of(int64_t b, int64_t e, int64_t n, int64_t num_seqs,
                                                       int64_t total) {
  ClampedSpan s;
  s.begin = clamp_offset(b, 0, total);
  s.end = clamp_offset(e, s.begin, total);
  s.valid = b == s.begin && e == s.end && (n > 0 || b == 0) && (n + 1 < num_seqs || e == total);
  return s;
}
template <typename Offset>  // int64_t or int32_t
__device__ __forceinline__ ClampedSpan clamped_span(const Offset* cu, int64_t n, int64_t num_seqs, int64_t total) {
  return clamped_span_of(cu[n], cu[n + 1], n, num_seqs, total);
}
#endif

}  // namespace flashkda::sm90
