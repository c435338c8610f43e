// Internal pieces of the differentiable conversions, shared by from_local.cpp and
// redistribute.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include "dispatch/relayout.h"  // move_to, gradient_layout
#include "shardtensor/spec.h"

namespace shardtensor {

// Raises, naming `api`, unless `t` is on the device of this rank's pieces of `mesh`
// (DeviceMesh::device(): cpu, or cuda:LOCAL_RANK on a cuda mesh).
void check_on_mesh_device(const char* api, const at::Tensor& t, const DeviceMesh& mesh);

// A ShardTensor made from a plain piece (from_local, distribute_tensor, the factories): the
// ways a process gets its first one, so the kernel is registered with the dispatcher here
// (dispatch/library.h: once, idempotent) before an op can reach it. The dispatch layer makes
// the rest with make_shard_tensor, from ShardTensors that exist already.
at::Tensor new_shard_tensor(at::Tensor local, ShardTensorSpec spec);

}  // namespace shardtensor
