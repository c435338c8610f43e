// See agreement.h.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "checkpoint/agreement.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>

#include <algorithm>

#include "comm/mesh_collectives.h"
#include "shardtensor/shard_tensor.h"
#include "util/strings.h"

namespace shardtensor::checkpoint {

Agreement Agreement::for_state(const char* api, const StateDict& state, const std::optional<DeviceMesh>& mesh) {
  Agreement a;
  a.mesh_ = mesh;
  for (const auto& [name, t] : state)
    if (!a.mesh_ && t.defined() && is_shard_tensor(t)) a.mesh_ = spec(t).mesh();
  if (!a.mesh_) {
    TORCH_CHECK(world_size() == 1, api, ": the state holds no ShardTensor, so there is no mesh to agree over in a world of ",
                world_size(), " ranks; pass options.mesh.");
    a.ranks_ = {world_rank()};
    return a;
  }
  a.ranks_ = a.mesh_->ranks();
  a.position_ = std::find(a.ranks_.begin(), a.ranks_.end(), a.mesh_->rank()) - a.ranks_.begin();
  std::vector<int64_t> sorted = a.ranks_;
  std::sort(sorted.begin(), sorted.end());
  for (const auto& [name, t] : state) {
    if (!t.defined() || !is_shard_tensor(t)) continue;
    std::vector<int64_t> ranks = spec(t).mesh().ranks();
    std::sort(ranks.begin(), ranks.end());
    TORCH_CHECK(ranks == sorted, api, ": '", name, "' lives on ", spec(t).mesh(), " over ranks [", join(ranks, ", "),
                "], but the checkpoint's group is ", *a.mesh_, " over ranks [", join(sorted, ", "),
                "]. Every ShardTensor of one state must span the same ranks.");
  }
  return a;
}

std::vector<std::vector<int64_t>> Agreement::gather(const std::vector<int64_t>& row) const {
  if (!mesh_ || size() == 1) return {row};
  std::vector<int64_t> copy = row;
  const at::Tensor mine = at::from_blob(copy.data(), {static_cast<int64_t>(copy.size())}, at::TensorOptions().dtype(at::kLong))
                              .to(mesh_->device(), /*non_blocking=*/false, /*copy=*/true);
  const at::Tensor all = all_gather_over_mesh(*mesh_, mine).cpu().contiguous();
  std::vector<std::vector<int64_t>> rows(size());
  const int64_t* p = all.data_ptr<int64_t>();
  for (int64_t r = 0; r < size(); ++r) rows[r].assign(p + r * row.size(), p + (r + 1) * row.size());
  return rows;
}

}  // namespace shardtensor::checkpoint
