// A kernel's moves between ranks, lowered for this rank into one value.
//
// A kernel plan declares every move its kernel makes (rules/kernel_plan.h: moves(), in the
// vocabulary of redistribute plans): the mid-op all-reduces of norms, losses, global
// comparisons and the random draws' checks; the halo gathers of spatial ops and their adjoint
// scatter-adds; attention's gather of per-row statistics and its ring's passes. Dispatch lowers
// them once, when it caches the propagation that declared them: each declared step becomes a
// LoweredStep (redistribute/lowered_step.h: who sends which part to whom, computed once), and
// the plan's lower() receives them as this one value. The kernel runs its moves through it
// and through nothing else (tests/unit/include_graph_test.cpp), so it cannot move bytes over a
// group its plan did not declare, and explain_operator prints exactly these steps. The
// transport of each step is the executor's choice at each call (redistribute/transport.h,
// under the options then in force, from the bytes the call moves); the kernel chooses nothing.
//
// Halo exchange, the data movement of domain parallelism: a spatial op computes the outputs a
// rank owns from a *window* of its input that reaches past its shard. Along one tensor dim
// split over one mesh dim's group, every rank knows the range each group rank owns and the
// window it needs (spec/halo_geometry.h), so each sends exactly the intersections others need:
// no padding to the largest shard, any shard size (a window may span several neighbours), and
// no exchange where no window crosses a boundary (such an axis is not a declared step; it only
// assembles the window locally). The adjoint, a scatter-add, sends window pieces back to their
// owners and adds them: the backward of a gather, and the forward of a transposed convolution.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "redistribute/lowered_step.h"
#include "rules/kernel_plan.h"
#include "shardtensor/device_mesh.h"

namespace at {
class Tensor;
}

namespace shardtensor {

class KernelMoves {
 public:
  KernelMoves() = default;  // a kernel that moves nothing
  // `declared` (a plan's moves()) lowered for this rank with `how` (its move_lowering()).
  KernelMoves(const std::vector<MoveStep>& declared, const MoveLowering& how);

  // The declared steps, lowered, in the declared order: what explain_operator prints.
  const std::vector<LoweredStep>& steps() const { return steps_; }
  bool empty() const { return steps_.empty(); }

  // Mid-op reductions: `tensor` reduced in place over each declared AllReduceStep's group in
  // turn, with its op. Every member of each group calls it with a tensor of the same shape.
  void all_reduce(const at::Tensor& tensor) const;
  bool reduces() const;

  // The statistics gather: every member's `mine` (one shape on all of them), stacked along a
  // new dim 0 in group rank order; `mine` alone (a stack of one) where none is declared.
  at::Tensor gather_statistics(const at::Tensor& mine) const;

  // Halo axes, in the order of the lowering's halo.
  size_t halo_axes() const { return halo_.size(); }
  const LoweredHaloAxis& halo_axis(size_t axis) const { return halo_.at(axis).gather.halo(); }
  // This rank's window of `owned_piece` along `axis` (positions outside the field hold the
  // lowering's fill, or wrap around on a periodic axis); every member of the axis's group calls it.
  at::Tensor gather_window(size_t axis, const at::Tensor& owned_piece) const;
  // The adjoint: every position of `window_piece` (this rank's window along `axis`) added on the
  // rank that owns it (positions outside the field dropped, or wrapped around); this rank's piece.
  at::Tensor scatter_add_window(size_t axis, const at::Tensor& window_piece) const;
  // Every axis in turn, and the adjoint over every axis in reverse.
  at::Tensor gather_windows(at::Tensor owned) const;
  at::Tensor scatter_add_windows(at::Tensor window) const;

  // Ring steps: whether one of `phase` is declared, its batch `batch` as this rank runs it, and
  // running it (redistribute/executor.h: run_ring_batch; `sent`, `like` and `while_moving`
  // are its).
  bool declares_ring(RingPhase phase) const { return ring_step(phase) != nullptr; }
  const RingBatch& ring_batch(RingPhase phase, int64_t batch) const;
  std::vector<std::vector<at::Tensor>> run_ring(RingPhase phase, int64_t batch, const std::vector<std::vector<at::Tensor>>& sent,
                                                const std::vector<at::Tensor>& like, const std::function<void()>& while_moving = {}) const;

  const DeviceMesh& mesh() const;

 private:
  // One halo axis: its gather and scatter-add, sharing the axis's lowering. Where the axis
  // exchanges, each runs only if the plan declared it.
  struct HaloAxisSteps {
    LoweredStep gather, scatter_add;
    bool gather_declared = false, scatter_add_declared = false;
  };
  const LoweredStep* ring_step(RingPhase phase) const;

  std::optional<DeviceMesh> mesh_;
  std::vector<LoweredStep> steps_;
  std::vector<HaloAxisSteps> halo_;
};

// A plan's declared moves, lowered: KernelMoves(plan.moves(), plan.move_lowering()).
KernelMoves lower_moves(const KernelPlan& plan);

}  // namespace shardtensor
