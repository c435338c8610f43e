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

}  // namespace shardtensor
