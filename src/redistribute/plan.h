// RedistributePlan: the steps that turn one layout into another, as a printable value.
//
// Decision table of plan_redistribute(source, target):
//   same spec                                   -> empty plan, no work
//   Partial(op) on mesh dim m, target not it:
//     target Shard(d) on m, and the pieces of the
//     m-group tile each rank's current box      -> ReduceScatter(m, d)  (all-to-all + local reduce)
//     otherwise                                 -> AllReduce(m)
//   then Shard/Replicate changes on any dims:
//     every rank already holds its target box   -> LocalSlice           (no communication)
//     otherwise                                 -> Exchange             (one all-to-all over the mesh,
//                                                  each rank sending exactly the box intersections
//                                                  its receivers lack; see redistribute/boxes.h)
// One Exchange covers all-gathers, all-to-alls (S(a)->S(b)), nested un-sharding and uneven
// rebalancing alike, and never moves a byte the receiver already has.
#pragma once

#include <string>
#include <variant>
#include <vector>

#include "shardtensor/spec.h"

namespace shardtensor {

struct AllReduceStep {
  int64_t mesh_dim;
  ReduceOp op;
};
struct ReduceScatterStep {
  int64_t mesh_dim;
  ReduceOp op;
  int64_t tensor_dim;
};
struct LocalSliceStep {};
struct ExchangeStep {
  std::vector<int64_t> mesh_dims;  // mesh dims along which data travels
  int64_t max_elements_received;   // by the busiest rank: the cost model's measure
};
using RedistributeStep = std::variant<AllReduceStep, ReduceScatterStep, LocalSliceStep, ExchangeStep>;

struct PlannedStep {
  RedistributeStep step;
  ShardTensorSpec after;  // the layout once this step ran
};

struct RedistributePlan {
  std::vector<PlannedStep> steps;

  bool empty() const { return steps.empty(); }
  std::string to_string() const;  // "ReduceScatter(mesh_dim=1, tensor_dim=0, sum) -> Exchange(mesh_dims=[0])"
};

std::string to_string(const RedistributeStep& step);

// Plans (and caches by the pair of specs) a redistribution. Pure: no communication, the same
// answer on every rank. Source and target must share mesh, shape and dtype.
const RedistributePlan& plan_redistribute(const ShardTensorSpec& source, const ShardTensorSpec& target);

// The same plan computed afresh, bypassing the cache (for benchmarks and tests of the planner).
RedistributePlan plan_redistribute_uncached(const ShardTensorSpec& source, const ShardTensorSpec& target);

// The chain of layouts a plan walks through: "[S(0), S(0)] -> [R, S(0)] (Exchange ...)".
std::string explain_redistribute(const ShardTensorSpec& source, const ShardTensorSpec& target);

// `placements` (already normalised) over `source`'s mesh, shape and dtype: `given` sizes win,
// tensor dims sharded by the same mesh dims as before keep their sizes, the others take
// torch.chunk sizes. No policy on Partial: gradients may be declared Partial.
ShardTensorSpec relayout(const ShardTensorSpec& source, const Placements& placements, const ShardSizes& given);

// The target spec of redistribute(t, placements[, sizes]): checks the placements; tensor dims
// sharded by the same mesh dims as before keep their sizes, newly sharded ones take torch.chunk
// sizes, and explicit `sizes` win. Partial targets are refused unless the same Partial was
// already there.
ShardTensorSpec redistribute_target(const ShardTensorSpec& source, const Placements& placements, const ShardSizes* sizes);

}  // namespace shardtensor
