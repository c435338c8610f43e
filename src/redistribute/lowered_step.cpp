// LoweredStep's lowering: the boxes and parts of a step, from its two layouts. Pure; apply() is
// in executor.cpp.
#include "redistribute/lowered_step.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>

namespace shardtensor {
namespace {

// The part of `from`'s data that `member` sends to `receiver` in an exchange to `to`.
Box part_for(const ShardTensorSpec& from, const ShardTensorSpec& to, const std::vector<int64_t>& member,
             const std::vector<int64_t>& receiver) {
  return feeds(from, member, receiver) ? intersect(box_of(from, member), box_of(to, receiver)) : Box::none();
}

// A pending p-norm on `mesh_dim` of `spec` reduces as a sum of the terms' p-th powers, whose
// root is taken after: the p of that Partial(norm), or nullopt for any other placement.
std::optional<double> pending_norm(const ShardTensorSpec& spec, int64_t mesh_dim) {
  const Placement& p = spec.placements()[mesh_dim];
  if (!p.is_partial() || p.reduce_op != ReduceOp::Norm) return std::nullopt;
  return p.norm_order;
}

}  // namespace

LoweredStep::LoweredStep(MoveStep step, const ShardTensorSpec& from, const ShardTensorSpec& to)
    : step_(std::move(step)) {
  TORCH_INTERNAL_ASSERT(is_redistribute_step(step_), to_string(step_), " is a kernel's move, not a redistribute step");
  const DeviceMesh& mesh = from.mesh();
  if (!mesh.includes_this_rank()) return;
  const std::vector<int64_t>& me = mesh.coordinate();
  held_ = box_of(from, me);
  wanted_ = box_of(to, me);
  const int64_t mesh_dim = mesh_dim_of(step_);
  if (std::holds_alternative<AllReduceStep>(step_) || std::holds_alternative<ReduceScatterStep>(step_))
    norm_ = pending_norm(from, mesh_dim);
  if (std::holds_alternative<ReduceScatterStep>(step_)) {
    for (const std::vector<int64_t>& member : members_along(mesh, mesh_dim)) targets_.push_back(box_of(to, member));
  } else if (std::holds_alternative<AllGatherStep>(step_) || std::holds_alternative<AllToAllStep>(step_) ||
             std::holds_alternative<ExchangeStep>(step_)) {
    const std::vector<std::vector<int64_t>> members = members_along(mesh, mesh_dim);  // -1: the whole mesh
    own_ = part_for(from, to, me, me);
    const int64_t self = std::find(members.begin(), members.end(), me) - members.begin();  // in group ranks
    for (size_t p = 0; p < members.size(); ++p) {
      const std::vector<int64_t>& peer = members[p];
      if (peer == me) continue;
      const int64_t other = static_cast<int64_t>(p);
      parts_.push_back({other, self, part_for(from, to, peer, me), box_of(from, peer), wanted_});
      parts_.push_back({self, other, part_for(from, to, me, peer), held_, box_of(to, peer)});
    }
  }
}

LoweredStep::LoweredStep(AllReduceStep step) : step_(step) {}

}  // namespace shardtensor
