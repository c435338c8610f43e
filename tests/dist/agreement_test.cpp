// Ranks that disagree (#16, item 2): arguments each rank reads alone (from_local's sizes,
// distribute_tensor's tensor, redistribute targets, seeds) differ between ranks by a user's
// mistake. Every rank must raise, within the timeout, before any byte moves: never a Gloo
// abort, a hang, or values that are silently wrong.
#include <ATen/ATen.h>

#include <chrono>

#include "comm/agreement.h"
#include "comm/c10d_comm.h"
#include "comm/fingerprint.h"
#include "dist/dist_fixture.h"

using namespace shardtensor;
using namespace shardtensor::testing;

namespace {

#define SKIP_ON_ONE_RANK() \
  if (world_size() == 1) GTEST_SKIP() << "needs two ranks to disagree"

const DeviceMesh& line() { return test_meshes().front(); }

// A mesh of its own with a short timeout, for disagreements found by the transports: the group
// they were found on is left unusable ("create a new mesh").
DeviceMesh fresh_line() {
  MeshOptions options;
  options.timeout = std::chrono::seconds(10);
  return DeviceMesh::create({world_size()}, {}, options);
}

bool last_rank() { return world_rank() == world_size() - 1; }
std::string last_rank_name() { return "global rank " + std::to_string(world_size() - 1); }

}  // namespace

TEST(RankDisagreement, FromLocalChunkOnPiecesThatAreNotChunkShaped) {
  SKIP_ON_ONE_RANK();
  // Chunk sizing without a global shape: each rank multiplies its own rows by the mesh size, and
  // the last rank, holding one row less, works out a different global shape.
  const int64_t rows = last_rank() ? 2 : 3;
  EXPECT_ERROR_CONTAINS(from_local(at::zeros({rows, 4}), line(), {Shard(0)}), "different layouts", "global rank 0",
                        last_rank_name(), "ShardSizing::infer()");
  // With the global shape every rank agrees on the layout, but rank 0 holds a piece that is not
  // its chunk: it is the one that finds out, and every rank raises its error.
  const int64_t mine = chunk_sizes(10, world_size())[world_rank()] + (world_rank() == 0 ? 1 : 0);
  EXPECT_ERROR_CONTAINS(from_local(at::zeros({mine}), line(), {Shard(0)}, ShardSizing::chunk({10})),
                        "global rank 0 at mesh coordinate", "passed a local tensor of shape");
  // The mesh is still usable: nothing moved and no rank was left waiting.
  EXPECT_NO_THROW(from_local(at::zeros({3, 4}), line(), {Shard(0)}));
}

TEST(RankDisagreement, FromLocalExplicitSizesThatDifferBetweenRanks) {
  SKIP_ON_ONE_RANK();
  // Every rank's piece matches its own table, but rank 0 was given other tables.
  std::vector<int64_t> sizes(world_size(), 2);
  if (world_rank() == 0) {
    sizes[0] = 3;
    sizes[1] = 1;
  }
  const ShardSizing sizing = ShardSizing::given({{0, sizes}});
  EXPECT_ERROR_CONTAINS(from_local(at::zeros({sizes[world_rank()], 2}), line(), {Shard(0)}, sizing), "different layouts",
                        "dim 0 sizes [3, 1", "dim 0 sizes [2, 2");
}

TEST(RankDisagreement, FromLocalWithoutTheCheckTrustsEachRank) {
  // SHARDTENSOR_CHECK_AGREEMENT=0: no gather; only a rank holding a wrong piece can know.
  set_agreement_checks_enabled(false);
  const int64_t mine = chunk_sizes(10, world_size())[world_rank()] + (last_rank() ? 1 : 0);
  {
    CommDebugMode comms;
    if (last_rank()) {
      EXPECT_ERROR_CONTAINS(from_local(at::zeros({mine}), line(), {Shard(0)}, ShardSizing::chunk({10})),
                            "passed a local tensor of shape");
    } else {
      EXPECT_NO_THROW(from_local(at::zeros({mine}), line(), {Shard(0)}, ShardSizing::chunk({10})));
    }
    EXPECT_EQ(comms.total(), 0) << comms.table();
  }
  set_agreement_checks_enabled(true);
  CommDebugMode comms;
  from_local(at::zeros({chunk_sizes(10, world_size())[world_rank()]}), line(), {Shard(0)}, ShardSizing::chunk({10}));
  EXPECT_EQ(comms.total(), world_size() > 1 ? 1 : 0) << "one small all-gather checks the layout\n" << comms.table();
}

TEST(RankDisagreement, FromLocalRunCheckComparesRequiresGradAndStrides) {
  SKIP_ON_ONE_RANK();
  at::Tensor piece = at::zeros({3, 4});
  if (last_rank()) piece.requires_grad_(true);
  EXPECT_ERROR_CONTAINS(from_local(piece, line(), {Shard(0)}, ShardSizing::chunk(), /*run_check=*/true), "requires_grad",
                        last_rank_name());
  piece.requires_grad_(false);
  // The same shape, but the last rank's piece is a transposed view: its dims lie the other
  // way round in memory.
  at::Tensor transposed = last_rank() ? at::zeros({4, 3}).t() : at::zeros({3, 4});
  EXPECT_ERROR_CONTAINS(from_local(transposed, line(), {Shard(0)}, ShardSizing::chunk(), /*run_check=*/true),
                        "different orders in memory", last_rank_name());
  EXPECT_NO_THROW(from_local(transposed.contiguous(), line(), {Shard(0)}, ShardSizing::chunk(), /*run_check=*/true));
}

TEST(RankDisagreement, DistributeTensorGivenAnotherShapeOrDtypeOnOneRank) {
  SKIP_ON_ONE_RANK();
  for (const DeviceMesh& mesh : test_meshes()) {
    Placements ps(mesh.ndim(), Replicate());
    ps[0] = Shard(0);
    const at::Tensor other_shape = at::rand({last_rank() ? 7 : 8, 3});
    EXPECT_ERROR_CONTAINS(distribute_tensor(other_shape, mesh, ps), "different tensors or layouts", "shape [8, 3]",
                          "shape [7, 3]");
    const at::Tensor other_dtype = at::rand({8, 3}, last_rank() ? at::kDouble : at::kFloat);
    EXPECT_ERROR_CONTAINS(distribute_tensor(other_dtype, mesh, ps), "different tensors or layouts", "Double");
    at::Tensor grads = at::rand({8, 3});
    if (last_rank()) grads.requires_grad_(true);
    EXPECT_ERROR_CONTAINS(distribute_tensor(grads, mesh, ps), "differ in requires_grad");
    // Nothing moved: the mesh still distributes.
    const at::Tensor same = at::arange(24, at::kFloat).view({8, 3});
    EXPECT_TRUE(at::equal(full_tensor(distribute_tensor(same, mesh, ps)), same));
  }
}

TEST(RankDisagreement, RedistributeToDifferentTargetsRaisesOnEveryRank) {
  SKIP_ON_ONE_RANK();
  if (!message_fingerprints_enabled()) GTEST_SKIP() << "SHARDTENSOR_FINGERPRINT=0: the transports do not compare operations";
  std::vector<int64_t> failed_comms;  // the communicators of the meshes whose exchanges failed
  for (UseTransport::Kind kind : {UseTransport::kMemory, UseTransport::kMessages, UseTransport::kCollectives}) {
    SCOPED_TRACE("transport " + std::to_string(kind));
    const UseTransport transport(kind);
    {
      // The last rank gathers, the others swap dims.
      DeviceMesh mesh = fresh_line();
      failed_comms.push_back(mesh.comm(0).number());
      at::Tensor x = distribute_tensor(at::rand({8, 8}), mesh, {Shard(0)});
      const auto start = std::chrono::steady_clock::now();
      EXPECT_ERROR_CONTAINS(redistribute(x, last_rank() ? Placements{Replicate()} : Placements{Shard(1)}), "shardtensor");
      EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30.0);
    }
    {
      // The same placements, but rank 0 was given other explicit sizes; every rank moves rows.
      DeviceMesh mesh = fresh_line();
      failed_comms.push_back(mesh.comm(0).number());
      at::Tensor x = distribute_tensor(at::rand({4 * world_size(), 3}), mesh, {Shard(0)});
      std::vector<int64_t> sizes(world_size(), 4);
      sizes[0] = world_rank() == 0 ? 5 : 3;
      sizes[1] = world_rank() == 0 ? 3 : 5;
      EXPECT_ERROR_CONTAINS(redistribute(x, {Shard(0)}, ShardSizes{{0, sizes}}), "shardtensor");
    }
    {
      // Rank 0 moves rows; for the others the target is where they are, and they return at
      // once. Their next collective on the mesh is where they raise, and rank 0 with them: no
      // byte of either moves.
      DeviceMesh mesh = fresh_line();
      failed_comms.push_back(mesh.comm(0).number());
      at::Tensor x = distribute_tensor(at::rand({4 * world_size(), 3}), mesh, {Shard(0)});
      std::vector<int64_t> sizes(world_size(), 4);
      if (world_rank() == 0) {
        sizes[0] = 5;
        sizes[1] = 3;
      }
      if (world_rank() == 0) {
        EXPECT_ERROR_CONTAINS(redistribute(x, {Shard(0)}, ShardSizes{{0, sizes}}), "shardtensor");
      } else {
        at::Tensor same = redistribute(x, {Shard(0)}, ShardSizes{{0, sizes}});
        EXPECT_ERROR_CONTAINS(full_tensor(same), "shardtensor");
      }
    }
  }
  // The meshes above are dropped, and their groups broke: the layout caches, which held the
  // meshes, must let go of them (kept, Gloo's event loop would go on polling the abandoned
  // exchanges, about 0.6 cores a rank). They do at their first lookup after a group broke.
  DeviceMesh next = fresh_line();
  EXPECT_EQ(full_tensor(distribute_tensor(at::ones({world_size(), 2}), next, {Shard(0)})).sum().item<double>(), 2.0 * world_size());
  for (int64_t number : failed_comms)
    EXPECT_EQ(c10d_comm_numbered(number), nullptr) << "a mesh over a broken group is still alive (communicator " << number << ")";
}

TEST(RankDisagreement, ManualSeedThatDiffersBetweenRanks) {
  SKIP_ON_ONE_RANK();
  const FactoryLayout replicated{{6, 5}, line(), {Replicate()}};
  // A rank-dependent seed, found at the first draw on the mesh.
  manual_seed(100 + world_rank());
  EXPECT_ERROR_CONTAINS(rand(replicated), "different seeds", "global rank 0 has 100", "has 101");
  // manual_seed(seed, mesh) checks at once.
  EXPECT_ERROR_CONTAINS(manual_seed(200 + world_rank(), line()), "different seeds");
  // The same seed: one check per mesh after each manual_seed, none after manual_seed(seed, mesh).
  manual_seed(7);
  at::Tensor a;
  {
    CommDebugMode comms;
    a = rand(replicated);
    EXPECT_EQ(comms.total(), 1) << comms.table();
    rand(replicated);
    EXPECT_EQ(comms.total(), 1) << "the second draw needs no check\n" << comms.table();
  }
  // Every rank holds the same values.
  const at::Tensor mine = to_local(a);
  const at::Tensor everyones = full_tensor(from_local(mine.unsqueeze(0), line(), {Shard(0)}));
  for (int64_t r = 0; r < world_size(); ++r) EXPECT_TRUE(at::equal(everyones[r], mine)) << "rank " << r;
  manual_seed(7, line());
  CommDebugMode comms;
  rand(replicated);
  EXPECT_EQ(comms.total(), 0) << comms.table();
}

TEST(RankDisagreement, AFailureOnOneRankIsTheSameKindOfErrorOnEveryRank) {
  SKIP_ON_ONE_RANK();
  // Python maps c10::ValueError to ValueError: a rank that did not fail raises the same kind.
  const std::exception_ptr failure = failure_of([] { TORCH_CHECK_VALUE(!last_rank(), "the last rank's value is wrong"); });
  const AgreementRows rows = gather_rows(line(), {failure_code(failure)});
  try {
    raise_where_any_rank_failed(line(), rows, 0, failure);
    ADD_FAILURE() << "expected a ValueError";
  } catch (const c10::ValueError& e) {
    const std::string message = e.what_without_backtrace();
    EXPECT_NE(message.find("the last rank's value is wrong"), std::string::npos) << message;
    if (!last_rank()) EXPECT_NE(message.find("raised on " + last_rank_name()), std::string::npos) << message;
  }
  // No failure anywhere: no error, and no second gather.
  CommDebugMode comms;
  raise_where_any_rank_failed(line(), gather_rows(line(), {0}), 0, nullptr);
  EXPECT_EQ(comms.total(), 1) << comms.table();
}

TEST(ArgumentChecks, DistributeTensorKeepsRequiresGradOfALeafAndRefusesANonLeaf) {
  const at::Tensor leaf = at::rand({6, 2}).requires_grad_(true);
  const at::Tensor x = distribute_tensor(leaf, line(), {Shard(0)});
  EXPECT_TRUE(x.requires_grad());
  EXPECT_TRUE(x.is_leaf());
  EXPECT_ERROR_CONTAINS(distribute_tensor(leaf * 2, line(), {Shard(0)}), "expects a leaf tensor", ".detach()");
  EXPECT_FALSE(distribute_tensor(leaf.detach() * 2, line(), {Shard(0)}).requires_grad());
  if (world_size() > 1) {
    // A non-leaf on one rank only: every rank raises its error, the others naming that rank.
    const at::Tensor mine = last_rank() ? leaf * 2 : leaf;
    EXPECT_ERROR_CONTAINS(distribute_tensor(mine, line(), {Shard(0)}), "expects a leaf tensor",
                          last_rank() ? "" : "raised on " + last_rank_name());
  }
}

TEST(ArgumentChecks, ViewOfAnEmptyTensorWithAnAmbiguousSizeRaisesAsOnOneProcess) {
  const at::Tensor empty = distribute_tensor(at::zeros({0, 4}), line(), {Shard(1)});
  EXPECT_THROW(at::zeros({0, 4}).view({0, -1}), c10::Error);  // the oracle raises too
  EXPECT_ERROR_CONTAINS(empty.view({0, -1}), "can be any value and is ambiguous");
  EXPECT_ERROR_CONTAINS(empty.view({-2, 4}), "invalid shape dimension -2");
  EXPECT_EQ(empty.view({-1, 4}).sizes(), at::IntArrayRef({0, 4}));
  EXPECT_EQ(empty.view({4, 0}).sizes(), at::IntArrayRef({4, 0}));
}

TEST(ArgumentChecks, ForeachOverTensorsOnDifferentMeshesGoesPairByPair) {
  // Two meshes over the same ranks: the lists pair a tensor on one with a tensor on the other.
  const DeviceMesh& first = test_meshes().front();
  const DeviceMesh& second = test_meshes().back();
  const at::Tensor a = at::arange(12, at::kFloat).view({4, 3}), b = at::arange(20, at::kFloat).view({5, 4});
  Placements on_second(second.ndim(), Replicate());
  on_second[0] = Shard(0);
  std::vector<at::Tensor> xs{distribute_tensor(a, first, {Shard(0)}), distribute_tensor(b, second, on_second)};
  std::vector<at::Tensor> ys{distribute_tensor(a, first, {Replicate()}), distribute_tensor(b, second, on_second)};
  const std::vector<at::Tensor> sums = at::_foreach_add(xs, ys);
  EXPECT_TRUE(at::equal(full_tensor(sums[0]), a * 2));
  EXPECT_TRUE(at::equal(full_tensor(sums[1]), b * 2));
  EXPECT_EQ(spec(sums[1]).mesh(), second);
  if (first == second) return;
  // A pair whose two tensors live on different meshes raises, naming both.
  std::vector<at::Tensor> crossed{ys[0], distribute_tensor(b, first, {Shard(0)})};
  EXPECT_ERROR_CONTAINS(at::_foreach_add(xs, crossed), "mesh");
}
