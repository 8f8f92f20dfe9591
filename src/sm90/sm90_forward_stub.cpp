// Built instead of the kernels when FLASHKDA_ENABLE_CUDA=OFF: every entry says so.
#include "sm90/sm90_decode.h"
#include "sm90/sm90_faults.h"
#include "sm90/sm90_forward.h"

namespace flashkda::sm90 {

namespace {
constexpr const char* kNotBuilt =
    "backend kCuda: this build of flash-kda has no CUDA kernels (configured with "
    "FLASHKDA_ENABLE_CUDA=OFF or without nvcc); use Backend::kCpuChunked";
}

bool compiled_in() { return false; }
bool device_supported(std::string* why) {
  if (why) *why = kNotBuilt;
  return false;
}
Status check_supported(const ForwardArgs&) { return Status::NotSupported(kNotBuilt); }
Status workspace_size(const ForwardArgs&, size_t*) { return Status::NotSupported(kNotBuilt); }
Status forward(const ForwardArgs&, void*, size_t, void*) { return Status::NotSupported(kNotBuilt); }
Status segment_summaries(const SegmentSummaryArgs&, const int64_t*) { return Status::NotSupported(kNotBuilt); }
Status copy_to_host(void*, const void*, size_t) { return Status::NotSupported(kNotBuilt); }
Status compose_summaries(const ComposeSummariesArgs&) { return Status::NotSupported(kNotBuilt); }
Status check_decode_supported(const DecodeArgs&) { return Status::NotSupported(kNotBuilt); }
Status decode(const DecodeArgs&, void*) { return Status::NotSupported(kNotBuilt); }
int decode_variant_count() { return 0; }
const char* decode_variant_name(int) { return nullptr; }
void set_decode_variant_override(int) {}
Status check_device_faults(void*) { return Status::Ok(); }  // no kernel can have recorded one

}  // namespace flashkda::sm90
