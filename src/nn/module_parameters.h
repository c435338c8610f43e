// What distribute_module and the parallel styles do to a module's parameters.
#pragma once

#include <ATen/core/Tensor.h>

#include "shardtensor/device_mesh.h"
#include "shardtensor/placement.h"

namespace torch::nn {
class Module;
}

namespace shardtensor::nn_detail {

// Rank 0's values copied into every plain parameter and buffer of `module` itself (not its
// children), in place: they stay plain tensors, which count as Replicate beside ShardTensors.
void replicate_plain_parameters(torch::nn::Module& module, const DeviceMesh& mesh);

// `param`'s values laid out by `placement` (torch.chunk sizes) from rank 0's copy, or moved
// there when `param` is a ShardTensor already; detached, to be registered as a parameter.
at::Tensor sharded_parameter(const at::Tensor& param, const DeviceMesh& mesh, const Placement& placement);

}  // namespace shardtensor::nn_detail
