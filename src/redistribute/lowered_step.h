// A step lowered for this rank, in heFFTe's manner: who sends which part to whom is computed
// once, when the plan is made and cached (planner.cpp) or the kernel that declared the step is
// lowered (its propagation cached); each call only moves bytes, through one apply().
//
// Lowering is pure (boxes and ranges, no communicator), so the planner does it, and a plan made
// on a mesh without communicators (the unit tests') is lowered too. apply() is the executor's
// (executor.cpp; the halo steps' part of it is executor_halo.cpp): every step of every
// redistribute plan runs through it, and so does every move a kernel declares: mid-op
// all-reduces (executor.h: reduce_in_place), halo gathers and their adjoint scatter-adds
// (domain/kernel_moves.h), the attention merge's statistics gather (executor.h: run_kernel_step), and
// the attention ring's batches (executor.h: run_ring_batch), whose apply takes the compute the
// transfer overlaps.
#pragma once

#include <c10/core/TensorOptions.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "redistribute/boxes.h"
#include "redistribute/steps.h"
#include "shardtensor/spec.h"
#include "spec/halo_geometry.h"

namespace at {
class Tensor;
}

namespace shardtensor {

struct StepTransport;  // plan.h

// Tensors of `shapes` that are views of one fresh flat buffer (zeros where `zeroed`): what a
// ring batch sends on as it lies, without packing it (executor_ring.cpp).
std::vector<at::Tensor> views_of_one_buffer(const std::vector<std::vector<int64_t>>& shapes, const c10::TensorOptions& options,
                                            bool zeroed = false);

class LoweredStep {
 public:
  // `step` (a redistribute step) from `from` to `to`, as this rank (from.mesh().coordinate())
  // runs it. Outside the mesh, nothing (the executor moves nothing there).
  LoweredStep(MoveStep step, const ShardTensorSpec& from, const ShardTensorSpec& to);
  // A kernel's mid-op reduction: of whatever tensor each call hands it.
  explicit LoweredStep(AllReduceStep step);
  // A kernel's halo step (a HaloGatherStep or HaloScatterAddStep of `axis`): the stretches
  // this rank sends each peer and receives from each, lowered once for the axis's two steps.
  // A gather fills its window's positions outside the field with `fill` (on a periodic axis,
  // they wrap around instead). Where no window crosses shards the step moves nothing and only
  // assembles (or folds back) the window locally.
  LoweredStep(MoveStep step, std::shared_ptr<const LoweredHaloAxis> axis, double fill = 0.0);
  // The attention merge's gather of per-row statistics: every member's tensor, stacked.
  explicit LoweredStep(StatisticsGatherStep step);
  // A ring step: its `batches` (step.batches of them) as this rank runs them. `widest_rows` is
  // the longest block's length, the same on every member, which sizes the transport.
  LoweredStep(RingStep step, std::vector<RingBatch> batches, int64_t widest_rows);

  const MoveStep& step() const { return step_; }
  // A halo step's axis, as this rank runs it.
  const LoweredHaloAxis& halo() const;
  // The bytes each member of a halo step's group moves for a piece like `piece`, the same on
  // every member (its widest window's): what sizes the step's transport.
  int64_t bytes_per_member(const at::Tensor& piece) const;

  // This rank's piece after the step, from its piece before (`piece`), moved by `how` over the
  // groups of `mesh`; a fresh tensor, but for a halo gather that neither receives nor fills
  // (its window is a view of the piece then). Every member of the step's group calls it with the
  // same step. The mesh is the call's, never kept: a plan cached for one mesh serves every mesh
  // equal to it, each with its own communicators. Executor.cpp.
  at::Tensor apply(const at::Tensor& piece, const DeviceMesh& mesh, const StepTransport& how) const;

  // A ring step's batch `batch`, as this rank runs it.
  const RingBatch& ring_batch(int64_t batch) const;
  // The bytes the widest block of tensors shaped like `like` takes (every dim but the step's
  // from `like`, that one the widest block's): the same on every member, what sizes the batch's
  // transport.
  int64_t widest_block_bytes(const std::vector<at::Tensor>& like) const;
  // Apply for a ring step's batch `batch`: for each of ring_batch(batch).sends, `sent` holds its
  // block's tensors (shaped like `like` but along the step's tensor dim); returned, for each of
  // its receives, that block's tensors, views of one fresh buffer (which a later batch sends on
  // as they lie). `while_moving` runs once this rank's parts are posted, before any is awaited:
  // the block compute the transfer overlaps. Executor_ring.cpp.
  std::vector<std::vector<at::Tensor>> apply(int64_t batch, const std::vector<std::vector<at::Tensor>>& sent,
                                             const std::vector<at::Tensor>& like, const DeviceMesh& mesh, const StepTransport& how,
                                             const std::function<void()>& while_moving = {}) const;

 private:
  at::Tensor reduce_scatter(const at::Tensor& piece, const DeviceMesh& mesh, ReduceOp op, const StepTransport& how) const;
  at::Tensor exchange(const at::Tensor& piece, const DeviceMesh& mesh, const StepTransport& how) const;
  at::Tensor local_slice(const at::Tensor& piece) const;
  // executor_halo.cpp
  at::Tensor gather_window(const at::Tensor& owned_piece, const DeviceMesh& mesh, const StepTransport& how) const;
  at::Tensor scatter_add_window(const at::Tensor& window_piece, const DeviceMesh& mesh, const StepTransport& how) const;
  std::vector<std::vector<at::Tensor>> exchange_stretches(const at::Tensor& source, const HaloExchange& x, const DeviceMesh& mesh,
                                                          const StepTransport& how) const;
  at::Tensor gather_statistics(const at::Tensor& mine, const DeviceMesh& mesh) const;

  MoveStep step_;
  Box held_, wanted_;             // this rank's box before and after the step
  Box own_;                       // exchanges: the part of held_ this rank keeps (copied, never sent)
  // Exchanges to or from a zigzag order: the stretches this rank keeps, each with its own boxes
  // as parts_ have (own_ is then none).
  std::vector<PeerPart> kept_;
  std::vector<PeerPart> parts_;   // exchanges: every part this rank sends or receives, in group ranks
  std::vector<Box> targets_;      // reduce-scatters: every member's box after the step
  std::optional<double> norm_;    // a pending p-norm: reduced as a sum of p-th powers, rooted after
  std::shared_ptr<const LoweredHaloAxis> halo_;  // halo steps: the axis (shared by its gather and scatter-add)
  double fill_ = 0.0;                            // halo gathers: the value outside the field
  std::vector<RingBatch> ring_batches_;          // ring steps: one per batch
  int64_t widest_rows_ = 0;                      // ring steps: the longest block's length
};

}  // namespace shardtensor
