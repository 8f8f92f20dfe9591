// The Hopper (sm_90a) backend behind flashkda::forward(Backend::kCuda).
// Arguments reaching these functions have passed flashkda::validate().
#pragma once
#include <cstddef>
#include <string>

#include "flashkda/flashkda.h"

namespace flashkda::sm90 {

// True when the kernels were compiled into this library.
bool compiled_in();
// True when the current CUDA device can run them (compute capability 9.0); else *why says why.
bool device_supported(std::string* why);
// Problem shapes this backend handles (K = V = 128, HV == H for now); else a kNotSupported status.
Status check_supported(const ForwardArgs& args);
Status workspace_size(const ForwardArgs& args, size_t* bytes);
Status forward(const ForwardArgs& args, void* workspace, size_t workspace_bytes, void* stream);

// How many CTAs share one (sequence, head), each owning V / v_split rows of the
// state: the launch heuristic's choice for this problem on this device.
int choose_v_split(int64_t num_tiles, int num_sms);
// For benchmarks and tests: force v_split (1, 2 or 4) on later calls; 0 restores
// the heuristic. Process-wide, not thread-safe against concurrent forward() calls.
void set_v_split_override(int v_split);

}  // namespace flashkda::sm90
