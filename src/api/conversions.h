// Internal pieces of the differentiable conversions, shared by from_local.cpp and
// redistribute.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include "shardtensor/spec.h"

namespace shardtensor {

// Differentiable move of a ShardTensor to `target` (same mesh, shape and dtype).
at::Tensor move_to(const at::Tensor& t, const ShardTensorSpec& target);

// The layout of the gradient of a tensor laid out as `spec`: Partial becomes Replicate (the
// gradient of a pending reduction reaches every term whole), everything else stays.
ShardTensorSpec gradient_layout(const ShardTensorSpec& spec);

// Raises, naming `api`, unless `t` is on the device of this rank's pieces of `mesh`
// (DeviceMesh::device(): cpu, or cuda:LOCAL_RANK on a cuda mesh).
void check_on_mesh_device(const char* api, const at::Tensor& t, const DeviceMesh& mesh);

}  // namespace shardtensor
