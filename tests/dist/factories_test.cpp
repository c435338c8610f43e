// Factories build only the local piece, random ones give the same global tensor under every
// layout, and scatter_tensor delivers each rank exactly its piece from one source rank.
#include <ATen/ATen.h>

#include "dist/dist_fixture.h"

using namespace shardtensor;
using namespace shardtensor::testing;

namespace {
std::vector<Placements> layouts_for(const DeviceMesh& mesh) {
  std::vector<Placements> out = {Placements(mesh.ndim(), Replicate())};
  Placements rows(mesh.ndim(), Replicate()), cols(mesh.ndim(), Replicate());
  rows.front() = Shard(0);
  cols.back() = Shard(1);
  out.push_back(rows);
  out.push_back(cols);
  if (mesh.ndim() >= 2) {
    Placements both(mesh.ndim(), Replicate());
    both[0] = Shard(0);
    both[1] = Shard(1);
    out.push_back(both);
  }
  return out;
}
}  // namespace

TEST(Factories, FilledFactoriesHoldTheirValueInTheLocalPieceOnly) {
  for (const DeviceMesh& mesh : test_meshes()) {
    for (const Placements& ps : layouts_for(mesh)) {
      FactoryLayout layout{{7, 5}, mesh, ps, at::TensorOptions().dtype(at::kDouble)};
      at::Tensor z = zeros(layout), o = ones(layout), f = full(layout, 2.5), e = empty(layout);
      const ShardTensorSpec expected(mesh, ps, {7, 5}, c10::kDouble);
      for (const at::Tensor& t : {z, o, f, e}) {
        EXPECT_EQ(spec(t), expected);
        EXPECT_EQ(to_local(t).sizes().vec(), expected.local_shape());
      }
      EXPECT_TRUE(at::equal(to_local(z), at::zeros(expected.local_shape(), at::kDouble)));
      EXPECT_TRUE(at::equal(to_local(o), at::ones(expected.local_shape(), at::kDouble)));
      EXPECT_TRUE(at::equal(to_local(f), at::full(expected.local_shape(), 2.5, at::kDouble)));
    }
  }
  FactoryLayout grad_layout{{3}, test_meshes().front(), {Replicate()}, at::TensorOptions().requires_grad(true)};
  EXPECT_TRUE(zeros(grad_layout).requires_grad());
}

TEST(Factories, RandomFactoriesAreShardingInvariant) {
  const uint64_t seed = 99;
  for (bool normal : {false, true}) {
    at::Tensor reference;
    for (const DeviceMesh& mesh : test_meshes()) {
      for (const Placements& ps : layouts_for(mesh)) {
        for (bool uneven : {false, true}) {
          FactoryLayout layout{{9, 6}, mesh, ps};
          std::mt19937 rng(3);
          if (uneven && ps.front().is_shard(0)) layout.sizes = {{0, random_sizes(rng, 9, mesh.size(0))}};
          at::Tensor t = normal ? randn(layout, seed) : rand(layout, seed);
          at::Tensor whole = full_tensor(t);
          if (!reference.defined()) reference = whole;
          EXPECT_TRUE(at::equal(whole, reference)) << spec(t);
        }
      }
    }
    if (!normal) {
      EXPECT_GE(reference.min().item<float>(), 0.0f);
      EXPECT_LT(reference.max().item<float>(), 1.0f);
    }
  }
  // Statistics of a larger draw: uniform mean 1/2, normal mean 0 and std 1.
  FactoryLayout big{{128, 128}, test_meshes().front(), {Shard(0)}, at::TensorOptions().dtype(at::kDouble)};
  at::Tensor u = full_tensor(rand(big, 1)), n = full_tensor(randn(big, 2));
  EXPECT_NEAR(u.mean().item<double>(), 0.5, 0.01);
  EXPECT_NEAR(n.mean().item<double>(), 0.0, 0.02);
  EXPECT_NEAR(n.std().item<double>(), 1.0, 0.02);
  EXPECT_FALSE(at::equal(full_tensor(rand(big, 1)), full_tensor(rand(big, 3))));
}

TEST(Factories, ScatterTensorSendsEachRankItsPieceFromTheSource) {
  for (const DeviceMesh& mesh : test_meshes()) {
    const int64_t src = world_size() - 1;
    for (const Placements& ps : layouts_for(mesh)) {
      for (UseTransport::Kind kind : {UseTransport::kMemory, UseTransport::kMessages}) {
        UseTransport transport(kind);
        at::Tensor on_src = world_rank() == src ? iota({5, 3}, c10::kDouble) : at::Tensor();
        at::Tensor t = scatter_tensor(on_src, src, mesh, ps, /*requires_grad=*/true);
        EXPECT_EQ(t.sizes().vec(), (std::vector<int64_t>{5, 3}));
        EXPECT_EQ(t.scalar_type(), at::kDouble);
        EXPECT_TRUE(t.requires_grad() && t.is_leaf());
        EXPECT_TRUE(at::equal(to_local(t), reference_piece(iota({5, 3}, c10::kDouble), mesh.shape(), spec(t).placements(), {},
                                                           mesh.coordinate())));
      }
    }
  }
  EXPECT_ERROR_CONTAINS(scatter_tensor(at::Tensor(), 0, test_meshes().front(), {Replicate()}), "passed an undefined tensor");
  EXPECT_ERROR_CONTAINS(scatter_tensor(at::zeros({2}), world_size(), test_meshes().front(), {Replicate()}), "is not in");
}

TEST(Factories, NewFactoriesOfTheSameShapeKeepTheSharding) {
  // As DTensor's new_factory_strategy: a new_* of self's global shape is laid out like self
  // (uneven and empty pieces included), each rank making its piece; any other size is Replicate.
  for (const DeviceMesh& mesh : test_meshes()) {
    for (const Placements& ps : layouts_for(mesh)) {
      const int64_t n = mesh.size(0);
      ShardSizes sizes;
      if (ps.front().is_shard() && ps.front().tensor_dim == 0 && n > 1) {  // an empty first piece
        std::vector<int64_t> rows = {0};
        for (int64_t r : chunk_sizes(7, n - 1)) rows.push_back(r);
        sizes.push_back({0, rows});
      }
      const at::Tensor x = distribute_tensor(at::randn({7, 5}, at::kDouble), mesh, ps, sizes);
      const ShardTensorSpec expected = spec(x);
      const std::vector<at::Tensor> made = {x.new_zeros({7, 5}), x.new_ones({7, 5}), x.new_full({7, 5}, 2.5), x.new_empty({7, 5}),
                                            x.new_empty_strided({7, 5}, {5, 1})};
      const double values[] = {0, 1, 2.5};
      for (size_t k = 0; k < made.size(); ++k) {
        EXPECT_EQ(spec(made[k]), expected) << "new factory " << k << " on " << to_string(ps);
        EXPECT_EQ(to_local(made[k]).sizes().vec(), expected.local_shape());
        if (k < 3) EXPECT_TRUE(at::equal(full_tensor(made[k]), at::full({7, 5}, values[k], at::kDouble)));
      }
      const at::Tensor other = x.new_full({3, 2}, 4.0);
      EXPECT_EQ(spec(other).placements(), Placements(mesh.ndim(), Replicate()));
      EXPECT_TRUE(at::equal(to_local(other), at::full({3, 2}, 4.0, at::kDouble)));
      const at::Tensor transposed = x.new_empty_strided({7, 5}, {1, 7});  // not contiguous: Replicate
      EXPECT_EQ(spec(transposed).placements(), Placements(mesh.ndim(), Replicate()));
    }
  }
}

// Deferred initialisation: a tensor built on the meta device is distributed without values,
// each rank materialises only its piece (what Module.to_empty does), and the in-place random
// initialisers then give the same global tensor as on any other layout.
TEST(Factories, MetaTensorsAreMaterialisedPieceByPiece) {
  for (const DeviceMesh& mesh : test_meshes()) {
    for (const Placements& ps : layouts_for(mesh)) {
      const at::Tensor deferred = at::empty({9, 6}, at::TensorOptions().dtype(at::kDouble).device(at::kMeta));
      at::Tensor x;
      {
        CommDebugMode comms;
        x = distribute_tensor(deferred, mesh, ps);
        EXPECT_EQ(comms.count("scatter") + comms.count("broadcast"), 0) << "no values move\n" << comms.table();
      }
      EXPECT_TRUE(to_local(x).is_meta());
      EXPECT_EQ(to_local(x).sizes().vec(), spec(x).local_shape());
      // Moving values that do not exist raises on every rank; a layout that needs no move gives
      // a meta tensor again. Never garbage.
      try {
        EXPECT_TRUE(full_tensor(x).is_meta());
      } catch (const c10::Error& e) {
        EXPECT_NE(std::string(e.what_without_backtrace()).find("meta device"), std::string::npos) << e.what_without_backtrace();
      }
      // So does a kernel that moves data mid-op (layer norm's statistics over split rows); a norm
      // over the shards moves nothing (a pending norm of meta pieces) until it is read.
      bool rows_split = false, cols_split = false;
      for (int64_t m = 0; m < mesh.ndim(); ++m) {
        rows_split = rows_split || (ps[m].is_shard(0) && mesh.size(m) > 1);
        cols_split = cols_split || (ps[m].is_shard(1) && mesh.size(m) > 1);
      }
      if (cols_split)
        EXPECT_ERROR_CONTAINS(at::layer_norm(x, {6}), "meta device", "moves data between ranks", "Materialise");
      if (rows_split) {
        const at::Tensor norm = at::linalg_vector_norm(x);
        EXPECT_TRUE(to_local(norm).is_meta());
        EXPECT_ERROR_CONTAINS(full_tensor(norm), "meta device");
      }
      at::Tensor real = at::empty_like(x, at::TensorOptions().device(mesh.device()));
      ASSERT_TRUE(is_shard_tensor(real));
      EXPECT_EQ(spec(real).placements(), ps);
      EXPECT_EQ(to_local(real).device(), mesh.device());
      EXPECT_EQ(to_local(real).sizes().vec(), spec(x).local_shape());
      shardtensor::manual_seed(5);
      real.normal_(0.0, 2.0);
      shardtensor::manual_seed(5);
      const at::Tensor reference =
          zeros(FactoryLayout{{9, 6}, mesh, Placements(mesh.ndim(), Replicate()), at::TensorOptions().dtype(at::kDouble)}).normal_(0.0, 2.0);
      EXPECT_TRUE(at::equal(full_tensor(real), full_tensor(reference))) << spec(real);
    }
  }
}
