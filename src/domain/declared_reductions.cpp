// See declared_reductions.h.
#include "domain/declared_reductions.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "comm/comm.h"
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
    TORCH_INTERNAL_ASSERT(!mesh_dim_, "a plan declared two gathers; DeclaredGather runs one");
    mesh_dim_ = gather->mesh_dim;
  }
}

at::Tensor DeclaredGather::run(const at::Tensor& mine) const {
  if (!mesh_dim_) return mine.unsqueeze(0);
  std::vector<int64_t> shape = mine.sizes().vec();
  shape.insert(shape.begin(), mesh_.size(*mesh_dim_));
  const at::Tensor all = at::empty(shape, mine.options());
  mesh_.comm(*mesh_dim_).all_gather(mine.contiguous(), all);
  return all;
}

}  // namespace shardtensor
