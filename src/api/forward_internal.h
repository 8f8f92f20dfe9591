// Entry points for code built with this library (the Python binding), not part
// of the public API.
#pragma once
#include <cstddef>

#include "flashkda/flashkda.h"

namespace flashkda::api {

// flashkda::forward without its validate(args, backend): for a caller that has
// just had flashkda::workspace_size(args, backend, ...) return Ok for the same
// args and backend, on this thread with the same current device.
// workspace_size validates exactly as forward does, and the second pass cost
// every small call its checks again, device queries included. Everything after
// validation is as in forward (the workspace checks, the dispatch, no exception
// crossing).
Status forward_prevalidated(const ForwardArgs& args, Backend backend, void* workspace, size_t workspace_bytes,
                            void* stream);

// validate(args, backend) without its check of outputs sharing memory with other
// arguments: for segment_summaries, which checks its token inputs through a
// ForwardArgs whose out is a stand-in (it writes no out).
Status validate_without_overlaps(const ForwardArgs& args, Backend backend);

}  // namespace flashkda::api
