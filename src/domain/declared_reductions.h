// A kernel's mid-op reductions, gathers and ring passes, as its plan declared them.
//
// Norms, the losses' global means, global comparisons and the random draws' checks reduce a
// small tensor over the groups of some mesh dims in the middle of their op; attention over
// split keys gathers its per-row statistics; ring attention passes blocks round its ring. The
// plan declares each of those all-reduces, gathers and ring steps (rules/kernel_plan.h:
// AllReduceStep, StatisticsGatherStep and RingStep, in the vocabulary of redistribute plans),
// and explain prints them; the kernel runs exactly those, through this, lowered with the plan:
// it cannot move bytes over a group its plan did not declare, and what it runs is what explain
// printed
// (tests/dist/explained_moves_test.cpp counts both). Kernels reach the executor through nothing
// else (tests/unit/include_graph_test.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "redistribute/lowered_step.h"
#include "rules/kernel_plan.h"
#include "shardtensor/device_mesh.h"

namespace at {
class Tensor;
}

namespace shardtensor {

class DeclaredReductions {
 public:
  // The AllReduceSteps of `declared` (a plan's moves()), on `mesh`.
  DeclaredReductions(DeviceMesh mesh, const std::vector<MoveStep>& declared);

  // Reduces `tensor` in place over each declared group in turn, with each step's op, by the
  // transport the options in force choose (redistribute/transport.h: reduction_transport).
  // Every member of each group must call it, with a tensor of the same shape.
  void run(const at::Tensor& tensor) const;
  // Whether the plan declared none (a layout whose reduced dims are not split).
  bool empty() const { return steps_.empty(); }

 private:
  DeviceMesh mesh_;
  std::vector<LoweredStep> steps_;  // the AllReduceSteps, in the declared order
};

class DeclaredGather {
 public:
  // The one StatisticsGatherStep of `declared` (a plan's moves()), on `mesh`, if it declares one.
  DeclaredGather(DeviceMesh mesh, const std::vector<MoveStep>& declared);

  // Every member's `mine` (one shape on all of them), stacked along a new dim 0 in group rank
  // order, over the declared group; `mine` alone (as a stack of one) where none was declared.
  // Every member of the group must call it.
  at::Tensor run(const at::Tensor& mine) const;

 private:
  DeviceMesh mesh_;
  std::optional<LoweredStep> step_;  // the StatisticsGatherStep, if the plan declared one
};

class DeclaredRing {
 public:
  // The RingSteps of `declared` (a plan's moves()), on `mesh`, each lowered with the batches
  // `batches_of` gives for its phase, as this rank runs them; `widest_rows` is the longest
  // block's length (the same on every member).
  DeclaredRing(DeviceMesh mesh, const std::vector<MoveStep>& declared, int64_t widest_rows,
               const std::function<std::vector<RingBatch>(RingPhase)>& batches_of);

  // Whether the plan declared a ring step of `phase`.
  bool declares(RingPhase phase) const;
  // Batch `batch` of the declared step of `phase`, as this rank runs it.
  const RingBatch& batch(RingPhase phase, int64_t batch) const;
  // Runs it (redistribute/executor.h: run_ring_batch): `sent` holds the tensors of each block
  // batch(phase, batch).sends lists, shaped like `like` but along the ring's dim; returns the
  // tensors of each block its receives list. `while_moving` runs while they travel.
  std::vector<std::vector<at::Tensor>> run(RingPhase phase, int64_t batch, const std::vector<std::vector<at::Tensor>>& sent,
                                           const std::vector<at::Tensor>& like, const std::function<void()>& while_moving = {}) const;

 private:
  const LoweredStep* step(RingPhase phase) const;

  DeviceMesh mesh_;
  std::vector<LoweredStep> steps_;  // the RingSteps, in the declared order (one per phase)
};

}  // namespace shardtensor
