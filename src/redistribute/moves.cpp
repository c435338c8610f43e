// See moves.h.
#include "redistribute/moves.h"

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <optional>

namespace shardtensor::planning {
namespace {

Codes encode(const Placements& placements) {
  Codes codes = 0;
  for (size_t m = 0; m < placements.size(); ++m) {
    const Placement& p = placements[m];
    codes = with_code(codes, static_cast<int64_t>(m),
                      p.is_partial() ? kPartial : p.is_shard() ? shard_code(p.tensor_dim) : kReplicate);
  }
  return codes;
}

// The fraction [lo, hi) of tensor dim `d` a rank at `coordinate` holds under `codes`, with
// even splits nested in mesh-dim order.
std::pair<double, double> held_fraction(Codes codes, int64_t d, const int64_t* coordinate, const std::vector<int64_t>& mesh_shape) {
  int64_t index = 0, pieces = 1;
  for (size_t m = 0; m < mesh_shape.size(); ++m) {
    if (code_at(codes, static_cast<int64_t>(m)) != shard_code(d)) continue;
    index = index * mesh_shape[m] + coordinate[m];
    pieces *= mesh_shape[m];
  }
  return {static_cast<double>(index) / pieces, static_cast<double>(index + 1) / pieces};
}

}  // namespace

Problem::Problem(const ShardTensorSpec& source, const ShardTensorSpec& target)
    : mesh_shape_(source.mesh().shape()), tensor_ndim_(source.ndim()) {
  for (const Placement& p : source.placements()) partial_ops_.push_back(p.reduce_op);
  TORCH_CHECK(mesh_ndim() <= kMaxMeshDims, "redistribute: the planner handles meshes of up to ", kMaxMeshDims,
              " dims; this one has ", mesh_ndim());
  TORCH_CHECK(tensor_ndim_ < 250, "redistribute: the planner handles tensors of up to 249 dims");
  source_codes_ = encode(source.placements());
  target_codes_ = encode(target.placements());
  int64_t numel = 1;
  for (int64_t s : source.shape()) numel *= s;
  total_bytes_ = static_cast<double>(numel) * static_cast<double>(c10::elementSize(source.dtype()));
  std::vector<int64_t> coordinate(mesh_shape_.size(), 0);
  for (int64_t i = 0; i < source.mesh().size(); ++i) {
    coordinates_.insert(coordinates_.end(), coordinate.begin(), coordinate.end());
    for (int64_t m = mesh_ndim() - 1; m >= 0 && ++coordinate[m] == mesh_shape_[m]; --m) coordinate[m] = 0;
  }
}

bool Problem::may_shard(Codes codes, int64_t mesh_dim, int64_t tensor_dim) const {
  for (int64_t m = mesh_dim + 1; m < mesh_ndim(); ++m)
    if (code_at(codes, m) == shard_code(tensor_dim)) return false;
  return true;
}

bool Problem::has_pending_partial(Codes codes) const {
  for (int64_t m = 0; m < mesh_ndim(); ++m)
    if (code_at(codes, m) == kPartial && code_at(target_codes_, m) != kPartial) return true;
  return false;
}

Codes Problem::apply(Codes from, const MoveStep& move) const {
  if (std::holds_alternative<ExchangeStep>(move)) return target_codes_;
  const std::optional<int64_t> starts = starts_sharding(move);
  return with_code(from, mesh_dim_of(move), starts ? shard_code(*starts) : kReplicate);
}

double Problem::held_bytes(Codes codes) const {
  double bytes = total_bytes_;
  for (int64_t m = 0; m < mesh_ndim(); ++m)
    if (is_shard_code(code_at(codes, m))) bytes /= static_cast<double>(mesh_shape_[m]);
  return bytes;
}

double Problem::exchange_bytes(Codes from) const {
  double busiest = 0;
  for (size_t offset = 0; offset < coordinates_.size(); offset += mesh_shape_.size()) {
    const int64_t* coordinate = coordinates_.data() + offset;
    double wanted = 1, kept = 1;
    for (int64_t d = 0; d < tensor_ndim_; ++d) {
      const auto [held_lo, held_hi] = held_fraction(from, d, coordinate, mesh_shape_);
      const auto [want_lo, want_hi] = held_fraction(target_codes_, d, coordinate, mesh_shape_);
      wanted *= want_hi - want_lo;
      kept *= std::max(0.0, std::min(held_hi, want_hi) - std::max(held_lo, want_lo));
    }
    busiest = std::max(busiest, wanted - kept);
  }
  return busiest * total_bytes_;
}

double Problem::cost(Codes from, const MoveStep& move) const {
  if (std::holds_alternative<ExchangeStep>(move)) return kLatencyBytes + exchange_bytes(from);
  const double n = static_cast<double>(mesh_shape_[mesh_dim_of(move)]);
  const double held = held_bytes(from);
  if (std::holds_alternative<LocalChunkStep>(move) || n == 1) return kLocalCopyFactor * held_bytes(apply(from, move));
  if (std::holds_alternative<AllReduceStep>(move)) return kLatencyBytes + 2 * (n - 1) / n * held;
  if (std::holds_alternative<AllGatherStep>(move)) return kLatencyBytes + (n - 1) * held;
  return kLatencyBytes + (n - 1) / n * held;  // ReduceScatter, AllToAll
}

}  // namespace shardtensor::planning
