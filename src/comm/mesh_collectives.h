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

}  // namespace shardtensor
