#include "rules/kernel_plan.h"

namespace shardtensor {

std::vector<MoveStep> halo_gathers(const HaloPlan& plan) {
  std::vector<MoveStep> moves;
  for (const HaloAxis& axis : plan.axes)
    if (axis.mesh_dim >= 0 && axis.crosses_shards()) moves.push_back(HaloGatherStep{axis.mesh_dim, axis.tensor_dim});
  return moves;
}

// The adjoint runs the axes in reverse (domain/kernel_moves.h: scatter_add_windows).
std::vector<MoveStep> halo_scatter_adds(const HaloPlan& plan) {
  std::vector<MoveStep> moves;
  for (auto axis = plan.axes.rbegin(); axis != plan.axes.rend(); ++axis)
    if (axis->mesh_dim >= 0 && axis->crosses_shards()) moves.push_back(HaloScatterAddStep{axis->mesh_dim, axis->tensor_dim});
  return moves;
}

std::vector<MoveStep> all_reduces_over(const DeviceMesh& mesh, const std::vector<int64_t>& mesh_dims, ReduceOp reduce) {
  std::vector<MoveStep> moves;
  for (int64_t d : mesh_dims)
    if (mesh.size(d) > 1) moves.push_back(AllReduceStep{d, reduce});
  return moves;
}

}  // namespace shardtensor
