// See declared_reductions.h.
#include "domain/declared_reductions.h"

#include <ATen/core/Tensor.h>

#include "redistribute/executor.h"

namespace shardtensor {

DeclaredReductions::DeclaredReductions(DeviceMesh mesh, const std::vector<DeclaredMove>& declared) : mesh_(std::move(mesh)) {
  for (const DeclaredMove& move : declared)
    if (move.kind == DeclaredMove::Kind::AllReduce) steps_.emplace_back(move.mesh_dim, move.reduce);
}

void DeclaredReductions::run(const at::Tensor& tensor) const {
  for (const auto& [mesh_dim, op] : steps_) all_reduce_over(mesh_, {mesh_dim}, tensor, op);
}

}  // namespace shardtensor
