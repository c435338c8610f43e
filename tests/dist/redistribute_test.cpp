// redistribute on every mesh of this world size: a property sweep over random layout pairs
// (uneven sizes, empty shards, Partial sources whose reduction is known), values and gradients
// against the single-device reference, plus hand-written cases for known traps and bad input.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>

#include "comm/agreement.h"
#include "comm/comm.h"
#include "dist/dist_fixture.h"
#include "redistribute/executor.h"
#include "redistribute/plan.h"
#include "redistribute/transport.h"

using namespace shardtensor;
using namespace shardtensor::testing;

namespace {

Placements without_partial(Placements ps) {
  for (Placement& p : ps)
    if (p.is_partial()) p = Replicate();
  return ps;
}


// Random source and target layouts on `mesh`. All Partial dims of the source share one op, so
// the reduction order does not matter; the target keeps a Partial only when the source has
// exactly one.
struct LayoutPair {
  RandomLayout source, target;
};

LayoutPair random_pair(std::mt19937& rng, const DeviceMesh& mesh) {
  LayoutPair pair;
  pair.source = random_layout(rng, mesh.shape(), /*explicit_sizes=*/rng() % 3 != 0);
  const ReduceOp op = static_cast<ReduceOp>(rng() % 5);
  int partial_dims = 0;
  for (Placement& p : pair.source.placements)
    if (p.is_partial()) {
      p = Partial(op);
      ++partial_dims;
    }
  pair.target = random_layout(rng, mesh.shape(), /*explicit_sizes=*/rng() % 2 == 0);
  pair.target.shape = pair.source.shape;
  // Re-draw target sizes for the source shape (random_layout drew its own shape).
  pair.target.sizes.clear();
  for (size_t m = 0; m < pair.target.placements.size(); ++m) {
    Placement& p = pair.target.placements[m];
    if (p.is_shard() && p.tensor_dim >= static_cast<int64_t>(pair.source.shape.size())) p = Shard(p.tensor_dim % pair.source.shape.size());
    if (p.is_partial()) p = (partial_dims == 1 && pair.source.placements[m].is_partial()) ? pair.source.placements[m] : Replicate();
  }
  if (rng() % 2 == 0) {
    for (int64_t d = 0; d < static_cast<int64_t>(pair.target.shape.size()); ++d) {
      int64_t pieces = 1;
      bool sharded = false;
      for (size_t m = 0; m < mesh.shape().size(); ++m)
        if (pair.target.placements[m].is_shard(d)) {
          pieces *= mesh.shape()[m];
          sharded = true;
        }
      if (sharded) pair.target.sizes.push_back({d, random_sizes(rng, pair.target.shape[d], pieces)});
    }
  }
  return pair;
}

at::Tensor global_values(const std::vector<int64_t>& shape, int64_t salt) {
  return iota(shape, c10::kDouble) * 0.5 + static_cast<double>(salt);
}

}  // namespace

TEST(Redistribute, RandomLayoutPairsGiveTheReferenceValuesAndGradients) {
  const uint32_t seed = 12345;
  std::mt19937 rng(seed);
  int cases = 0;
  struct BackToTheDefaultPlanner {
    ~BackToTheDefaultPlanner() { set_default_planner(Planner::GraphSearch); }
  } back_to_default;
  for (const DeviceMesh& mesh : test_meshes()) {
    for (int i = 0; i < 160; ++i, ++cases) {
      // Both planners' plans run, alternately (the planner tests check every pair's plan), over
      // the three transports.
      const Planner planner = i % 2 ? Planner::Greedy : Planner::GraphSearch;
      set_default_planner(planner);
      const auto kind = static_cast<UseTransport::Kind>((i / 2) % 3);
      UseTransport transport(kind);
      const LayoutPair pair = random_pair(rng, mesh);
      const ShardTensorSpec src(mesh, pair.source.placements, pair.source.shape, c10::kDouble, pair.source.sizes);
      const ShardTensorSpec dst(mesh, pair.target.placements, pair.target.shape, c10::kDouble, pair.target.sizes);
      const std::string trace = "seed " + std::to_string(seed) + " case " + std::to_string(cases) + " on " + mesh.to_string() +
                                ": " + src.to_string() + " -> " + dst.to_string() + ": " + explain_redistribute(src, dst) + " (transport kind " + std::to_string(kind) + ")";
      SCOPED_TRACE(trace);
      if (std::getenv("SHARDTENSOR_TEST_VERBOSE")) std::cout << trace << std::endl;
      const at::Tensor value = global_values(src.shape(), cases);
      const at::Tensor piece = reference_piece(value, mesh.shape(), src.placements(), src.shard_sizes(), mesh.coordinate());
      at::Tensor local = partial_term(piece, mesh, src.placements()).requires_grad_(true);
      at::Tensor x = from_local(local, mesh, src.placements(), ShardSizing::given(src.shard_sizes()));

      at::Tensor y = redistribute(x, dst.placements(), dst.shard_sizes());
      ASSERT_EQ(spec(y), dst);
      const at::Tensor expected = partial_term(
          reference_piece(value, mesh.shape(), dst.placements(), dst.shard_sizes(), mesh.coordinate()), mesh, dst.placements());
      ASSERT_TRUE(at::allclose(to_local(y), expected)) << to_local(y) << " vs " << expected;

      // Gradient: dL/dY = G laid out as Y's gradient; dL/dX must be G laid out as X's gradient.
      const at::Tensor g = global_values(dst.shape(), 1000 + cases);
      const Placements grad_out_ps = without_partial(dst.placements());
      at::Tensor grad_out = from_local(reference_piece(g, mesh.shape(), grad_out_ps, dst.shard_sizes(), mesh.coordinate()),
                                       mesh, grad_out_ps, ShardSizing::given(dst.shard_sizes()));
      at::Tensor grad_local = torch::autograd::grad({y}, {local}, {grad_out})[0];
      const at::Tensor expected_grad = reference_piece(g, mesh.shape(), without_partial(src.placements()), src.shard_sizes(), mesh.coordinate());
      ASSERT_FALSE(is_shard_tensor(grad_local));
      ASSERT_TRUE(at::allclose(grad_local, expected_grad)) << grad_local << " vs " << expected_grad;
    }
  }
  if (world_rank() == 0) std::cout << cases << " random redistributions checked (seed " << seed << ")" << std::endl;
}

namespace {
at::Tensor distributed(const DeviceMesh& mesh, const std::vector<int64_t>& shape, const Placements& ps, const ShardSizes& sizes = {}) {
  return distribute_tensor(iota(shape), mesh, ps, sizes);
}
const DeviceMesh* mesh_of_shape(const std::vector<int64_t>& shape) {
  for (const DeviceMesh& m : test_meshes())
    if (m.shape() == shape) return &m;
  return nullptr;
}
void expect_holds_reference(const at::Tensor& t, const std::vector<int64_t>& shape) {
  const ShardTensorSpec& s = spec(t);
  EXPECT_TRUE(at::equal(to_local(t), reference_piece(iota(shape), s.mesh().shape(), s.placements(), s.shard_sizes(), s.mesh().coordinate())))
      << s;
}
}  // namespace

TEST(Redistribute, NestedShardToInnerShardUndoesOnlyWhatItMust) {
  const DeviceMesh* mesh = mesh_of_shape({2, 2});
  if (!mesh) GTEST_SKIP() << "needs the 2x2 mesh of 4 ranks";
  at::Tensor x = distributed(*mesh, {10, 6}, {Shard(0), Shard(0)});
  CommDebugMode comms;
  at::Tensor y = redistribute(x, {Replicate(), Shard(0)});
  expect_holds_reference(y, {10, 6});
  // Rows 0:3 | 3:5 | 5:8 | 8:10 become 0:5 on (a, 0) and 5:10 on (a, 1). One exchange where
  // each rank receives only rows it lacks, so (0, 0) sends 0:3 to (1, 0); (0, 1) sends 3:5 to
  // (0, 0) and (1, 0); (1, 0) sends 5:8 to (0, 1) and (1, 1); (1, 1) sends 8:10 to (0, 1).
  EXPECT_EQ(plan_redistribute(spec(x), spec(y))->to_string(), "Exchange()");
  EXPECT_EQ(comms.total(), 1);
  const int64_t rows_sent[2][2] = {{3, 4}, {6, 2}};
  EXPECT_EQ(comms.bytes(), rows_sent[mesh->coordinate()[0]][mesh->coordinate()[1]] * 6 * static_cast<int64_t>(sizeof(float)));

  // The greedy plan gathers twice and chunks: more collectives for the same answer.
  const auto greedy = plan_redistribute(spec(x), spec(y), Planner::Greedy);
  EXPECT_EQ(greedy->to_string(), "AllGather(mesh_dim=1, tensor_dim=0) -> AllGather(mesh_dim=0, tensor_dim=0) -> LocalChunk(mesh_dim=1, tensor_dim=0)");
}

TEST(Redistribute, SwappingShardDimsAcrossMeshDims) {
  const DeviceMesh* mesh = mesh_of_shape({2, 2});
  if (!mesh) GTEST_SKIP() << "needs the 2x2 mesh of 4 ranks";
  at::Tensor x = distributed(*mesh, {7, 5}, {Shard(0), Shard(1)});
  expect_holds_reference(redistribute(x, {Shard(1), Shard(0)}), {7, 5});
}

TEST(Redistribute, UnevenShardDimChangeIsOneAllToAll) {
  const DeviceMesh& mesh = test_meshes().front();
  at::Tensor x = distributed(mesh, {7, 5}, {Shard(0)});
  at::Tensor y = redistribute(x, {Shard(1)});
  expect_holds_reference(y, {7, 5});
  EXPECT_EQ(plan_redistribute(spec(x), spec(y))->to_string(), "AllToAll(mesh_dim=0, tensor_dim=0->1)");
}

TEST(Redistribute, PartialMaxToShardIsAReduceScatter) {
  const DeviceMesh& mesh = test_meshes().front();
  at::Tensor value = iota({9, 2}, c10::kDouble);
  at::Tensor term = partial_term(value, mesh, {Partial(ReduceOp::Max)});
  at::Tensor x = from_local(term, mesh, {Partial(ReduceOp::Max)}, ShardSizing::given({}));
  at::Tensor y = redistribute(x, {Shard(0)});
  EXPECT_TRUE(at::equal(to_local(y), reference_piece(value, mesh.shape(), {Shard(0)}, {}, mesh.coordinate())));
  EXPECT_EQ(plan_redistribute(spec(x), spec(y))->to_string(), "ReduceScatter(mesh_dim=0, tensor_dim=0, max)");
}

TEST(Redistribute, LargePartialsReduceInTwoPhasesForEveryOp) {
  // Above 2 MiB the all-reduce runs as a reduce-scatter + all-gather (messages or memory
  // copies), and parts are cut into several messages: the sweep's small tensors never get there.
  const at::Tensor value = (iota({601, 1031}, c10::kDouble).remainder(97) - 48) / 8;
  for (const DeviceMesh& mesh : test_meshes()) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min, ReduceOp::Product}) {
      for (UseTransport::Kind kind : {UseTransport::kMemory, UseTransport::kMessages, UseTransport::kCollectives}) {
        UseTransport transport(kind);
        SCOPED_TRACE(mesh.to_string() + " " + to_string(op) + " transport kind " + std::to_string(kind));
        const int64_t m = mesh.ndim() - 1;
        Placements partial(mesh.ndim(), Replicate()), replicated = partial, sharded = partial;
        partial[m] = Partial(op);
        sharded[m] = Shard(0);
        at::Tensor x = from_local(partial_term(value, mesh, partial), mesh, partial, ShardSizing::given({}));
        EXPECT_TRUE(at::allclose(to_local(redistribute(x, replicated)), value));
        EXPECT_TRUE(at::allclose(to_local(redistribute(x, sharded)),
                                 reference_piece(value, mesh.shape(), sharded, {}, mesh.coordinate())));
      }
    }
  }
}

TEST(Redistribute, CollectivesTransportRunsEachStepAsOneNativeCollective) {
  // What NCCL gets, run here on Gloo: equal pieces are one all_gather or reduce_scatter (into the
  // result where the dim is the outermost, through a stack otherwise), reductions one all_reduce,
  // uneven pieces one all_to_all with split sizes (no padding).
  UseTransport transport(UseTransport::kCollectives);
  const int64_t n = world_size();
  if (n == 1) GTEST_SKIP() << "one rank runs no collective";
  const DeviceMesh& mesh = *mesh_of_shape({n});
  const std::vector<int64_t> even = {4 * n, 2 * n}, uneven = {4 * n + 1, 2 * n};
  struct Case {
    std::vector<int64_t> shape;
    Placements from, to;
    const char* collective;  // the c10d collective that runs
    const char* counted;     // what CommDebugMode calls the step, as DTensor's does
  };
  const std::vector<Case> cases = {
      {even, {Shard(0)}, {Replicate()}, "all_gather", "all_gather"},
      {even, {Shard(1)}, {Replicate()}, "all_gather", "all_gather"},
      {uneven, {Shard(0)}, {Replicate()}, "all_to_all", "all_gather"},
      {even, {Shard(0)}, {Shard(1)}, "all_to_all", "all_to_all"},
      {even, {Partial()}, {Replicate()}, "all_reduce", "all_reduce"},
      {even, {Partial()}, {Shard(0)}, "reduce_scatter", "reduce_scatter"},
      {even, {Partial(ReduceOp::Max)}, {Shard(1)}, "reduce_scatter", "reduce_scatter"},
      {uneven, {Partial(ReduceOp::Avg)}, {Shard(0)}, "all_to_all", "reduce_scatter"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(to_string(c.from) + " -> " + to_string(c.to) + " of [" + std::to_string(c.shape[0]) + ", " + std::to_string(c.shape[1]) + "]");
    const at::Tensor value = iota(c.shape, c10::kDouble);
    at::Tensor x = from_local(partial_term(reference_piece(value, mesh.shape(), c.from, {}, mesh.coordinate()), mesh, c.from), mesh,
                              c.from, ShardSizing::chunk(c.shape));
    const ShardTensorSpec target = relayout(spec(x), c.to, {});
    EXPECT_NE(explain_redistribute(spec(x), target).find(std::string("by ") + c.collective + " (c10d collective)"), std::string::npos)
        << explain_redistribute(spec(x), target);
    CommDebugMode comms;
    at::Tensor y = redistribute(x, c.to);
    EXPECT_TRUE(at::allclose(to_local(y), reference_piece(value, mesh.shape(), c.to, {}, mesh.coordinate())));
    EXPECT_EQ(comms.count(c.counted), 1) << comms.table();
    EXPECT_EQ(comms.counts().size(), 1u) << comms.table();
  }
}

TEST(Redistribute, CommDebugModeNamesGathersAndReduceScattersOnEveryTransport) {
  // DTensor's CommDebugMode calls a gather all_gather and a reduce-scatter reduce_scatter;
  // ours does too, whether peer memory, messages or a native collective moves the bytes.
  const int64_t n = world_size();
  if (n == 1) GTEST_SKIP() << "one rank runs no collective";
  const DeviceMesh& mesh = *mesh_of_shape({n});
  for (UseTransport::Kind kind : {UseTransport::kMemory, UseTransport::kMessages, UseTransport::kCollectives}) {
    SCOPED_TRACE("transport " + std::to_string(kind));
    const UseTransport transport(kind);
    const at::Tensor rows = distribute_tensor(iota({3 * n + 1, 4}, c10::kDouble), mesh, {Shard(0)});
    const at::Tensor terms = from_local(at::ones({3 * n + 1, 4}, at::kDouble), mesh, {Partial()});
    CommDebugMode comms;
    redistribute(rows, {Replicate()});
    redistribute(terms, {Shard(0)});
    redistribute(rows, {Shard(1)});
    EXPECT_EQ(comms.count("all_gather"), 1) << comms.table();
    EXPECT_EQ(comms.count("reduce_scatter"), 1) << comms.table();
    EXPECT_EQ(comms.count("all_to_all"), 1) << comms.table();
    EXPECT_EQ(comms.total(), 3) << comms.table();
  }
}

TEST(Redistribute, PartsCutIntoManyMessagesArriveWhole) {
  // 4 KiB messages: every part of these layouts travels as several, packed ones included.
  UseTransport transport(UseTransport::kMessages);
  TransportOptions small_messages;
  small_messages.message_bytes = 4096;
  const TransportOptionsScope scope(small_messages);
  for (const DeviceMesh& mesh : test_meshes()) {
    SCOPED_TRACE(mesh.to_string());
    const std::vector<int64_t> shape = {67, 45};
    Placements rows(mesh.ndim(), Replicate()), cols = rows, partial = rows;
    rows[0] = Shard(0);
    cols[mesh.ndim() - 1] = Shard(1);
    partial[mesh.ndim() - 1] = Partial();
    at::Tensor x = distributed(mesh, shape, rows);
    expect_holds_reference(redistribute(x, cols), shape);
    expect_holds_reference(redistribute(redistribute(x, cols), Placements(mesh.ndim(), Replicate())), shape);
    const at::Tensor value = iota(shape, c10::kDouble);
    at::Tensor p = from_local(partial_term(value, mesh, partial), mesh, partial, ShardSizing::given({}));
    Placements scattered = partial;
    scattered[mesh.ndim() - 1] = Shard(0);
    EXPECT_TRUE(at::allclose(to_local(redistribute(p, scattered)),
                             reference_piece(value, mesh.shape(), scattered, {}, mesh.coordinate())));
  }
}

TEST(Redistribute, SameHostGroupsCopyThroughPeerMemory) {
  // Every rank of this suite runs on one host, where peer memory must be available: a failed probe
  // here is a bug, or a machine that forbids process_vm_readv (run with SHARDTENSOR_PEER_MEMORY=0
  // there, which this test reports as a skip).
  if (!peer_memory_enabled()) GTEST_SKIP() << "SHARDTENSOR_PEER_MEMORY=0: peer memory switched off";
  UseTransport transport(UseTransport::kMemory);
  Comm& world = test_meshes().front().mesh_comm();
  if (kernel_forbids_peer_memory(world)) GTEST_SKIP() << "this machine's kernel forbids reading another rank's memory: " << why_no_peer_memory(world);
  for (const DeviceMesh& mesh : test_meshes()) {
    SCOPED_TRACE(mesh.to_string());
    const std::vector<int64_t> shape = {67, 45};
    Placements rows(mesh.ndim(), Replicate()), cols = rows;
    rows[0] = Shard(0);
    cols[mesh.ndim() - 1] = Shard(1);
    at::Tensor x = distributed(mesh, shape, rows);
    CommDebugMode comms;
    at::Tensor y = redistribute(x, cols);
    expect_holds_reference(y, shape);
    if (mesh.ndim() == 1 && mesh.size() > 1) {
      // Copies count as the all_to_all they replace, with the bytes the peers took from this
      // rank; the mailbox handshake is not a collective.
      EXPECT_EQ(comms.count("all_to_all"), 1) << comms.table();
      EXPECT_EQ(comms.counts().size(), 1u) << comms.table();
      const int64_t rows_here = spec(x).local_shape()[0], cols_here = spec(y).local_shape()[1];
      EXPECT_EQ(comms.bytes(), rows_here * (shape[1] - cols_here) * to_local(x).element_size()) << comms.table();
    }
    // Rows of 2000 floats: parts in long stretches go without staging, written by their holder
    // (contiguous in the receiver) one way and read by their receiver the other way.
    const std::vector<int64_t> wide = {40, 2000};
    const at::Tensor wide_rows = distributed(mesh, wide, rows);
    const int64_t written_before = peer_parts_written();
    at::Tensor w = redistribute(wide_rows, cols);
    expect_holds_reference(w, wide);
    const int64_t written_there = peer_parts_written() - written_before;
    expect_holds_reference(redistribute(w, rows), wide);
    if (mesh.ndim() == 1) {
      // Every rank holds rows: it writes its part into each peer, and reads every part back;
      // a group that reads the peers' shared arenas in place never writes (arena.h).
      const PeerMemory* memory = peer_memory_of(mesh.comm(0));
      const int64_t writes = memory && memory->reads_in_place() ? 0 : mesh.size() - 1;
      EXPECT_EQ(written_there, writes);
      EXPECT_EQ(peer_parts_written() - written_before, writes);
    }
    for (int64_t m = 0; m < mesh.ndim(); ++m)
      if (mesh.size(m) > 1) EXPECT_NE(peer_memory_of(mesh.comm(m)), nullptr) << why_no_peer_memory(mesh.comm(m));
    if (mesh.size() > 1) EXPECT_NE(peer_memory_of(mesh.mesh_comm()), nullptr) << why_no_peer_memory(mesh.mesh_comm());
  }
}

TEST(Redistribute, AFailedPeerCopyFallsBackToMessagesOnEveryRank) {
  if (world_size() == 1) GTEST_SKIP() << "one rank copies from no peer";
  if (!peer_memory_enabled()) GTEST_SKIP() << "SHARDTENSOR_PEER_MEMORY=0: peer memory switched off";
  const DeviceMesh mesh = DeviceMesh::create({world_size()});  // its own groups: they stop copying through memory for good
  UseTransport transport(UseTransport::kMemory);
  if (kernel_forbids_peer_memory(mesh.comm(0))) GTEST_SKIP() << "this machine's kernel forbids reading another rank's memory";
  const std::vector<int64_t> shape = {67, 45};
  at::Tensor x = distributed(mesh, shape, {Shard(0)});
  expect_holds_reference(redistribute(x, {Shard(1)}), shape);
  ASSERT_NE(peer_memory_of(mesh.comm(0)), nullptr) << why_no_peer_memory(mesh.comm(0));

  // Rank 0's next copy fails: every rank learns it in the closing handshake and the same
  // exchange is done again by messages, on every rank.
  if (world_rank() == 0) fail_next_peer_copies(1);
  at::Tensor y = redistribute(x, {Shard(1)});
  expect_holds_reference(y, shape);
  EXPECT_EQ(peer_memory_of(mesh.comm(0)), nullptr);
  EXPECT_EQ(why_no_peer_memory(mesh.comm(0)),
            world_rank() == 0 ? "a copy failed: failed on purpose by fail_next_peer_copies" : "another member's copy failed");
  expect_holds_reference(redistribute(y, {Shard(0)}), shape);  // and the group goes on by messages
}

TEST(Redistribute, MeshesWhoseRanksArePermuted) {
  // Messages go to group ranks; mesh coordinates and global ranks differ here.
  std::vector<int64_t> reversed;
  for (int64_t r = world_size() - 1; r >= 0; --r) reversed.push_back(r);
  std::vector<DeviceMesh> meshes = {DeviceMesh::from_ranks({world_size()}, reversed)};
  if (world_size() == 4) meshes.push_back(DeviceMesh::from_ranks({2, 2}, {3, 1, 2, 0}));
  for (const DeviceMesh& mesh : meshes) {
    SCOPED_TRACE(mesh.to_string());
    const std::vector<int64_t> shape = {11, 7};
    Placements rows(mesh.ndim(), Shard(0)), cols(mesh.ndim(), Replicate()), replicated = cols;
    cols.back() = Shard(1);
    at::Tensor x = distributed(mesh, shape, rows);
    expect_holds_reference(redistribute(x, cols), shape);
    expect_holds_reference(redistribute(x, replicated), shape);
    Placements partial = replicated;
    partial.back() = Partial();
    const at::Tensor value = iota({700, 600}, c10::kDouble);  // 3.2 MiB: the message all-reduce
    at::Tensor p = from_local(partial_term(value, mesh, partial), mesh, partial, ShardSizing::given({}));
    EXPECT_TRUE(at::allclose(to_local(redistribute(p, replicated)), value));
  }
}

TEST(Redistribute, RebalancingExplicitSizesIsOneCall) {
  if (world_size() != 4) GTEST_SKIP() << "the 1,4,2,3 -> 3,3,2,2 case is for 4 ranks; the sweep covers others";
  const DeviceMesh& mesh = test_meshes().front();
  at::Tensor x = distributed(mesh, {10, 3}, {Shard(0)}, {{0, {1, 4, 2, 3}}});
  at::Tensor y = redistribute(x, {Shard(0)}, {{0, {3, 3, 2, 2}}});
  EXPECT_EQ(spec(y).sharding_of(0)->sizes, (std::vector<int64_t>{3, 3, 2, 2}));
  expect_holds_reference(y, {10, 3});
  EXPECT_EQ(plan_redistribute(spec(x), spec(y))->to_string().rfind("Exchange", 0), 0u);
}

TEST(Redistribute, ReplicateToShardNeedsNoCommunicationAndSameSpecNoWork) {
  const DeviceMesh& mesh = test_meshes().front();
  at::Tensor x = distributed(mesh, {5, 4}, {Replicate()});
  at::Tensor y = redistribute(x, {Shard(1)});
  expect_holds_reference(y, {5, 4});
  EXPECT_EQ(plan_redistribute(spec(x), spec(y))->to_string(), "LocalChunk(mesh_dim=0, tensor_dim=1)");
  EXPECT_TRUE(plan_redistribute(spec(y), spec(y))->empty());
  at::Tensor same = redistribute(y, {Shard(1)});
  EXPECT_FALSE(to_local(same).is_same(to_local(y)));  // always a fresh tensor
  EXPECT_EQ(explain_redistribute(spec(x), spec(y)).rfind("[R] -[LocalChunk(mesh_dim=0, tensor_dim=1) by local]-> [S(1)] (graph search", 0), 0u);
}

TEST(Redistribute, PerCallTransportOptionsMoveTheSameValuesAndGradients) {
  // Uneven rows (7 over up to 4 ranks, empty pieces at 4) to columns and back, forward and
  // backward, under each per-call transport; the plan each call runs is the one explain shows.
  struct Choice {
    TransportOptions options;
    const char* transport;  // what explain_redistribute names for the gather-free exchange
  };
  // Options that leave the transport unset take the process's default (SHARDTENSOR_TRANSPORT).
  const TransportPreference preference = process_transport_defaults().preference;
  const bool memory = peer_memory_enabled() && preference == TransportPreference::Auto;
  const char* by_default = preference == TransportPreference::Collectives ? "by all_to_all (c10d collective)" : "by messages";
  TransportOptions by_copies;  // peer memory by cross-memory attach, where arenas would be read in place
  by_copies.shared_arena = false;
  const std::vector<Choice> choices = {
      {TransportOptions{}, !memory ? by_default : own_arena().base != 0 ? "by shared arena" : "by peer memory"},
      {by_copies, memory ? "by peer memory" : by_default},
      {TransportOptions{TransportPreference::Messages}, "by messages"},
      {TransportOptions{TransportPreference::Collectives}, "by all_to_all (c10d collective)"},
      {TransportOptions{TransportPreference::Auto, /*peer_memory=*/false}, "by messages"},
  };
  const std::vector<int64_t> shape = {7, 5};
  for (const DeviceMesh& mesh : test_meshes()) {
    if (mesh.ndim() != 1) continue;
    for (const Choice& c : choices) {
      SCOPED_TRACE(mesh.to_string() + " " + c.transport);
      at::Tensor local = reference_piece(iota(shape), mesh.shape(), {Shard(0)}, {}, mesh.coordinate()).requires_grad_(true);
      at::Tensor x = from_local(local, mesh, {Shard(0)}, ShardSizing::chunk(shape));
      if (mesh.size() > 1) {
        const std::string plan = explain_redistribute(spec(x), relayout(spec(x), {Shard(1)}, {}), c.options);
        EXPECT_NE(plan.find(c.transport), std::string::npos) << plan;
      }
      at::Tensor y = redistribute(x, {Shard(1)}, c.options);
      expect_holds_reference(y, shape);
      at::Tensor g = iota(shape) * 3 + 1;
      at::Tensor g_piece = reference_piece(g, mesh.shape(), {Shard(1)}, {}, mesh.coordinate());
      at::Tensor grad = torch::autograd::grad({to_local(y, std::nullopt)}, {local}, {g_piece})[0];
      EXPECT_TRUE(at::equal(grad, reference_piece(g, mesh.shape(), {Shard(0)}, {}, mesh.coordinate())));
    }
  }
}

TEST(Redistribute, FullTensorGathersAndIsDifferentiable) {
  for (const DeviceMesh& mesh : test_meshes()) {
    Placements ps(mesh.ndim(), Replicate());
    ps.back() = Shard(0);
    at::Tensor local = reference_piece(iota({6, 2}), mesh.shape(), ps, {}, mesh.coordinate()).requires_grad_(true);
    at::Tensor x = from_local(local, mesh, ps, ShardSizing::chunk({6, 2}));
    at::Tensor full = full_tensor(x);
    EXPECT_FALSE(is_shard_tensor(full));
    EXPECT_TRUE(at::equal(full, iota({6, 2})));
    at::Tensor g = iota({6, 2}) + 1;
    at::Tensor grad = torch::autograd::grad({full}, {local}, {g})[0];
    EXPECT_TRUE(at::equal(grad, reference_piece(g, mesh.shape(), ps, {}, mesh.coordinate())));
  }
}

TEST(Redistribute, DistributeTensorTakesCoordinateZerosValues) {
  for (const DeviceMesh& mesh : test_meshes()) {
    for (UseTransport::Kind kind : {UseTransport::kMemory, UseTransport::kMessages}) {
      UseTransport transport(kind);
      at::Tensor mine = iota({4, 3}) + (world_rank() == 0 ? 0 : 100);  // only rank 0's values count
      Placements ps(mesh.ndim(), Replicate());
      ps.front() = Shard(1);
      at::Tensor t = distribute_tensor(mine, mesh, ps);
      expect_holds_reference(t, {4, 3});
      at::Tensor leaf = distribute_tensor(iota({4, 3}).requires_grad_(true), mesh, ps);
      EXPECT_TRUE(leaf.requires_grad());
      EXPECT_TRUE(leaf.is_leaf());
    }
  }
}

// DTensor's src_data_rank: the group rank on every mesh dim whose tensor is the source, or none
// (each rank's own tensor, nothing moved).
TEST(Redistribute, DistributeTensorTakesTheSourceRanksValuesOrEachRanksOwn) {
  for (const DeviceMesh& mesh : test_meshes()) {
    const int64_t k = *std::min_element(mesh.shape().begin(), mesh.shape().end()) - 1;  // a rank on every mesh dim
    const int64_t source = mesh.rank_at(std::vector<int64_t>(mesh.ndim(), k));
    at::manual_seed(17);
    const at::Tensor global = at::randn({5, 3}, at::kDouble);
    const at::Tensor mine = global + 100 * world_rank();  // each rank's own values
    Placements ps(mesh.ndim(), Replicate());
    ps.front() = Shard(0);
    ps.back() = mesh.ndim() > 1 ? Partial(ReduceOp::Sum) : ps.back();
    SCOPED_TRACE(mesh.to_string() + " " + to_string(ps) + " from coordinate " + std::to_string(k));
    const at::Tensor from_source = distribute_tensor(mine, mesh, ps, std::nullopt, k);
    EXPECT_TRUE(at::allclose(full_tensor(from_source), global + 100 * source));
    // None: this rank's piece of its own tensor. No data moves, so no collective runs, not even
    // an agreement check (as DTensor's): a layout the ranks disagree on is caught by the first
    // exchange that uses it.
    Placements sharded(mesh.ndim(), Shard(0));
    at::Tensor own;
    {
      CommDebugMode comms;
      own = distribute_tensor(mine, mesh, sharded, std::nullopt, std::nullopt);
      EXPECT_EQ(comms.total(), 0) << comms.table();
    }
    const ShardTensorSpec& s = spec(own);
    EXPECT_TRUE(at::equal(to_local(own), mine.narrow(0, s.local_offsets()[0], s.local_shape()[0])));
    EXPECT_ERROR_CONTAINS(distribute_tensor(mine, mesh, ps, std::nullopt, k + 1), "src_data_rank=" + std::to_string(k + 1),
                          "is not a rank of mesh dim");
    if (k > 0)  // two valid sources, one of them on rank 0 only
      EXPECT_ERROR_CONTAINS(distribute_tensor(mine, mesh, ps, std::nullopt, world_rank() == 0 ? k : 0),
                            "the ranks passed different tensors or layouts", "src_data_rank");
  }
}

TEST(Redistribute, BadTargetsRaiseOnEveryRankBeforeCommunicating) {
  const DeviceMesh& mesh = test_meshes().front();
  at::Tensor x = distributed(mesh, {6, 4}, {Shard(0)});
  EXPECT_ERROR_CONTAINS(redistribute(x, {Partial()}), "cannot make P(sum)", "Partial placements only come out of operators");
  EXPECT_ERROR_CONTAINS(redistribute(x, {Shard(0), Replicate()}), "2 placements", "one placement per mesh dim");
  EXPECT_ERROR_CONTAINS(redistribute(x, {Shard(2)}), "Shard(2)", "out of range");
  EXPECT_ERROR_CONTAINS(redistribute(x, {Shard(0)}, {{0, std::vector<int64_t>(world_size(), 7)}}), "add up to", "global size 6");
  if (test_meshes().size() > 1) {
    const DeviceMesh& other = test_meshes()[1];
    EXPECT_ERROR_CONTAINS(redistribute(x, other, Placements(other.ndim(), Replicate())), "redistributing to another mesh is not supported");
  }
  EXPECT_ERROR_CONTAINS(redistribute(at::zeros({2}), {Replicate()}), "expects a ShardTensor");
}
