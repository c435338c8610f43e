// LoweredStep's lowering: the boxes and parts of a step, from its two layouts (a ring step's
// batches come lowered from its kernel). Pure; apply() is in executor.cpp.
#include "redistribute/lowered_step.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>

#include "spec/sequence_order.h"  // has_zigzag

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

// Every part `holder` sends `receiver` in an exchange from `from` to `to`, where either splits
// a dim in zigzag order. A part's coordinates are its own: each side's piece is placed so that
// the part lands at its local offsets there (parts_between in the same spirit as the halo's),
// shifted by the global shape so that no offset is negative.
std::vector<PeerPart> stretch_parts(const ShardTensorSpec& from, const ShardTensorSpec& to, const std::vector<int64_t>& holder,
                                    const std::vector<int64_t>& receiver, int64_t holder_rank, int64_t receiver_rank) {
  std::vector<PeerPart> parts;
  if (!feeds(from, holder, receiver)) return parts;
  const std::vector<int64_t> held_shape = from.local_shape(holder), wanted_shape = to.local_shape(receiver);
  for (const Stretch& a : stretches_of(from, holder))
    for (const Stretch& b : stretches_of(to, receiver)) {
      Box part = intersect(a.global, b.global);
      if (part.numel() == 0) continue;
      Box holds{a.global.offsets, held_shape}, wants{b.global.offsets, wanted_shape};
      for (int64_t d = 0; d < from.ndim(); ++d) {
        const int64_t shift = from.shape()[d];
        part.offsets[d] += shift;
        holds.offsets[d] += shift - a.local_start[d];
        wants.offsets[d] += shift - b.local_start[d];
      }
      parts.push_back({holder_rank, receiver_rank, part, holds, wants});
    }
  return parts;
}

int64_t halo_tensor_dim(const MoveStep& step) {
  if (const auto* gather = std::get_if<HaloGatherStep>(&step)) return gather->tensor_dim;
  return std::get<HaloScatterAddStep>(step).tensor_dim;
}

}  // namespace

LoweredStep::LoweredStep(MoveStep step, const ShardTensorSpec& from, const ShardTensorSpec& to)
    : step_(std::move(step)) {
  TORCH_INTERNAL_ASSERT(is_redistribute_step(step_), to_string(step_), " is a kernel's move, not a redistribute step");
  const DeviceMesh& mesh = from.mesh();
  if (!mesh.includes_this_rank()) return;
  const std::vector<int64_t>& me = mesh.coordinate();
  if (has_zigzag(from) || has_zigzag(to)) {
    TORCH_INTERNAL_ASSERT(std::holds_alternative<ExchangeStep>(step_), to_string(step_), " from ", from, " to ", to,
                          ": between zigzag orders only an Exchange moves (planner.cpp)");
    held_ = Box{std::vector<int64_t>(from.ndim(), 0), from.local_shape(me)};
    wanted_ = Box{std::vector<int64_t>(to.ndim(), 0), to.local_shape(me)};
    own_ = Box::none();
    const std::vector<std::vector<int64_t>> members = members_along(mesh, -1);
    const int64_t self = std::find(members.begin(), members.end(), me) - members.begin();
    kept_ = stretch_parts(from, to, me, me, self, self);
    for (size_t p = 0; p < members.size(); ++p) {
      if (static_cast<int64_t>(p) == self) continue;
      for (PeerPart& part : stretch_parts(from, to, members[p], me, static_cast<int64_t>(p), self)) parts_.push_back(std::move(part));
      for (PeerPart& part : stretch_parts(from, to, me, members[p], self, static_cast<int64_t>(p))) parts_.push_back(std::move(part));
    }
    return;
  }
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

LoweredStep::LoweredStep(MoveStep step, std::shared_ptr<const LoweredHaloAxis> axis, double fill)
    : step_(std::move(step)), halo_(std::move(axis)), fill_(fill) {
  TORCH_INTERNAL_ASSERT(is_halo_step(step_) && halo_, to_string(step_), " is not a halo step with its axis");
  TORCH_INTERNAL_ASSERT(halo_tensor_dim(step_) == halo_->axis.tensor_dim && mesh_dim_of(step_) == halo_->axis.mesh_dim,
                        to_string(step_), " is not a step along the halo axis of tensor dim ", halo_->axis.tensor_dim,
                        " over mesh dim ", halo_->axis.mesh_dim);
}

LoweredStep::LoweredStep(StatisticsGatherStep step) : step_(step) {}

LoweredStep::LoweredStep(RingStep step, std::vector<RingBatch> batches, int64_t widest_rows)
    : step_(step), ring_batches_(std::move(batches)), widest_rows_(widest_rows) {
  TORCH_INTERNAL_ASSERT(static_cast<int64_t>(ring_batches_.size()) == step.batches, to_string(step_), " was lowered with ",
                        ring_batches_.size(), " batches");
}

const RingBatch& LoweredStep::ring_batch(int64_t batch) const {
  TORCH_INTERNAL_ASSERT(std::holds_alternative<RingStep>(step_) && batch >= 0 && batch < static_cast<int64_t>(ring_batches_.size()),
                        to_string(step_), " has no batch ", batch);
  return ring_batches_[batch];
}

const LoweredHaloAxis& LoweredStep::halo() const {
  TORCH_INTERNAL_ASSERT(halo_, to_string(step_), " is not a halo step");
  return *halo_;
}

}  // namespace shardtensor
