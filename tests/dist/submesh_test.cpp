// A mesh over a subset of the world's ranks (#16 item 8). Its members compute the
// single-device result as on any mesh; a rank outside it holds no shard: its pieces are empty,
// its ops keep the global shapes and placements without running or communicating, and what
// must read values or communicate raises, naming the mesh. The members leave out global rank 0
// and list the others in reverse, so coordinates and global ranks differ; at world size 1 the
// mesh is the whole world.
#include <ATen/ATen.h>

#include "dist/dist_fixture.h"

namespace shardtensor::testing {
namespace {

std::vector<int64_t> members() {
  std::vector<int64_t> ranks;
  for (int64_t r = world_size() - 1; r >= (world_size() == 1 ? 0 : 1); --r) ranks.push_back(r);
  return ranks;
}

// Created on first use, by every rank in the same order (mesh creation counts meshes).
const DeviceMesh& sub_mesh_1d() {
  static const DeviceMesh mesh = DeviceMesh::from_ranks({static_cast<int64_t>(members().size())}, members());
  return mesh;
}

const DeviceMesh& sub_mesh_2d() {
  static const DeviceMesh mesh = DeviceMesh::from_ranks({1, static_cast<int64_t>(members().size())}, members(), {"a", "b"});
  return mesh;
}

// Rows over the mesh's last dim: uneven, the last piece empty where there are two or more.
ShardSizes uneven_rows(const DeviceMesh& mesh, int64_t rows) {
  const int64_t n = mesh.shape().back();
  std::vector<int64_t> sizes(n, 0);
  for (int64_t r = 0; r < std::max<int64_t>(n - 1, 1); ++r) sizes[r] = rows / std::max<int64_t>(n - 1, 1) + (r < rows % std::max<int64_t>(n - 1, 1) ? 1 : 0);
  return {{0, sizes}};
}

Placements rows_on_last_dim(const DeviceMesh& mesh) {
  Placements ps(mesh.ndim(), Replicate());
  ps.back() = Shard(0);
  return ps;
}

bool is_empty_piece(const at::Tensor& t) {
  const at::Tensor& local = to_local(t.detach());
  return local.dim() == t.dim() && (t.dim() == 0 || local.numel() == 0);
}

}  // namespace

TEST(SubMesh, MembersMatchOneProcessAndOutsidersHoldEmptyPiecesWithoutCommunicating) {
  at::manual_seed(16);  // the same reference on every rank
  for (const DeviceMesh* mesh : {&sub_mesh_1d(), &sub_mesh_2d()}) {
    const bool member = mesh->includes_this_rank();
    EXPECT_EQ(member, world_size() == 1 || world_rank() != 0);
    const at::Tensor g = at::randn({7, 5}, at::kDouble), wg = at::randn({5, 3}, at::kDouble);
    const at::Tensor gr = g.clone().requires_grad_(true), wr = wg.clone().requires_grad_(true);
    const at::Tensor reference = (at::softmax(at::mm(gr, wr), 1) * 2 + 1).sum(0);
    reference.sum().backward();

    CommDebugMode comms;
    const at::Tensor x = distribute_tensor(g.clone().requires_grad_(true), *mesh, rows_on_last_dim(*mesh), uneven_rows(*mesh, 7));
    const at::Tensor w = distribute_tensor(wg.clone().requires_grad_(true), *mesh, Placements(mesh->ndim(), Replicate()));
    const at::Tensor y = (at::softmax(at::mm(x, w), 1) * 2 + 1).sum(0);
    y.sum().backward();
    const at::Tensor whole = full_tensor(y);

    EXPECT_EQ(y.sizes(), reference.sizes()) << *mesh;
    ASSERT_TRUE(x.grad().defined() && w.grad().defined()) << *mesh;
    EXPECT_EQ(x.grad().sizes(), g.sizes());
    EXPECT_EQ(spec(x.grad()).placements(), spec(x).placements()) << spec(x.grad());
    if (member) {
      EXPECT_TRUE(at::allclose(whole, reference.detach())) << *mesh;
      EXPECT_TRUE(at::allclose(full_tensor(x.grad()), gr.grad())) << *mesh;
      EXPECT_TRUE(at::allclose(full_tensor(w.grad()), wr.grad())) << *mesh;
    } else {
      EXPECT_TRUE(is_empty_piece(x) && is_empty_piece(y) && is_empty_piece(x.grad()) && is_empty_piece(w.grad())) << *mesh;
      EXPECT_EQ(whole.numel(), 0);
      EXPECT_EQ(comms.total(), 0) << "a rank outside " << *mesh << " communicated";
    }
  }
}

// Spatial ops lower their halo exchanges when their propagation is cached, on every rank:
// outsiders too, which have no place in the halo and must neither raise nor communicate.
TEST(SubMesh, SpatialOpsMatchOneProcessOnMembersAndLowerNothingOutside) {
  at::manual_seed(17);
  const DeviceMesh& mesh = sub_mesh_1d();
  const bool member = mesh.includes_this_rank();
  // Ops whose global shapes torch 1.13 can work out on the meta device (outsiders do), each
  // with a halo: its convolution has no meta kernel there.
  const at::Tensor g = at::randn({1, 2, 9, 6}, at::kDouble);
  const auto net = [](const at::Tensor& x) {
    return at::upsample_nearest2d(at::max_pool2d(at::avg_pool2d(x, {3, 3}, {1, 1}, {1, 1}), {3, 3}, {1, 1}, {1, 1}), {18, 12});
  };
  const at::Tensor gr = g.clone().requires_grad_(true);
  const at::Tensor reference = net(gr);
  reference.pow(2).sum().backward();

  ShardSizes rows = uneven_rows(mesh, 9);
  rows[0].tensor_dim = 2;  // split the height, the last member's piece empty
  CommDebugMode comms;
  const at::Tensor x = distribute_tensor(g.clone().requires_grad_(true), mesh, {Shard(2)}, rows);
  const at::Tensor y = net(x);
  y.pow(2).sum().backward();
  EXPECT_EQ(y.sizes(), reference.sizes());
  ASSERT_TRUE(x.grad().defined());
  if (member) {
    EXPECT_TRUE(at::allclose(full_tensor(y), reference.detach())) << mesh;
    EXPECT_TRUE(at::allclose(full_tensor(x.grad()), gr.grad())) << mesh;
  } else {
    EXPECT_TRUE(is_empty_piece(y) && is_empty_piece(x.grad())) << mesh;
    EXPECT_EQ(comms.total(), 0) << "a rank outside " << mesh << " communicated";
  }
}

TEST(SubMesh, RedistributesFactoriesAndFromLocalWorkOnMembersAndMoveNothingOutside) {
  const DeviceMesh& mesh = sub_mesh_2d();
  const bool member = mesh.includes_this_rank();
  const at::Tensor g = at::arange(24, at::kDouble).reshape({6, 4});
  CommDebugMode comms;
  at::Tensor x = distribute_tensor(g, mesh, rows_on_last_dim(mesh), uneven_rows(mesh, 6));
  at::Tensor moved = redistribute(redistribute(x, {Replicate(), Shard(1)}), {Replicate(), Replicate()});
  const at::Tensor ones = shardtensor::ones({{5, 2}, mesh, {Replicate(), Shard(0)}});
  const at::Tensor local = member ? to_local(x) : at::ones({3, 4}, at::kDouble);
  const at::Tensor inferred = from_local(local, mesh, rows_on_last_dim(mesh), ShardSizing::infer());
  EXPECT_EQ(ones.sizes(), (std::vector<int64_t>{5, 2}));
  if (member) {
    EXPECT_TRUE(at::equal(full_tensor(moved), g));
    EXPECT_TRUE(at::equal(full_tensor(ones), at::ones({5, 2}, at::kFloat)));
    EXPECT_TRUE(at::equal(full_tensor(inferred), g));
  } else {
    EXPECT_TRUE(is_empty_piece(moved) && is_empty_piece(ones) && is_empty_piece(inferred));
    EXPECT_EQ(spec(moved).placements(), (Placements{Replicate(), Replicate()}));
    // "infer" cannot see the members' pieces outside the mesh: it reads the local shape as a chunk.
    EXPECT_EQ(inferred.sizes(), (std::vector<int64_t>{3 * mesh.size(1), 4}));
    EXPECT_EQ(comms.total(), 0) << "a rank outside " << mesh << " communicated";
  }
}

TEST(SubMesh, RandomDrawsKeepTheKeyStreamInStepWithTheRanksOutside) {
  // A draw on the sub-mesh, then a Replicate draw on the whole world: every rank, member of
  // the sub-mesh or not, must draw the same values for the second.
  manual_seed(1234);
  const at::Tensor on_sub = shardtensor::rand({{6, 3}, sub_mesh_1d(), {Shard(0)}});
  at::Tensor bernoulli_like = at::bernoulli(on_sub, 0.5);
  const DeviceMesh& world = test_meshes().front();
  const at::Tensor replicated = to_local(shardtensor::rand({{4, 4}, world, {Replicate()}})).clone();
  at::Tensor largest = replicated.clone(), smallest = replicated.clone();
  world.comm(0).all_reduce(largest, ReduceOp::Max);
  world.comm(0).all_reduce(smallest, ReduceOp::Min);
  EXPECT_TRUE(at::equal(largest, smallest)) << "ranks drew different values for a Replicate tensor after a draw on "
                                           << sub_mesh_1d();
  EXPECT_EQ(bernoulli_like.sizes(), (std::vector<int64_t>{6, 3}));
}

TEST(SubMesh, WhatNeedsValuesOrCommunicationRaisesOutsideAndWorksInside) {
  const DeviceMesh& mesh = sub_mesh_1d();
  const at::Tensor g = at::arange(10, at::kDouble);
  const at::Tensor x = distribute_tensor(g, mesh, {Shard(0)});
  const int64_t source = mesh.ranks().front();
  if (mesh.includes_this_rank()) {
    EXPECT_EQ(x.sum().item<double>(), 45.0);
    EXPECT_TRUE(at::equal(full_tensor(scatter_tensor(g, source, mesh, {Shard(0)})), g));
    EXPECT_EQ(mesh.coordinate().size(), 1u);
  } else {
    EXPECT_ERROR_CONTAINS(x.sum().item<double>(), "outside mesh(", "hold no shard");
    EXPECT_ERROR_CONTAINS(scatter_tensor(g, source, mesh, {Shard(0)}), "is not one of the ranks", "cannot communicate");
    EXPECT_ERROR_CONTAINS(mesh.coordinate(), "is not one of the ranks", "has no coordinate");
  }
}

TEST(SubMesh, ALayoutThatNamesARankTwiceOrOneOutsideTheWorldRaises) {
  EXPECT_ERROR_CONTAINS(DeviceMesh::from_ranks({2}, {0, 0}), "lists rank 0 more than once");
  EXPECT_ERROR_CONTAINS(DeviceMesh::from_ranks({1}, {world_size()}), "names rank " + std::to_string(world_size()),
                        "not in the world");
}

}  // namespace shardtensor::testing
