// RedistributePlan: the steps that turn one layout into another, as a printable value.
//
// A plan is a chain of layouts. Every step but Exchange changes the placement of ONE mesh
// dim and runs as one collective over that mesh dim's group:
//   Partial(op) -> Replicate   AllReduce(m)
//   Partial(op) -> Shard(d)    ReduceScatter(m, d)
//   Shard(d)    -> Replicate   AllGather(m)
//   Shard(d)    -> Shard(d')   AllToAll(m, d -> d')
//   Replicate   -> Shard(d)    LocalChunk(m, d)      (no communication)
// Nesting: mesh dims that shard the same tensor dim nest in mesh-dim order (the lowest mesh dim
// is the outermost split), so a step may only remove or add the innermost one.
//   Exchange                   any Shard/Replicate layout -> the target, in one all-to-all over
//                              the mesh: each rank gets exactly the box intersections it lacks
//                              (see redistribute/boxes.h). It also rebalances shard sizes.
// Two planners produce plans (moves.h, greedy_planner.cpp, graph_planner.cpp): a greedy one,
// DTensor-style, and a Dijkstra search over the same moves plus Exchange with a cost model in
// bytes; the search is the default. Plans are cached by (source spec, target spec, planner).
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
struct AllGatherStep {
  int64_t mesh_dim;
  int64_t tensor_dim;  // the dim it stops sharding
};
struct AllToAllStep {
  int64_t mesh_dim;
  int64_t from_dim, to_dim;
};
struct LocalChunkStep {
  int64_t mesh_dim;
  int64_t tensor_dim;
};
struct ExchangeStep {};
using RedistributeStep =
    std::variant<AllReduceStep, ReduceScatterStep, AllGatherStep, AllToAllStep, LocalChunkStep, ExchangeStep>;

struct PlannedStep {
  RedistributeStep step;
  ShardTensorSpec after;  // the layout once this step ran
  double cost;            // the cost model's estimate (see redistribute/moves.h)
};

struct RedistributePlan {
  std::vector<PlannedStep> steps;

  bool empty() const { return steps.empty(); }
  double cost() const;
  std::string to_string() const;  // "AllGather(mesh_dim=1, tensor_dim=0) -> LocalChunk(mesh_dim=0, tensor_dim=1)"
};

std::string to_string(const RedistributeStep& step);

enum class Planner { GraphSearch, Greedy };
std::string to_string(Planner planner);

// The planner redistribute() and the dispatcher use: the graph search unless the environment
// variable SHARDTENSOR_PLANNER=greedy or set_default_planner() says otherwise. Every rank must
// use the same one.
Planner default_planner();
void set_default_planner(Planner planner);

// Plans (and caches by the pair of specs) a redistribution. Pure: no communication, the same
// answer on every rank. Source and target must share mesh, shape and dtype.
// Drops every cached plan (and the meshes their specs hold); only while no plan is in use.
void clear_plan_cache();
const RedistributePlan& plan_redistribute(const ShardTensorSpec& source, const ShardTensorSpec& target,
                                          Planner planner = default_planner());

// The same plan computed afresh, bypassing the cache (for benchmarks and tests of the planner).
RedistributePlan plan_redistribute_uncached(const ShardTensorSpec& source, const ShardTensorSpec& target,
                                            Planner planner = Planner::GraphSearch);

// The chain of layouts a plan walks through, with the transport of each step on this rank
// (transport.h): "[S(0), S(0)] -[AllGather(mesh_dim=1, tensor_dim=0) by peer memory]-> [S(0), R]
// -> ... (graph search, modelled cost 1.2 MB)".
// (The public two-argument form in shardtensor/redistribute.h uses the default planner.)
std::string explain_redistribute(const ShardTensorSpec& source, const ShardTensorSpec& target, Planner planner);

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
