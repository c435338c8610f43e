// See declared_reductions.h.
#include "domain/declared_reductions.h"

#include <ATen/core/Tensor.h>

#include "redistribute/executor.h"

namespace shardtensor {

DeclaredReductions::DeclaredReductions(DeviceMesh mesh, const std::vector<MoveStep>& declared) : mesh_(std::move(mesh)) {
  for (const MoveStep& move : declared)
    if (const auto* reduction = std::get_if<AllReduceStep>(&move)) steps_.emplace_back(*reduction);
}

void DeclaredReductions::run(const at::Tensor& tensor) const {
  for (const LoweredStep& step : steps_) reduce_in_place(step, mesh_, tensor);
}

DeclaredGather::DeclaredGather(DeviceMesh mesh, const std::vector<MoveStep>& declared) : mesh_(std::move(mesh)) {
  for (const MoveStep& move : declared) {
    const auto* gather = std::get_if<StatisticsGatherStep>(&move);
    if (!gather) continue;
    TORCH_INTERNAL_ASSERT(!step_, "a plan declared two gathers; DeclaredGather runs one");
    step_.emplace(*gather);
  }
}

at::Tensor DeclaredGather::run(const at::Tensor& mine) const {
  if (!step_) return mine.unsqueeze(0);
  return run_kernel_step(*step_, mesh_, mine);
}

DeclaredRing::DeclaredRing(DeviceMesh mesh, const std::vector<MoveStep>& declared, int64_t widest_rows,
                           const std::function<std::vector<RingBatch>(RingPhase)>& batches_of)
    : mesh_(std::move(mesh)) {
  for (const MoveStep& move : declared)
    if (const auto* ring = std::get_if<RingStep>(&move)) steps_.emplace_back(*ring, batches_of(ring->phase), widest_rows);
}

const LoweredStep* DeclaredRing::step(RingPhase phase) const {
  for (const LoweredStep& s : steps_)
    if (std::get<RingStep>(s.step()).phase == phase) return &s;
  return nullptr;
}

bool DeclaredRing::declares(RingPhase phase) const { return step(phase) != nullptr; }

const RingBatch& DeclaredRing::batch(RingPhase phase, int64_t batch) const {
  const LoweredStep* declared = step(phase);
  TORCH_INTERNAL_ASSERT(declared, "the plan declared no ring step of phase ", counted_as(phase));
  return declared->ring_batch(batch);
}

std::vector<std::vector<at::Tensor>> DeclaredRing::run(RingPhase phase, int64_t batch, const std::vector<std::vector<at::Tensor>>& sent,
                                                       const std::vector<at::Tensor>& like,
                                                       const std::function<void()>& while_moving) const {
  const LoweredStep* declared = step(phase);
  TORCH_INTERNAL_ASSERT(declared, "the plan declared no ring step of phase ", counted_as(phase));
  return run_ring_batch(*declared, batch, sent, like, mesh_, while_moving);
}

}  // namespace shardtensor
