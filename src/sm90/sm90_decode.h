// The GPU decode behind flashkda::decode(Backend::kCuda). Arguments reaching
// these functions have passed flashkda::validate_decode().
#pragma once
#include "flashkda/flashkda.h"

namespace flashkda::sm90 {

// Shapes the decode kernels handle (K = V = 64 or 128) on a usable device; else kNotSupported.
Status check_decode_supported(const DecodeArgs& args);
Status decode(const DecodeArgs& args, void* stream);

// Kernel variants of the decode, for A/B benchmarks and tests (docs/perf-log.md,
// decode). Unless an override is set, decode() picks one by pool dtype and size
// (production_variant in sm90_decode.cu).
int decode_variant_count();
// Short name of variant v ("lat", "fuse-ef-occ", ...), or null when v is out of range.
const char* decode_variant_name(int v);
// For benchmarks and tests: force variant v (0 .. count-1) on later calls; -1
// restores the production choice. Process-wide, not thread-safe against
// concurrent decode() calls.
void set_decode_variant_override(int v);

}  // namespace flashkda::sm90
