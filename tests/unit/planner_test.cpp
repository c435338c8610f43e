// The planner is pure: plans are compared as strings on meshes without communicators.
#include <gtest/gtest.h>

#include <functional>

#include "redistribute/boxes.h"
#include "redistribute/transports/peer_memory/copies.h"
#include "redistribute/transports/peer_memory/peer_memory.h"
#include "redistribute/plan.h"
#include "redistribute/transport.h"
#include "util/strings.h"
#include "support/reference.h"

using namespace shardtensor;

namespace {
ShardTensorSpec make(const std::vector<int64_t>& mesh_shape, Placements ps, std::vector<int64_t> shape, ShardSizes sizes = {}) {
  return ShardTensorSpec(DeviceMesh::without_comms(mesh_shape, 0), std::move(ps), std::move(shape), c10::kFloat, sizes);
}
std::string plan(const ShardTensorSpec& a, const ShardTensorSpec& b) { return plan_redistribute(a, b)->to_string(); }
}  // namespace

TEST(RedistributePlanner, SameSpecIsNoWork) {
  auto s = make({4}, {Shard(0)}, {10});
  EXPECT_EQ(plan(s, s), "(no work)");
}

TEST(RedistributePlanner, ReplicateToShardIsALocalChunk) {
  EXPECT_EQ(plan(make({4}, {Replicate()}, {10}), make({4}, {Shard(0)}, {10})), "LocalChunk(mesh_dim=0, tensor_dim=0)");
}

TEST(RedistributePlanner, ShardToReplicateOnUnevenDimIsOneAllGather) {
  EXPECT_EQ(plan(make({4}, {Shard(0)}, {10, 6}), make({4}, {Replicate()}, {10, 6})), "AllGather(mesh_dim=0, tensor_dim=0)");
}

TEST(RedistributePlanner, RebalancingExplicitSizesIsOneExchange) {
  EXPECT_EQ(plan(make({4}, {Shard(0)}, {10}, {{0, {1, 4, 2, 3}}}), make({4}, {Shard(0)}, {10}, {{0, {3, 3, 2, 2}}})),
            "Exchange()");
}

TEST(RedistributePlanner, PartialToShardIsAReduceScatterAndToReplicateAnAllReduce) {
  EXPECT_EQ(plan(make({4}, {Partial(ReduceOp::Max)}, {10}), make({4}, {Shard(0)}, {10})),
            "ReduceScatter(mesh_dim=0, tensor_dim=0, max)");
  EXPECT_EQ(plan(make({2, 2}, {Partial(), Shard(1)}, {4, 4}), make({2, 2}, {Replicate(), Shard(1)}, {4, 4})),
            "AllReduce(mesh_dim=0, sum)");
}

TEST(RedistributePlanner, PartialOuterDimUnderAnInnerShardIsNotReduceScattered) {
  // Mesh dim 0 cannot become the outer Shard(0) while mesh dim 1 splits dim 0 inside it: the
  // pieces would not tile what each rank holds. Greedy reduces fully, then undoes and redoes the
  // inner split; the search finds one Exchange of the missing quarter instead.
  const auto from = make({2, 2}, {Partial(), Shard(0)}, {8}), to = make({2, 2}, {Shard(0), Shard(0)}, {8});
  EXPECT_EQ(plan_redistribute(from, to, Planner::Greedy)->to_string(),
            "AllReduce(mesh_dim=0, sum) -> AllGather(mesh_dim=1, tensor_dim=0) -> LocalChunk(mesh_dim=0, tensor_dim=0) -> "
            "LocalChunk(mesh_dim=1, tensor_dim=0)");
  EXPECT_EQ(plan(from, to), "AllReduce(mesh_dim=0, sum) -> Exchange()");
}

TEST(RedistributePlanner, NestedShardToInnerShardUndoesTheInnerSplitFirstWhenGreedy) {
  // DTensor's trap: mesh dim 1 holds S(0) in both layouts but nested differently.
  const auto from = make({2, 2}, {Shard(0), Shard(0)}, {1024, 64}), to = make({2, 2}, {Replicate(), Shard(0)}, {1024, 64});
  EXPECT_EQ(plan_redistribute(from, to, Planner::Greedy)->to_string(),
            "AllGather(mesh_dim=1, tensor_dim=0) -> AllGather(mesh_dim=0, tensor_dim=0) -> LocalChunk(mesh_dim=1, tensor_dim=0)");
  EXPECT_EQ(plan(from, to), "Exchange()");
  EXPECT_LT(plan_redistribute(from, to)->cost(), plan_redistribute(from, to, Planner::Greedy)->cost());
}

TEST(RedistributePlanner, ShardDimChangeOnLargeTensorsIsOneAllToAll) {
  EXPECT_EQ(plan(make({4}, {Shard(0)}, {2048, 2048}), make({4}, {Shard(1)}, {2048, 2048})), "AllToAll(mesh_dim=0, tensor_dim=0->1)");
}

TEST(RedistributePlanner, UnevenTargetSizesAreReachedWithoutAnExtraStepWhenTheyNest) {
  // Chunking the replicated dim straight into the requested 1,4,2,3 is a LocalChunk.
  EXPECT_EQ(plan(make({4}, {Replicate()}, {10}), make({4}, {Shard(0)}, {10}, {{0, {1, 4, 2, 3}}})),
            "LocalChunk(mesh_dim=0, tensor_dim=0)");
}

// The zigzag order (ZigzagShard) changes in one Exchange; the usual moves run around it, where
// the source is replicated that Exchange only cuts, and a zigzag dim both layouts keep stays put.
TEST(RedistributePlanner, ZigzagOrderChangesInOneExchange) {
  const auto zigzag = make({4}, {ZigzagShard(1)}, {2, 10});
  EXPECT_EQ(plan(make({4}, {Shard(1)}, {2, 10}), zigzag), "Exchange()");
  EXPECT_EQ(plan(make({4}, {Shard(1)}, {2, 10}, {{1, {10, 0, 0, 0}}}), zigzag), "Exchange()");
  EXPECT_EQ(plan(zigzag, make({4}, {Shard(1)}, {2, 10}, {{1, {1, 4, 2, 3}}})), "Exchange()");
  EXPECT_EQ(plan(make({4}, {Replicate()}, {2, 10}), zigzag), "Exchange()");
  EXPECT_EQ(plan(zigzag, make({4}, {Replicate()}, {2, 10})), "Exchange() -> AllGather(mesh_dim=0, tensor_dim=1)");
  const std::string between = plan(zigzag, make({4}, {ZigzagShard(0)}, {2, 10}));  // out of the order, moved, into it
  EXPECT_EQ(between.rfind("Exchange() -> ", 0), 0u) << between;
  EXPECT_EQ(between.substr(between.size() - 14), " -> Exchange()") << between;
  const ShardSizes zz{{1, {5, 5}}};
  EXPECT_EQ(plan(make({2, 2}, {Shard(0), ZigzagShard(1)}, {4, 10}), make({2, 2}, {Replicate(), ZigzagShard(1)}, {4, 10})),
            plan(make({2, 2}, {Shard(0), Shard(1)}, {4, 10}, zz), make({2, 2}, {Replicate(), Shard(1)}, {4, 10}, zz)));
  EXPECT_EQ(plan_redistribute(make({4}, {Shard(1)}, {2, 10}), zigzag)->steps.back().after, zigzag);
  // Another unit (a flattened sequence's, [10, 3] -> [30]) is another order: one Exchange from
  // one to the other, as between two zigzag dims that no usual move relates.
  EXPECT_EQ(plan(make({4}, {ZigzagShard(0, 3)}, {30}), make({4}, {ZigzagShard(0)}, {30})), "Exchange()");
  EXPECT_EQ(plan(make({2, 2}, {Shard(1), ZigzagShard(0, 3)}, {30, 4}), make({2, 2}, {Shard(1), ZigzagShard(0)}, {30, 4})), "Exchange()");
}

TEST(RedistributePlanner, ExplainShowsTheChainOfLayouts) {
  const std::string by = peer_memory_enabled() ? " by peer memory" : " by messages";
  EXPECT_EQ(explain_redistribute(make({2, 2}, {Shard(0), Shard(0)}, {10, 6}), make({2, 2}, {Replicate(), Shard(0)}, {10, 6})),
            "[S(0), S(0)] -[Exchange()" + by + "]-> [R, S(0)] (graph search, modelled cost 0.262264 MB)");
  EXPECT_EQ(explain_redistribute(make({2, 2}, {Shard(0), Shard(1)}, {10, 6}), make({2, 2}, {Replicate(), Shard(1)}, {10, 6}), Planner::Greedy),
            "[S(0), S(1)] -[AllGather(mesh_dim=0, tensor_dim=0)" + by + "]-> [R, S(1)] (greedy, modelled cost 0.262204 MB)");
}

TEST(RedistributePlanner, PlansAreCachedBySpecPair) {
  auto a = make({2, 1, 2}, {Shard(0), Replicate(), Shard(1)}, {5, 7});
  auto b = make({2, 1, 2}, {Shard(1), Replicate(), Shard(0)}, {5, 7});
  EXPECT_EQ(plan_redistribute(a, b), plan_redistribute(a, b));
  EXPECT_EQ(plan_redistribute(a, b)->to_string(), plan_redistribute_uncached(a, b).to_string());
}

TEST(RedistributeTarget, KeepsSizesOfDimsShardedAsBeforeAndRefusesNewPartials) {
  auto src = make({4}, {Shard(0)}, {10, 8}, {{0, {1, 4, 2, 3}}});
  EXPECT_EQ(redistribute_target(src, {Shard(0)}, nullptr).sharding_of(0)->sizes, (std::vector<int64_t>{1, 4, 2, 3}));
  EXPECT_EQ(redistribute_target(src, {Shard(1)}, nullptr).sharding_of(1)->sizes, (std::vector<int64_t>{2, 2, 2, 2}));
  ShardSizes given = {{0, {3, 3, 2, 2}}};
  EXPECT_EQ(redistribute_target(src, {Shard(0)}, &given).sharding_of(0)->sizes, (std::vector<int64_t>{3, 3, 2, 2}));
  EXPECT_ERROR_CONTAINS(redistribute_target(src, {Partial()}, nullptr), "cannot make P(sum)");
  EXPECT_ERROR_CONTAINS(plan_redistribute(src, make({2, 2}, {Shard(0), Replicate()}, {10, 8})), "another mesh");
}

// ---- Every pair of layouts on 1-, 2- and 3-D meshes, both planners ----------------------------

namespace {

std::vector<std::vector<int64_t>> all_coordinates(const DeviceMesh& mesh) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t rank : mesh.ranks()) out.push_back(mesh.coordinate_of(rank));
  return out;
}

int64_t received_from(const ShardTensorSpec& before, const ShardTensorSpec& after, const std::vector<int64_t>& receiver,
                      const std::vector<std::vector<int64_t>>& senders) {
  int64_t n = 0;
  for (const auto& sender : senders)
    if (feeds(before, sender, receiver)) n += intersect(box_of(before, sender), box_of(after, receiver)).numel();
  return n;
}

// Whether one step can do what it claims with the data the ranks it talks to hold: an empty
// string, or what is wrong.
std::string check_step(const ShardTensorSpec& before, const PlannedStep& planned) {
  const ShardTensorSpec& after = planned.after;
  const DeviceMesh& mesh = before.mesh();
  const auto coords = all_coordinates(mesh);
  int64_t moved_dim = -1;
  if (auto* s = std::get_if<AllReduceStep>(&planned.step())) moved_dim = s->mesh_dim;
  if (auto* s = std::get_if<ReduceScatterStep>(&planned.step())) moved_dim = s->mesh_dim;
  if (auto* s = std::get_if<AllGatherStep>(&planned.step())) moved_dim = s->mesh_dim;
  if (auto* s = std::get_if<AllToAllStep>(&planned.step())) moved_dim = s->mesh_dim;
  if (auto* s = std::get_if<LocalChunkStep>(&planned.step())) moved_dim = s->mesh_dim;
  if (moved_dim >= 0) {
    for (int64_t m = 0; m < mesh.ndim(); ++m)
      if (m != moved_dim && !(before.placements()[m] == after.placements()[m])) return "changes another mesh dim";
  }
  for (const auto& j : coords) {
    const Box held = box_of(before, j), wanted = box_of(after, j);
    std::vector<std::vector<int64_t>> group;
    if (moved_dim >= 0) {
      for (int64_t i = 0; i < mesh.size(moved_dim); ++i) {
        group.push_back(j);
        group.back()[moved_dim] = i;
      }
    }
    if (std::holds_alternative<AllReduceStep>(planned.step())) {
      if (held.offsets != wanted.offsets || held.shape != wanted.shape) return "all-reduce changes a box";
    } else if (std::holds_alternative<LocalChunkStep>(planned.step())) {
      if (intersect(held, wanted).numel() != wanted.numel()) return "local chunk outside the held box";
    } else if (std::holds_alternative<ReduceScatterStep>(planned.step())) {
      int64_t covered = 0;
      for (const auto& p : group) {
        const Box piece = box_of(after, p);
        if (intersect(piece, held).numel() != piece.numel()) return "reduce-scatter piece outside the held box";
        covered += piece.numel();
      }
      if (covered != held.numel()) return "reduce-scatter pieces do not tile the held box";
    } else if (received_from(before, after, j, std::holds_alternative<ExchangeStep>(planned.step()) ? coords : group) != wanted.numel()) {
      return "a rank's new box is not held by the ranks it exchanges with";
    }
  }
  return "";
}

std::vector<Placement> choices(int64_t tensor_ndim) {
  std::vector<Placement> out = {Replicate(), Partial()};
  for (int64_t d = 0; d < tensor_ndim; ++d) out.push_back(Shard(d));
  return out;
}

void for_each_layout(int64_t mesh_ndim, int64_t tensor_ndim, const std::function<void(const Placements&)>& visit) {
  const auto options = choices(tensor_ndim);
  std::vector<size_t> index(mesh_ndim, 0);
  while (true) {
    Placements ps;
    for (size_t i : index) ps.push_back(options[i]);
    visit(ps);
    int64_t m = mesh_ndim - 1;
    while (m >= 0 && ++index[m] == options.size()) index[m--] = 0;
    if (m < 0) return;
  }
}

}  // namespace

TEST(RedistributePlanner, BothPlannersGiveValidPlansForEveryLayoutPairAndTheSearchIsNeverDearer) {
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> cases = {
      {{4}, {10, 3}}, {{3}, {2, 7}}, {{2, 2}, {5, 7}}, {{2, 3}, {7, 4}}, {{2, 1, 2}, {5, 3, 2}}, {{2, 2, 2}, {9, 3, 5}}};
  int pairs = 0;
  for (const auto& [mesh_shape, shape] : cases) {
    const int64_t nd = static_cast<int64_t>(shape.size());
    for_each_layout(mesh_shape.size(), nd, [&](const Placements& from) {
      for_each_layout(mesh_shape.size(), nd, [&](const Placements& to) {
        for (size_t m = 0; m < to.size(); ++m)
          if (to[m].is_partial() && !from[m].is_partial()) return;  // users cannot ask for a new Partial
        const auto source = make(mesh_shape, from, shape), target = make(mesh_shape, to, shape);
        const std::string pair = to_string(from) + " -> " + to_string(to) + " on a " + join(mesh_shape, "x") + " mesh";
        double cost[2];
        for (Planner planner : {Planner::Greedy, Planner::GraphSearch}) {
          const RedistributePlan plan = plan_redistribute_uncached(source, target, planner);
          const ShardTensorSpec* before = &source;
          for (const PlannedStep& step : plan.steps) {
            ASSERT_EQ(check_step(*before, step), "") << to_string(step.step()) << " in " << plan.to_string() << " for " << pair
                                                     << " (" << to_string(planner) << ")";
            before = &step.after;
          }
          ASSERT_EQ(*before, target) << pair;
          cost[planner == Planner::Greedy ? 0 : 1] = plan.cost();
        }
        EXPECT_LE(cost[1], cost[0] * (1 + 1e-9)) << pair;
        ++pairs;
      });
    });
  }
  EXPECT_GT(pairs, 5000);
}

// Transports are chosen from metadata alone: the mesh's device, the step's pieces and the
// process's options (redistribute/transport.h).
namespace {
ShardTensorSpec on(const std::string& device, const std::vector<int64_t>& mesh_shape, Placements ps, std::vector<int64_t> shape,
                   ShardSizes sizes = {}) {
  return ShardTensorSpec(DeviceMesh::without_comms(mesh_shape, 0, {}, device), std::move(ps), std::move(shape), c10::kFloat, sizes);
}
std::string explained(const ShardTensorSpec& a, const ShardTensorSpec& b) { return explain_redistribute(a, b, Planner::GraphSearch); }
}  // namespace

TEST(TransportChoice, CudaMeshesRunNativeCollectivesAndUnevenPiecesAnAllToAll) {
  EXPECT_EQ(explained(on("cuda", {4}, {Shard(0)}, {8, 6}), on("cuda", {4}, {Replicate()}, {8, 6})).rfind(
                "[S(0)] -[AllGather(mesh_dim=0, tensor_dim=0) by all_gather (c10d collective)]-> [R]", 0),
            0u);
  EXPECT_NE(explained(on("cuda", {4}, {Shard(0)}, {10, 6}), on("cuda", {4}, {Replicate()}, {10, 6})).find("by all_to_all (c10d collective)"),
            std::string::npos);
  EXPECT_NE(explained(on("cuda", {4}, {Partial()}, {8, 8}), on("cuda", {4}, {Shard(1)}, {8, 8})).find("by reduce_scatter (c10d collective)"),
            std::string::npos);
  EXPECT_NE(explained(on("cuda", {4}, {Partial()}, {8, 8}), on("cuda", {4}, {Replicate()}, {8, 8})).find("by all_reduce (c10d collective)"),
            std::string::npos);
  // Uneven target pieces of a reduce-scatter (10 rows over 4: 3, 3, 2, 2) travel as an all_to_all.
  EXPECT_NE(explained(on("cuda", {4}, {Partial()}, {10, 8}), on("cuda", {4}, {Shard(0)}, {10, 8})).find("by all_to_all (c10d collective)"),
            std::string::npos);
}

TEST(TransportChoice, CpuMeshesCopyThroughPeerMemoryAtEverySizeAndMessageBelowARaisedThreshold) {
  const bool peer_memory = peer_memory_enabled();
  const std::string by_memory = peer_memory ? "by peer memory" : "by messages";
  const auto gather = [](int64_t rows) { return explained(on("cpu", {4}, {Shard(0)}, {rows, 6}), on("cpu", {4}, {Replicate()}, {rows, 6})); };
  const auto reduce = [] { return explained(on("cpu", {4}, {Partial()}, {8, 6}), on("cpu", {4}, {Replicate()}, {8, 6})); };
  EXPECT_NE(gather(8).find(by_memory), std::string::npos) << gather(8);
  EXPECT_NE(gather(1024).find(by_memory), std::string::npos) << gather(1024);
  EXPECT_NE(reduce().find(peer_memory ? "by peer memory" : "by all_reduce (c10d collective)"), std::string::npos) << reduce();
  {  // Below a raised threshold: messages, and small reductions are c10d's all_reduce.
    TransportOptions raised;
    raised.peer_copy_bytes = 4096;
    const TransportOptionsScope scope(raised);
    EXPECT_NE(gather(8).find("by messages"), std::string::npos) << gather(8);
    EXPECT_NE(gather(1024).find(by_memory), std::string::npos) << gather(1024);
    EXPECT_NE(reduce().find("by all_reduce (c10d collective)"), std::string::npos) << reduce();
  }
  // A local chunk moves nothing.
  EXPECT_NE(explained(on("cpu", {4}, {Replicate()}, {8, 6}), on("cpu", {4}, {Shard(0)}, {8, 6})).find("by local"), std::string::npos);
  std::string collective;
  {
    const TransportOptionsScope scope(TransportOptions{TransportPreference::Collectives});
    collective = gather(1024);
  }
  EXPECT_NE(collective.find("by all_gather (c10d collective)"), std::string::npos) << collective;
}

TEST(TransportChoice, PerCallOptionsOverrideTheProcessDefaultsAndGetTheirOwnLoweredPlan) {
  const ShardTensorSpec from = on("cpu", {4}, {Shard(0)}, {1024, 6}), to = on("cpu", {4}, {Replicate()}, {1024, 6});
  const ResolvedTransportOptions defaults = resolve();
  const ResolvedTransportOptions messages = resolve({TransportPreference::Messages});
  const ResolvedTransportOptions collectives = resolve({TransportPreference::Collectives});
  const ResolvedTransportOptions no_memory = resolve({TransportPreference::Auto, /*peer_memory=*/false});
  EXPECT_EQ(messages.peer_memory, defaults.peer_memory);  // unset fields follow the defaults
  EXPECT_EQ(explain_redistribute(from, to, Planner::GraphSearch, messages).find("by peer memory"), std::string::npos);
  EXPECT_NE(explain_redistribute(from, to, Planner::GraphSearch, messages).find("by messages"), std::string::npos);
  EXPECT_NE(explain_redistribute(from, to, Planner::GraphSearch, collectives).find("by all_gather (c10d collective)"), std::string::npos);
  EXPECT_NE(explain_redistribute(from, to, Planner::GraphSearch, no_memory).find("by messages"), std::string::npos);
  // The public form takes unresolved options.
  EXPECT_EQ(explain_redistribute(from, to, TransportOptions{TransportPreference::Collectives}),
            explain_redistribute(from, to, Planner::GraphSearch, collectives));
  // One cached plan per options, each lowered with its own, and the same plan again for the same.
  const RedistributePlan& by_default = *plan_redistribute(from, to, Planner::GraphSearch, defaults);
  const RedistributePlan& by_messages = *plan_redistribute(from, to, Planner::GraphSearch, messages);
  EXPECT_NE(&by_default, &by_messages);
  EXPECT_EQ(&by_messages, plan_redistribute(from, to, Planner::GraphSearch, messages).get());
  EXPECT_TRUE(by_messages.lowered_with == messages);
  ASSERT_EQ(by_messages.steps.size(), 1u);
  EXPECT_EQ(by_messages.steps[0].transport.kind, TransportKind::Messages);
  EXPECT_EQ(std::string(by_messages.steps[0].transport.counted_as), "all_gather");
  // A scope's options make a new plan for a call that passes none: no stale lowering.
  std::shared_ptr<const RedistributePlan> in_scope;
  {
    const TransportOptionsScope scope(TransportOptions{TransportPreference::Collectives});
    in_scope = plan_redistribute(from, to, Planner::GraphSearch);
  }
  EXPECT_EQ(in_scope->steps[0].transport.kind, TransportKind::Collective);
  EXPECT_EQ(plan_redistribute(from, to, Planner::GraphSearch)->steps[0].transport.kind, by_default.steps[0].transport.kind);
  // The message size is a plan option too: its own plan, its steps cut to it.
  TransportOptions small_messages{TransportPreference::Messages};
  small_messages.message_bytes = 4096;
  const RedistributePlan& cut = *plan_redistribute(from, to, Planner::GraphSearch, resolve(small_messages));
  EXPECT_NE(&cut, &by_messages);
  EXPECT_EQ(cut.steps[0].transport.message_bytes, 4096);
  EXPECT_EQ(by_messages.steps[0].transport.message_bytes, kDefaultMessageBytes);
  small_messages.message_bytes = 0;
  EXPECT_THROW(resolve(small_messages), c10::Error);
}

// A halo's or a zigzag reorder's exchange of parts takes its transport from the same options as
// a redistribute step (exchange_transport), and names it as its caller counts it.
TEST(TransportChoice, ExchangesOfPartsFollowTheOptionsAsRedistributeStepsDo) {
  const DeviceMesh cpu = DeviceMesh::without_comms({4}, 0), cuda = DeviceMesh::without_comms({4}, 0, {}, "cuda");
  const auto kind = [](const DeviceMesh& mesh, int64_t bytes, bool on_cpu, const TransportOptions& options) {
    return exchange_transport(mesh, bytes, on_cpu, "zigzag", resolve(options)).kind;
  };
  TransportOptions auto_options, raised, messages{TransportPreference::Messages}, collectives{TransportPreference::Collectives},
      no_memory{TransportPreference::Auto, /*peer_memory=*/false};
  raised.peer_copy_bytes = 4096;
  EXPECT_EQ(kind(cpu, 64, true, auto_options), peer_memory_enabled() ? TransportKind::PeerMemory : TransportKind::Collective);
  EXPECT_EQ(kind(cpu, 64, true, raised), TransportKind::Collective);  // below the threshold: one all_to_all
  EXPECT_EQ(kind(cpu, 4096, true, raised), peer_memory_enabled() ? TransportKind::PeerMemory : TransportKind::Collective);
  EXPECT_EQ(kind(cpu, 1 << 20, true, messages), TransportKind::Messages);
  EXPECT_EQ(kind(cpu, 1 << 20, true, collectives), TransportKind::Collective);
  EXPECT_EQ(kind(cpu, 1 << 20, true, no_memory), TransportKind::Collective);
  EXPECT_EQ(kind(cpu, 1 << 20, false, auto_options), TransportKind::Collective);  // a CUDA tensor on a CPU mesh
  EXPECT_EQ(kind(cuda, 1 << 20, false, messages), TransportKind::Collective);
  const StepTransport how = exchange_transport(cpu, 64, true, "zigzag", resolve(messages));
  EXPECT_EQ(std::string(how.counted_as), "zigzag");
  EXPECT_EQ(std::string(how.collective), "all_to_all");
}
