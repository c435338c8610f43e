// A redistribute step lowered for this rank, in heFFTe's manner: who sends which part to whom
// is computed once, when the plan is made and cached (planner.cpp), from the two layouts
// around the step; each call only moves bytes, through one apply().
//
// Lowering is pure (boxes only, no communicator), so the planner does it, and a plan made on a
// mesh without communicators (the unit tests') is lowered too. apply() is the executor's
// (executor.cpp): every step of every plan runs through it, and so does a kernel's mid-op
// AllReduceStep (executor.h: reduce_in_place), lowered the same way.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "redistribute/boxes.h"
#include "redistribute/steps.h"
#include "shardtensor/spec.h"

namespace at {
class Tensor;
}

namespace shardtensor {

struct StepTransport;  // plan.h

class LoweredStep {
 public:
  // `step` (a redistribute step) from `from` to `to`, as this rank (from.mesh().coordinate())
  // runs it. Outside the mesh, nothing (the executor moves nothing there).
  LoweredStep(MoveStep step, const ShardTensorSpec& from, const ShardTensorSpec& to);
  // A kernel's mid-op reduction: of whatever tensor each call hands it.
  explicit LoweredStep(AllReduceStep step);

  const MoveStep& step() const { return step_; }

  // This rank's piece after the step, from its piece before (`piece`), moved by `how` over the
  // groups of `mesh`; always a fresh tensor. Every member of the step's group calls it with the
  // same step. The mesh is the call's, never kept: a plan cached for one mesh serves every mesh
  // equal to it, each with its own communicators. Executor.cpp.
  at::Tensor apply(const at::Tensor& piece, const DeviceMesh& mesh, const StepTransport& how) const;

 private:
  at::Tensor reduce_scatter(const at::Tensor& piece, const DeviceMesh& mesh, ReduceOp op, const StepTransport& how) const;
  at::Tensor exchange(const at::Tensor& piece, const DeviceMesh& mesh, const StepTransport& how) const;
  at::Tensor local_slice(const at::Tensor& piece) const;

  MoveStep step_;
  Box held_, wanted_;             // this rank's box before and after the step
  Box own_;                       // exchanges: the part of held_ this rank keeps (copied, never sent)
  std::vector<PeerPart> parts_;   // exchanges: every part this rank sends or receives, in group ranks
  std::vector<Box> targets_;      // reduce-scatters: every member's box after the step
  std::optional<double> norm_;    // a pending p-norm: reduced as a sum of p-th powers, rooted after
};

}  // namespace shardtensor
