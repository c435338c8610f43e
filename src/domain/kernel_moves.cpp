// See kernel_moves.h. The moves themselves are LoweredStep's (redistribute/executor*.cpp).
#include "domain/kernel_moves.h"

#include <ATen/core/Tensor.h>

#include <algorithm>

#include "redistribute/executor.h"

namespace shardtensor {
namespace {

template <class Step>
bool on_axis(const MoveStep& move, const HaloAxis& axis) {
  const auto* step = std::get_if<Step>(&move);
  return step && step->mesh_dim == axis.mesh_dim && step->tensor_dim == axis.tensor_dim;
}

// A halo step (either direction) on `axis`.
bool move_lies_on(const MoveStep& move, const HaloAxis& axis) {
  return on_axis<HaloGatherStep>(move, axis) || on_axis<HaloScatterAddStep>(move, axis);
}

}  // namespace

KernelMoves::KernelMoves(const std::vector<MoveStep>& declared, const MoveLowering& how) : mesh_(how.mesh) {
  TORCH_INTERNAL_ASSERT(declared.empty() || mesh_, "a plan declares moves (", to_string(declared.front()),
                        ") but no mesh to run them on (KernelPlan::move_lowering)");
  for (const HaloAxis& axis : how.halo) {
    const auto lowered = std::make_shared<const LoweredHaloAxis>(axis, *mesh_);
    MoveStep gather = HaloGatherStep{axis.mesh_dim, axis.tensor_dim};
    MoveStep scatter_add = HaloScatterAddStep{axis.mesh_dim, axis.tensor_dim};
    bool gather_declared = false, scatter_add_declared = false;
    for (const MoveStep& move : declared) {
      if (on_axis<HaloGatherStep>(move, axis)) {
        gather = move;  // as declared (skipped_where_kept included)
        gather_declared = true;
      }
      scatter_add_declared = scatter_add_declared || on_axis<HaloScatterAddStep>(move, axis);
    }
    // Which axes exchange is computed twice, by the rule that declares them and by the lowering
    // here; the two must agree, or explain would print other moves than run.
    TORCH_INTERNAL_ASSERT(!(gather_declared || scatter_add_declared) || lowered->exchanges || !mesh_->includes_this_rank(),
                          "a plan declares ", to_string(gather), " but its windows cross no shard");
    halo_.push_back({LoweredStep(gather, lowered, how.halo_fill), LoweredStep(scatter_add, lowered), gather_declared,
                     scatter_add_declared});
  }
  for (const MoveStep& move : declared) {
    if (const auto* reduction = std::get_if<AllReduceStep>(&move)) {
      steps_.emplace_back(*reduction);
    } else if (const auto* gather = std::get_if<StatisticsGatherStep>(&move)) {
      steps_.emplace_back(*gather);
    } else if (const auto* ring = std::get_if<RingStep>(&move)) {
      // A rank outside the mesh runs no kernel (dispatch/kernel.cpp) and has no place in a ring.
      if (!mesh_->includes_this_rank()) continue;
      TORCH_INTERNAL_ASSERT(how.ring_batches, "a plan declares ", to_string(move), " but gives no batches to lower it with");
      steps_.emplace_back(*ring, how.ring_batches(ring->phase), how.widest_ring_rows);
    } else if (is_halo_step(move)) {
      const bool gathers = std::holds_alternative<HaloGatherStep>(move);
      const auto axis = std::find_if(halo_.begin(), halo_.end(),
                                     [&](const HaloAxisSteps& a) { return move_lies_on(move, a.gather.halo().axis); });
      TORCH_INTERNAL_ASSERT(axis != halo_.end(), "a plan declares ", to_string(move), " on no axis of its halo");
      steps_.push_back(gathers ? axis->gather : axis->scatter_add);
    } else {
      TORCH_INTERNAL_ASSERT(false, to_string(move), " is a redistribute step, not a kernel's move");
    }
  }
  TORCH_INTERNAL_ASSERT(std::count_if(steps_.begin(), steps_.end(), [](const LoweredStep& s) {
                          return std::holds_alternative<StatisticsGatherStep>(s.step());
                        }) <= 1,
                        "a plan declares two statistics gathers; a kernel runs one");
}

const DeviceMesh& KernelMoves::mesh() const {
  TORCH_INTERNAL_ASSERT(mesh_, "a kernel's moves without a mesh");
  return *mesh_;
}

void KernelMoves::all_reduce(const at::Tensor& tensor) const {
  for (const LoweredStep& step : steps_)
    if (std::holds_alternative<AllReduceStep>(step.step())) reduce_in_place(step, *mesh_, tensor);
}

bool KernelMoves::reduces() const {
  return std::any_of(steps_.begin(), steps_.end(), [](const LoweredStep& s) { return std::holds_alternative<AllReduceStep>(s.step()); });
}

at::Tensor KernelMoves::gather_statistics(const at::Tensor& mine) const {
  for (const LoweredStep& step : steps_)
    if (std::holds_alternative<StatisticsGatherStep>(step.step())) return run_kernel_step(step, *mesh_, mine);
  return mine.unsqueeze(0);
}

at::Tensor KernelMoves::gather_window(size_t axis, const at::Tensor& owned_piece) const {
  const HaloAxisSteps& a = halo_.at(axis);
  TORCH_INTERNAL_ASSERT(a.gather_declared || !a.gather.halo().exchanges, "a kernel gathers a halo window by ",
                        to_string(a.gather.step()), ", which its plan does not declare");
  return run_kernel_step(a.gather, *mesh_, owned_piece);
}

at::Tensor KernelMoves::scatter_add_window(size_t axis, const at::Tensor& window_piece) const {
  const HaloAxisSteps& a = halo_.at(axis);
  TORCH_INTERNAL_ASSERT(a.scatter_add_declared || !a.scatter_add.halo().exchanges, "a kernel scatters a halo window back by ",
                        to_string(a.scatter_add.step()), ", which its plan does not declare");
  return run_kernel_step(a.scatter_add, *mesh_, window_piece);
}

at::Tensor KernelMoves::gather_windows(at::Tensor owned) const {
  for (size_t axis = 0; axis < halo_.size(); ++axis) owned = gather_window(axis, owned);
  return owned;
}

at::Tensor KernelMoves::scatter_add_windows(at::Tensor window) const {
  for (size_t axis = halo_.size(); axis-- > 0;) window = scatter_add_window(axis, window);
  return window;
}

const LoweredStep* KernelMoves::ring_step(RingPhase phase) const {
  for (const LoweredStep& s : steps_)
    if (const auto* ring = std::get_if<RingStep>(&s.step()); ring && ring->phase == phase) return &s;
  return nullptr;
}

const RingBatch& KernelMoves::ring_batch(RingPhase phase, int64_t batch) const {
  const LoweredStep* step = ring_step(phase);
  TORCH_INTERNAL_ASSERT(step, "the plan declared no ring step of phase ", counted_as(phase));
  return step->ring_batch(batch);
}

std::vector<std::vector<at::Tensor>> KernelMoves::run_ring(RingPhase phase, int64_t batch, const std::vector<std::vector<at::Tensor>>& sent,
                                                           const std::vector<at::Tensor>& like,
                                                           const std::function<void()>& while_moving) const {
  const LoweredStep* step = ring_step(phase);
  TORCH_INTERNAL_ASSERT(step, "the plan declared no ring step of phase ", counted_as(phase));
  return run_ring_batch(*step, batch, sent, like, *mesh_, while_moving);
}

KernelMoves lower_moves(const KernelPlan& plan) { return KernelMoves(plan.moves(), plan.move_lowering()); }

}  // namespace shardtensor
