// RedistributePlan: the steps that turn one layout into another, as a printable value.
//
// A plan is a chain of layouts; each step is a MoveStep (steps.h says what each one does), and
// every step but Exchange changes the placement of ONE mesh dim. Nesting: mesh dims that shard
// the same tensor dim nest in mesh-dim order (the lowest mesh dim is the outermost split), so a
// step may only remove or add the innermost one. Exchange goes from any Shard/Replicate layout
// to the target in one all-to-all over the mesh, and also rebalances shard sizes.
// Two planners produce plans (moves.h, greedy_planner.cpp, graph_planner.cpp): a greedy one,
// DTensor-style, and a Dijkstra search over the same moves plus Exchange with a cost model in
// bytes; the search is the default. Plans are cached by (source spec, target spec, planner).
#pragma once

#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "redistribute/lowered_step.h"
#include "redistribute/steps.h"
#include "shardtensor/spec.h"
#include "shardtensor/transport_options.h"

namespace shardtensor {

// Which transport carries a step (chosen in transport.cpp, from metadata only):
//   - Collective: one native c10d collective;
//   - PeerMemory: same-host copies between the ranks' memory (transports/peer_memory/peer_memory.h);
//   - Messages: point-to-point messages;
//   - None: no byte crosses ranks (a local slice, a one-rank group).
// SharedArena: peer memory's exchange, with the parts that lie in their holders' shared arenas
// read in place (transports/peer_memory/arena.h).
enum class TransportKind { None, Collective, PeerMemory, SharedArena, Messages };

// A part travels as messages of about this many bytes by default, cut along its first dim, so
// that packing one overlaps sending the one before; smaller messages measured slower on
// loopback Gloo. TransportOptions::message_bytes changes it.
constexpr int64_t kDefaultMessageBytes = 4 << 20;

struct StepTransport {
  TransportKind kind = TransportKind::None;
  // The c10d collective that carries a Collective step ("all_gather", "reduce_scatter",
  // "all_reduce", "all_to_all"); for the other transports, the collective it stands in for.
  const char* collective = "";
  // What CommDebugMode calls the step, whichever transport runs it, as DTensor's does: a
  // gather "all_gather", a reduce-scatter "reduce_scatter" (even an uneven one that runs as a
  // c10d all_to_all).
  const char* counted_as = "";
  // Messages: the size parts are cut to (the options' message_bytes).
  int64_t message_bytes = kDefaultMessageBytes;
};

// TransportOptions with every field decided (this process's defaults fill the unset ones): what
// a plan is lowered with, and part of its cache key.
struct ResolvedTransportOptions {
  TransportPreference preference = TransportPreference::Auto;
  bool peer_memory = true;
  int64_t peer_copy_bytes = 0;
  int64_t message_bytes = kDefaultMessageBytes;
  bool shared_arena = false;

  bool operator==(const ResolvedTransportOptions& o) const {
    return preference == o.preference && peer_memory == o.peer_memory && peer_copy_bytes == o.peer_copy_bytes &&
           message_bytes == o.message_bytes && shared_arena == o.shared_arena;
  }
  bool operator!=(const ResolvedTransportOptions& o) const { return !(*this == o); }
};
// `options`, then the open TransportOptionsScopes', over this process's defaults (transport.h:
// read once from the environment).
ResolvedTransportOptions resolve(const TransportOptions& options = {});

struct PlannedStep {
  // Who sends which part to whom on this rank, computed once when the plan is made; the
  // executor runs the step through it (lowered_step.h).
  LoweredStep lowered;
  ShardTensorSpec after;  // the layout once this step ran
  double cost;            // the cost model's estimate (see redistribute/moves.h)
  // This rank's transport for the step under the plan's `lowered_with`, chosen once when the
  // plan is made (see plan_redistribute).
  StepTransport transport{};

  // One of the redistribute steps (steps.h).
  const MoveStep& step() const { return lowered.step(); }
};

struct RedistributePlan {
  std::vector<PlannedStep> steps;
  ResolvedTransportOptions lowered_with;

  bool empty() const { return steps.empty(); }
  double cost() const;
  std::string to_string() const;  // "AllGather(mesh_dim=1, tensor_dim=0) -> LocalChunk(mesh_dim=0, tensor_dim=1)"
};

enum class Planner { GraphSearch, Greedy };
std::string to_string(Planner planner);

// The planner redistribute() and the dispatcher use: the graph search unless the environment
// variable SHARDTENSOR_PLANNER=greedy or set_default_planner() says otherwise. Every rank must
// use the same one.
Planner default_planner();
void set_default_planner(Planner planner);

// Plans (and caches by the pair of specs) a redistribution. Pure: no communication, the same
// answer on every rank. Source and target must share mesh, shape and dtype.
// Drops every cached plan (and the meshes their specs hold); a plan in use lives on with its
// holders. Dispatch drops them when a process group breaks (dispatch/propagation.cpp).
void clear_plan_cache();
// Plans are cached by (source, target, planner, options), and lowered when made: each step gets
// this rank's transport under `options` (a pure function of the specs and the options, so every
// rank makes the same choice without communicating). Shared, so that a plan a caller runs (or a
// cached propagation holds) stays valid while another thread clears the cache.
std::shared_ptr<const RedistributePlan> plan_redistribute(const ShardTensorSpec& source, const ShardTensorSpec& target,
                                                          Planner planner = default_planner(),
                                                          const ResolvedTransportOptions& options = resolve());

// The same plan computed afresh, bypassing the cache (for benchmarks and tests of the planner).
RedistributePlan plan_redistribute_uncached(const ShardTensorSpec& source, const ShardTensorSpec& target,
                                            Planner planner = Planner::GraphSearch,
                                            const ResolvedTransportOptions& options = resolve());

// The chain of layouts a plan walks through, with the transport of each step on this rank
// (transport.h): "[S(0), S(0)] -[AllGather(mesh_dim=1, tensor_dim=0) by peer memory]-> [S(0), R]
// -> ... (graph search, modelled cost 1.2 MB)".
// (The public two-argument form in shardtensor/redistribute.h uses the default planner.)
std::string explain_redistribute(const ShardTensorSpec& source, const ShardTensorSpec& target, Planner planner,
                                 const ResolvedTransportOptions& options = resolve());

// `placements` (already normalised) over `source`'s mesh, shape and dtype: `given` sizes win,
// tensor dims sharded by the same mesh dims as before, in the same order (placement.h:
// ZigzagShard), keep their sizes, the others take torch.chunk sizes (zigzag ones, zigzag's). No policy on Partial: gradients may be declared Partial.
ShardTensorSpec relayout(const ShardTensorSpec& source, const Placements& placements, const ShardSizes& given);

// The target spec of redistribute(t, placements[, sizes]): checks the placements; tensor dims
// sharded by the same mesh dims as before keep their sizes, newly sharded ones take torch.chunk
// sizes, and explicit `sizes` win. Partial targets are refused unless the same Partial was
// already there.
ShardTensorSpec redistribute_target(const ShardTensorSpec& source, const Placements& placements, const ShardSizes* sizes);

}  // namespace shardtensor
