// What distribute_module and the parallel styles do to a module's parameters.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

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

// Puts `value` in the slot of `module`'s parameter `name` and in the member torch::nn's own
// module reads it through in forward, leaving requires_grad alone (fully_shard's swaps of a
// gathered, non-leaf parameter). Raises when the module has no such parameter, or when it is not
// one of torch::nn's modules whose member is known (a module of yours would keep reading its own).
void set_parameter_slot(torch::nn::Module& module, const std::string& name, const at::Tensor& value);
bool has_known_member(torch::nn::Module& module, const std::string& name);

// The submodules a dotted path of globs names in `root` ("" names the root), each with its
// parent (nullptr for the root); `misses` says where a part matched nothing.
struct ResolvedPath {
  std::vector<std::pair<torch::nn::Module*, std::shared_ptr<torch::nn::Module>>> modules;
  std::vector<std::string> misses;
};
ResolvedPath resolve_path(torch::nn::Module& root, const std::string& path);

}  // namespace shardtensor::nn_detail
