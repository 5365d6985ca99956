#pragma once
// The deferred (Partial) leaf gradients of a backward (dtensor_autograd.cpp), as other DTensor
// ops that shape their reduction see them.

namespace tessera::detail {

/// Called by the backward of a foreach_all_gather call (`group` identifies the call): the
/// gradients deferred before it are complete (the previous FSDP unit's), so the buckets in flight
/// land and those waiting are issued. Does nothing under NoSync, outside a backward, or for the
/// call's later nodes.
void gradients_of_group_arriving(const void* group);

}  // namespace tessera::detail
