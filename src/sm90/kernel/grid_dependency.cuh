// Programmatic dependent launch (PDL): a grid launched with the attribute
// cudaLaunchAttributeProgrammaticStreamSerialization may start while the grid
// before it in the stream still runs, once every CTA of that grid has called
// allow_dependent_grids() or exited. wait_for_prior_grids() returns once the
// grid before has completed and its writes are visible; without the attribute
// both return at once. Where the two grids share data before that, they need
// their own release and acquire (SegmentState::composed).
#pragma once

namespace flashkda::sm90 {

__device__ __forceinline__ void wait_for_prior_grids() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void allow_dependent_grids() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

}  // namespace flashkda::sm90
