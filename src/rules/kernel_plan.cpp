#include "rules/kernel_plan.h"

namespace shardtensor {

namespace {
std::string what_moves(const DeclaredMove& m) {
  using Kind = DeclaredMove::Kind;
  const int64_t tensor_dim = m.tensor_dim, mesh_dim = m.mesh_dim;
  switch (m.kind) {
    case Kind::HaloGather:
      return "halo gather of dim " + std::to_string(tensor_dim) + " over mesh dim " + std::to_string(mesh_dim);
    case Kind::HaloScatterAdd:
      return "halo scatter-add of dim " + std::to_string(tensor_dim) + " over mesh dim " + std::to_string(mesh_dim);
    case Kind::AllReduce:
      return std::string("all-reduce(") + shardtensor::to_string(m.reduce) + ") over mesh dim " + std::to_string(mesh_dim);
    case Kind::AllGather:
      return "all-gather of per-row statistics over mesh dim " + std::to_string(mesh_dim);
    case Kind::RingPass:
      return "ring pass of dim " + std::to_string(tensor_dim) + " blocks over mesh dim " + std::to_string(mesh_dim);
    case Kind::RingGradientPass:
      return "gradients of dim " + std::to_string(tensor_dim) + " blocks passed behind them over mesh dim " + std::to_string(mesh_dim);
    case Kind::RingReturn:
      return "gradients of dim " + std::to_string(tensor_dim) + " blocks returned to their owners over mesh dim " +
             std::to_string(mesh_dim);
  }
  return "?";
}
}  // namespace

std::string DeclaredMove::to_string() const {
  return what_moves(*this) + (batches == 1 ? "" : ", " + std::to_string(batches) + " batches") +
         (skipped_where_kept ? " (none where the forward kept the rows it received)" : "");
}

const char* DeclaredMove::counted_as_of(Kind kind) {
  switch (kind) {
    case Kind::HaloGather:
    case Kind::HaloScatterAdd: return "all_to_all";
    case Kind::AllReduce: return "all_reduce";
    case Kind::AllGather: return "all_gather";
    case Kind::RingPass: return "ring_send_recv";
    case Kind::RingGradientPass: return "ring_gradients";
    case Kind::RingReturn: return "ring_return";
  }
  return "?";
}

namespace {
std::vector<DeclaredMove> halo_moves(const HaloPlan& plan, DeclaredMove::Kind kind) {
  std::vector<DeclaredMove> moves;
  for (const HaloAxis& axis : plan.axes)
    if (axis.mesh_dim >= 0 && axis.crosses_shards()) moves.push_back({kind, axis.mesh_dim, axis.tensor_dim});
  return moves;
}
}  // namespace

std::vector<DeclaredMove> halo_gathers(const HaloPlan& plan) { return halo_moves(plan, DeclaredMove::Kind::HaloGather); }

std::vector<DeclaredMove> halo_scatter_adds(const HaloPlan& plan) {
  std::vector<DeclaredMove> moves = halo_moves(plan, DeclaredMove::Kind::HaloScatterAdd);
  return {moves.rbegin(), moves.rend()};
}

std::vector<DeclaredMove> all_reduces_over(const DeviceMesh& mesh, const std::vector<int64_t>& mesh_dims, ReduceOp reduce) {
  std::vector<DeclaredMove> moves;
  for (int64_t d : mesh_dims)
    if (mesh.size(d) > 1) moves.push_back({DeclaredMove::Kind::AllReduce, d, -1, reduce});
  return moves;
}

}  // namespace shardtensor
