// out= overloads (#16 item 7): each runs as its functional overload and writes into the out=
// tensor as torch does: an out= tensor of the result's shape keeps its storage (here: its
// layout and local piece, so views see the values); another shape is resized (here: it takes
// the result's layout); the result is cast to the out= dtype where torch allows it.
#include <ATen/ATen.h>

#include "dist/dist_fixture.h"

using namespace shardtensor;
using namespace shardtensor::testing;

namespace {

at::Tensor same_randn(std::vector<int64_t> shape, uint64_t seed) {
  at::manual_seed(seed);
  return at::randn(shape, at::kDouble);
}

// Rows split unevenly, the last rank's piece empty where there are several ranks.
ShardSizes uneven_rows(int64_t rows) {
  std::vector<int64_t> sizes(world_size(), 0);
  sizes[0] = rows;
  for (int r = 1; r + 1 < world_size() && sizes[0] > 1; ++r) {
    sizes[r] = 1;
    --sizes[0];
  }
  return {{0, sizes}};
}

}  // namespace

TEST(OutVariants, AnOutTensorOfTheResultShapeKeepsItsLayoutAndItsViewsSeeTheValues) {
  const DeviceMesh& mesh = test_meshes().front();
  const at::Tensor a = same_randn({6, 4}, 1), b = same_randn({6, 4}, 2), m = same_randn({4, 3}, 3);
  at::Tensor out = distribute_tensor(at::zeros({6, 4}, at::kDouble), mesh, {Shard(0)}, uneven_rows(6));
  const ShardTensorSpec before = spec(out);
  const at::Tensor column = out.select(1, 2);  // a view taken before the write
  // The inputs laid out otherwise: the result is redistributed into out's layout.
  at::add_out(out, distribute_tensor(a, mesh, {Shard(1)}), distribute_tensor(b, mesh, {Replicate()}), 2.0);
  EXPECT_EQ(spec(out), before);
  EXPECT_TRUE(at::allclose(full_tensor(out), a + 2 * b));
  EXPECT_TRUE(at::allclose(full_tensor(column), (a + 2 * b).select(1, 2)));

  at::Tensor product = distribute_tensor(at::zeros({6, 3}, at::kDouble), mesh, {Replicate()});
  at::mm_out(product, distribute_tensor(a, mesh, {Shard(0)}, uneven_rows(6)), distribute_tensor(m, mesh, {Replicate()}));
  EXPECT_EQ(spec(product).placements(), Placements{Replicate()});
  EXPECT_TRUE(at::allclose(full_tensor(product), at::mm(a, m)));
}

TEST(OutVariants, AnOutTensorOfAnotherShapeIsResizedToTheResultsLayout) {
  const DeviceMesh& mesh = test_meshes().front();
  const at::Tensor a = same_randn({5, 7}, 4);
  const at::Tensor sharded = distribute_tensor(a, mesh, {Shard(0)}, uneven_rows(5));
  at::Tensor values = sharded.new_empty({0}), indices = sharded.new_empty({0}, sharded.options().dtype(at::kLong));
  at::max_out(values, indices, sharded, 1, /*keepdim=*/true);
  const auto [expected_values, expected_indices] = at::max(a, 1, true);
  EXPECT_EQ(spec(values), spec(at::amax(sharded, {1}, true)));  // the functional result's layout: rows stay split
  EXPECT_TRUE(at::equal(full_tensor(values), expected_values));
  EXPECT_TRUE(at::equal(full_tensor(indices), expected_indices));

  at::Tensor sums = sharded.new_empty({0});
  at::sum_out(sums, sharded, {0});
  EXPECT_TRUE(at::allclose(full_tensor(sums), a.sum(0)));
  at::Tensor joined = sharded.new_empty({0});
  at::cat_out(joined, {sharded, sharded * 2}, 0);
  EXPECT_TRUE(at::allclose(full_tensor(joined), at::cat({a, a * 2}, 0)));
}

TEST(OutVariants, TheResultIsCastToTheOutDtypeWhereTorchAllowsIt) {
  const DeviceMesh& mesh = test_meshes().front();
  const at::Tensor counts = at::arange(12, at::kLong).view({3, 4});
  const at::Tensor sharded = distribute_tensor(counts, mesh, {Shard(1)});
  at::Tensor as_double = distribute_tensor(at::zeros({3, 4}, at::kDouble), mesh, {Shard(0)});
  at::add_out(as_double, sharded, sharded);
  EXPECT_EQ(as_double.scalar_type(), at::kDouble);
  EXPECT_TRUE(at::equal(full_tensor(as_double), (counts * 2).to(at::kDouble)));

  at::Tensor as_long = distribute_tensor(at::zeros({3, 4}, at::kLong), mesh, {Replicate()});
  const at::Tensor halves = distribute_tensor(counts.to(at::kDouble) / 2, mesh, {Shard(0)});
  EXPECT_ERROR_CONTAINS(at::add_out(as_long, halves, halves), "aten::add.out", "Double can't be cast", "Long");
}

// A composite's own buffer (linalg.matrix_rank sums into an at::empty): a plain out= tensor
// stands for the whole tensor, so it gets the whole result, resized where torch would.
TEST(OutVariants, APlainOutTensorWithShardTensorInputsGetsTheWholeResult) {
  const DeviceMesh& mesh = test_meshes().front();
  const at::Tensor global = same_randn({5, 4}, 5);
  const at::Tensor sharded = distribute_tensor(global, mesh, {Shard(0)});
  at::Tensor plain = at::empty({5, 4}, at::kDouble);
  const at::Tensor& returned = at::mul_out(plain, sharded, sharded);
  EXPECT_FALSE(is_shard_tensor(returned));
  EXPECT_TRUE(at::allclose(plain, global * global));
  at::Tensor empty = at::empty({0}, at::kFloat);
  at::sum_out(empty, sharded, {1});
  EXPECT_EQ(empty.sizes(), at::IntArrayRef({5}));
  EXPECT_TRUE(at::allclose(empty, global.sum(1).to(at::kFloat)));
}

// The whole-tensor answers of item 7 move only what they must: a norm over a sharded dim nothing
// (a pending norm, resolved by one all-reduce of the output when read), equal one flag,
// is_same_size nothing.
TEST(CommunicationOfAnswers, NormEqualAndIsSameSizeMoveOnlyTheAnswer) {
  const DeviceMesh& mesh = test_meshes().front();
  const at::Tensor g = same_randn({6, 5}, 6);
  const int64_t several = mesh.size(0) > 1 ? 1 : 0;
  const at::Tensor rows = distribute_tensor(g, mesh, {Shard(0)}, uneven_rows(6));
  const at::Tensor copy = distribute_tensor(g.clone(), mesh, {Shard(0)}, uneven_rows(6));
  at::Tensor norm, dist;
  bool same = false, same_size = false;
  {
    CommDebugMode comms;
    norm = at::linalg_vector_norm(rows, 3, {0});
    EXPECT_EQ(comms.total(), 0) << comms.table();  // a pending norm of the local norms
  }
  {
    CommDebugMode comms;
    dist = at::dist(rows, copy * 2, 2);
    same = at::equal(rows, copy);
    same_size = at::is_same_size(rows, copy.sum(0));
    EXPECT_EQ(comms.count("all_reduce"), several) << comms.table();  // equal's flag; dist's norm stays pending
    EXPECT_EQ(comms.total(), several) << comms.table();
  }
  const at::Tensor tripled = copy * 3;
  std::vector<at::Tensor> norms;
  at::Tensor total;
  {
    CommDebugMode comms;  // clip_grad_norm_'s path: the norm of the gradients' norms, one all-reduce in all
    norms = at::_foreach_norm({rows, tripled}, 2);
    EXPECT_EQ(comms.total(), 0) << comms.table();
    total = at::linalg_vector_norm(at::stack(norms), 2);
    EXPECT_EQ(spec(total).placements(), Placements{NormPartial(2)});
    total = full_tensor(total);
    EXPECT_EQ(comms.count("all_reduce"), several) << comms.table();
    EXPECT_EQ(comms.total(), several) << comms.table();
  }
  EXPECT_TRUE(at::allclose(total, at::linalg_vector_norm(at::cat({g.flatten(), (g * 3).flatten()}))));
  EXPECT_TRUE(at::allclose(full_tensor(norms[0]), at::linalg_vector_norm(g)));
  EXPECT_TRUE(at::allclose(full_tensor(norms[1]), at::linalg_vector_norm(g * 3)));
  EXPECT_EQ(spec(norm).placements(), Placements{NormPartial(3)});
  EXPECT_TRUE(at::allclose(full_tensor(norm), at::linalg_vector_norm(g, 3, {0})));
  EXPECT_TRUE(at::allclose(full_tensor(dist), at::dist(g, g * 2, 2)));
  EXPECT_TRUE(same);
  EXPECT_FALSE(same_size);
  // One rank's piece differs: every rank answers false.
  at::Tensor local = to_local(copy).clone();
  if (world_rank() == 0) local.view(-1)[0] += 1;  // rank 0 always holds rows
  const at::Tensor changed = from_local(local, mesh, {Shard(0)}, ShardSizing::given(uneven_rows(6)));
  EXPECT_FALSE(at::equal(rows, changed));
}

// A singular matrix in one rank's batch: libtorch's error, raised on every rank (the info of
// the batch is gathered before it is checked).
TEST(BatchedLinalg, ASingularMatrixOnOneRankRaisesOnEveryRank) {
  const DeviceMesh& mesh = test_meshes().front();
  at::Tensor batch = at::eye(3, at::kDouble).repeat({4, 1, 1});
  batch[0].zero_();  // rank 0's
  const at::Tensor sharded = distribute_tensor(batch, mesh, {Shard(0)});
  EXPECT_ERROR_CONTAINS(at::linalg_inv(sharded), "singular");
  batch[0] = at::eye(3, at::kDouble) * 2;
  const at::Tensor inverse = at::linalg_inv(distribute_tensor(batch, mesh, {Shard(0)}));
  EXPECT_EQ(spec(inverse).placements(), Placements{Shard(0)});
  EXPECT_TRUE(at::allclose(full_tensor(inverse), at::linalg_inv(batch)));
}
