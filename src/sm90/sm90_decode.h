// The GPU decode behind flashkda::decode(Backend::kCuda). Arguments reaching
// these functions have passed flashkda::validate_decode().
#pragma once
#include "flashkda/flashkda.h"

namespace flashkda::sm90 {

// Shapes the decode kernel handles (K = V = 128) on a usable device; else kNotSupported.
Status check_decode_supported(const DecodeArgs& args);
Status decode(const DecodeArgs& args, void* stream);

}  // namespace flashkda::sm90
