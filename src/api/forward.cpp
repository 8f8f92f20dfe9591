// flashkda::forward / workspace_size / cuda_backend_available / to_string:
// validation, then dispatch to one backend. No exception crosses the API: a
// backend that throws becomes a kInternal status.
#include <cstdint>
#include <exception>
#include <functional>
#include <new>
#include <string>
#include <vector>

#include "api/forward_internal.h"
#include "api/guarded.h"
#include "api/overlap.h"
#include "common/sequences.h"
#include "cpu/cpu_backends.h"
#include "flashkda/flashkda.h"
#include "sm90/sm90_faults.h"
#include "sm90/sm90_forward.h"

namespace flashkda {
using api::guarded;

namespace {
// A call with no token (so no out and no checkpoint), no final state, no pool and
// no summaries writes nothing: it is complete as it stands, whatever its batch. A
// batch of 2^40 empty sequences costs no time and needs no scratch.
bool writes_nothing(const ForwardArgs& a) {
  return a.batch * a.seqlen == 0 && a.final_state == nullptr && a.state_pool == nullptr &&
         a.summaries_M == nullptr && a.summaries_B == nullptr && a.checkpoints == nullptr &&
         a.slot_checkpoint_offsets == nullptr;
}
}  // namespace

Status workspace_size(const ForwardArgs& args, Backend backend, size_t* bytes) {
  if (bytes == nullptr) return Status::Invalid("bytes: null pointer");
  *bytes = 0;
  return guarded(backend, "workspace_size", [&]() -> Status {
    Status s = validate(args, backend);
    if (!s.ok()) return s;
    if (backend != Backend::kCuda || writes_nothing(args)) return Status::Ok();  // the CPU backends need none
    return sm90::workspace_size(args, bytes);
  });
}

namespace {

// A summaries call (ForwardArgs::summaries_M) on a CPU backend: the segment
// summaries of the whole sequences. (A resume call is an ordinary forward there.)
Status summaries_on_cpu(const ForwardArgs& args, Backend backend) {
  std::vector<int64_t> segments;
  for (const SequenceSpan& sp : sequence_spans(args, args.cu_seqlens)) {
    segments.push_back(sp.token_begin);
    segments.push_back(sp.token_begin + sp.length);
  }
  SegmentSummaryArgs s;
  s.inputs = args;
  s.segments = segments.data();
  s.num_segments = static_cast<int64_t>(segments.size() / 2);
  s.M = args.summaries_M;
  s.B = args.summaries_B;
  return backend == Backend::kCpuReference ? cpu::segment_summaries_f64(s) : cpu::segment_summaries_chunked_f32(s);
}

// A CPU backend's forward: int32 boundaries widened and strided inputs copied
// densely once per call (kCuda reads both as given), then on the pool or on
// dense states.
Status run_on_cpu(const ForwardArgs& args_in, Backend backend, const std::function<Status(const ForwardArgs&)>& run) {
  HostInputs storage;
  const ForwardArgs args = as_host_inputs(args_in, storage);
  if (args.summaries_M != nullptr) return summaries_on_cpu(args, backend);
  return args.state_pool != nullptr ? cpu::forward_on_pool(args, run) : run(args);
}

// forward() after validate(args, backend) returned Ok.
Status dispatch(const ForwardArgs& args, Backend backend, void* workspace, size_t workspace_bytes, void* stream) {
  if (writes_nothing(args)) return Status::Ok();
  switch (backend) {
    case Backend::kCpuReference:
      return run_on_cpu(args, backend, [](const ForwardArgs& a) { return cpu::reference_forward_f64(a); });
    case Backend::kCpuChunked:
      return run_on_cpu(args, backend, [](const ForwardArgs& a) { return cpu::chunked_forward_f32(a); });
    case Backend::kCuda: {
      // No device check here: validate() ran sm90::check_supported, which starts
      // with sm90::device_supported (and answers "not built" in a build without
      // the kernels), on this same current device.
      size_t required = 0;
      Status s = sm90::workspace_size(args, &required);
      if (!s.ok()) return s;
      if (required > 0) {
        if (workspace == nullptr || workspace_bytes < required)
          return Status::Invalid("workspace: expected at least " + std::to_string(required) + " bytes, got " +
                                 (workspace == nullptr ? std::string("a null pointer")
                                                       : std::to_string(workspace_bytes)));
        if (reinterpret_cast<uintptr_t>(workspace) % 256 != 0)
          return Status::Invalid("workspace: expected a 256-byte aligned pointer");
        s = validation::check_workspace_overlaps(args, workspace, static_cast<int64_t>(required));
        if (!s.ok()) return s;
      }
      return sm90::forward(args, workspace, workspace_bytes, stream);
    }
  }
  return Status::Invalid("backend: unknown value");  // unreachable: validate() rejects it
}

}  // namespace

Status forward(const ForwardArgs& args, Backend backend, void* workspace, size_t workspace_bytes, void* stream) {
  return guarded(backend, "forward", [&]() -> Status {
    Status s = validate(args, backend);  // for kCuda this includes sm90::check_supported
    if (!s.ok()) return s;
    return dispatch(args, backend, workspace, workspace_bytes, stream);
  });
}

namespace api {
Status forward_prevalidated(const ForwardArgs& args, Backend backend, void* workspace, size_t workspace_bytes,
                            void* stream) {
  return guarded(backend, "forward", [&]() -> Status {
    return dispatch(args, backend, workspace, workspace_bytes, stream);
  });
}
}  // namespace api

Status check_device_faults(void* stream) {
  return guarded(Backend::kCuda, "check_device_faults", [&]() -> Status { return sm90::check_device_faults(stream); });
}

bool cuda_backend_available(std::string* why) {
  try {
    if (!sm90::compiled_in()) {
      // The stub's device_supported() says "not built" in its own words.
      std::string msg;
      sm90::device_supported(&msg);
      if (why) *why = msg.empty() ? "backend kCuda: not compiled into this build" : msg;
      return false;
    }
    std::string msg;
    const bool ok = sm90::device_supported(&msg);
    if (why) *why = ok ? std::string() : msg;
    return ok;
  } catch (const std::exception& e) {
    if (why) *why = std::string("backend kCuda: ") + e.what();
    return false;
  } catch (...) {
    if (why) *why = "backend kCuda: unknown exception while probing the device";
    return false;
  }
}

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::kNone: return "kNone";
    case DType::kBF16: return "kBF16";
    case DType::kFP32: return "kFP32";
  }
  return "unknown DType";
}

const char* to_string(Backend backend) {
  switch (backend) {
    case Backend::kCpuReference: return "kCpuReference";
    case Backend::kCpuChunked: return "kCpuChunked";
    case Backend::kCuda: return "kCuda";
  }
  return "unknown Backend";
}

const char* to_string(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "kOk";
    case StatusCode::kInvalidArgument: return "kInvalidArgument";
    case StatusCode::kNotSupported: return "kNotSupported";
    case StatusCode::kCudaError: return "kCudaError";
    case StatusCode::kInternal: return "kInternal";
  }
  return "unknown StatusCode";
}

const char* to_string(GateForm form) {
  switch (form) {
    case GateForm::kSafeGate: return "kSafeGate";
    case GateForm::kLogDecay: return "kLogDecay";
  }
  return "unknown GateForm";
}

}  // namespace flashkda
