// Collectives over a whole mesh, built from the per-mesh-dim groups (a mesh keeps no
// world-wide group of its own).
#pragma once

#include <vector>

#include "shardtensor/device_mesh.h"
#include "shardtensor/placement.h"

namespace at {
class Tensor;
}

namespace shardtensor {

// Every rank of the mesh gives `input` of one shape; returns [mesh.size(), *input.shape] with
// the contributions in row-major mesh-coordinate order, the same on every rank. Gathers along
// the last mesh dim first, then each earlier one, so every byte crosses each dim once.
at::Tensor all_gather_over_mesh(const DeviceMesh& mesh, const at::Tensor& input);

// In place: `tensor` reduced over the groups of `mesh_dims`, one all-reduce per mesh dim. The
// ranks of each group hold the same shape, so an empty tensor is empty across its group and
// is skipped there without a collective.
void all_reduce_over(const DeviceMesh& mesh, const std::vector<int64_t>& mesh_dims, const at::Tensor& tensor, ReduceOp op);

}  // namespace shardtensor
