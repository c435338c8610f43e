// local_map: a user function on local pieces, with declared input and output placements.
#include <ATen/core/Tensor.h>

#include "shardtensor/dispatch.h"
#include "shardtensor/redistribute.h"
#include "shardtensor/shard_tensor.h"

namespace shardtensor {

std::vector<at::Tensor> local_map(const LocalFunction& fn, const std::vector<at::Tensor>& inputs,
                                  const std::vector<std::optional<Placements>>& in_placements,
                                  const std::vector<Placements>& out_placements) {
  TORCH_CHECK_VALUE(in_placements.empty() || in_placements.size() == inputs.size(), "local_map: ", in_placements.size(),
              " input placements given for ", inputs.size(), " inputs; give one entry per input (std::nullopt: as is) or none.");
  const DeviceMesh* mesh = nullptr;
  std::vector<at::Tensor> locals;
  for (size_t i = 0; i < inputs.size(); ++i) {
    at::Tensor t = inputs[i];
    if (!is_shard_tensor(t)) {
      TORCH_CHECK_VALUE(in_placements.empty() || !in_placements[i], "local_map: input ", i,
                  " is a plain tensor but placements were declared for it; pass a ShardTensor or std::nullopt.");
      locals.push_back(t);
      continue;
    }
    if (!mesh) mesh = &spec(inputs[i]).mesh();
    TORCH_CHECK_VALUE(spec(t).mesh() == *mesh, "local_map: inputs are on different meshes (", *mesh, " vs ", spec(t).mesh(), ").");
    if (!in_placements.empty() && in_placements[i]) t = redistribute(t, *in_placements[i]);
    locals.push_back(to_local(t, spec(t).placements()));
  }
  TORCH_CHECK_VALUE(mesh, "local_map: no input is a ShardTensor, so there is no mesh to place the outputs on.");
  std::vector<at::Tensor> outs = fn(locals);
  TORCH_CHECK_VALUE(outs.size() == out_placements.size(), "local_map: the function returned ", outs.size(), " tensors but ",
              out_placements.size(), " output placements were declared.");
  std::vector<at::Tensor> wrapped;
  for (size_t j = 0; j < outs.size(); ++j)
    wrapped.push_back(from_local(outs[j], *mesh, out_placements[j], ShardSizing::infer()));
  return wrapped;
}

}  // namespace shardtensor
