// Gradient placements follow the forward (#16 item 6): a sharded leaf's gradient comes back
// sharded like the leaf, with its shard sizes, whatever backward formula made it; a Partial
// cotangent is resolved correctly; to_local() of a Partial leaf follows DTensor's rule; and a
// Partial -> Partial backward makes no reduction. The op sweep checks the layout of every
// operator's input gradients too; these are the cases named in the issue, with counts.
#include <ATen/ATen.h>

#include <functional>

#include "dist/dist_fixture.h"

namespace shardtensor::testing {
namespace {

// Rows split unevenly over mesh dim 0, the last rank's piece empty when there are several.
ShardSizes uneven_rows(int64_t rows, int64_t ranks) {
  std::vector<int64_t> sizes(ranks, 0);
  if (ranks == 1) return {{0, {rows}}};
  for (int64_t r = 0; r + 1 < ranks; ++r) sizes[r] = rows / (ranks - 1) + (r < rows % (ranks - 1) ? 1 : 0);
  return {{0, sizes}};
}

struct Leaf {
  at::Tensor reference;  // the single-device leaf
  at::Tensor sharded;
};

Leaf leaf(const DeviceMesh& mesh, std::vector<int64_t> shape, const Placements& ps, const ShardSizes& sizes) {
  const at::Tensor g = at::randn(shape, at::kDouble);
  return {g.clone().requires_grad_(true), distribute_tensor(g.clone().requires_grad_(true), mesh, ps, sizes)};
}

void expect_gradient_like_leaf(const Leaf& x, const std::string& what) {
  ASSERT_TRUE(x.sharded.grad().defined()) << what;
  const ShardTensorSpec& g = spec(x.sharded.grad());
  const ShardTensorSpec& in = spec(x.sharded);
  EXPECT_EQ(g.placements(), in.placements()) << what << ": the gradient is laid out " << g.to_string();
  EXPECT_EQ(g.shard_sizes(), in.shard_sizes()) << what;
  EXPECT_TRUE(at::allclose(full_tensor(x.sharded.grad()), x.reference.grad())) << what;
}

}  // namespace

TEST(GradientLayout, AShardedLeafsGradientIsShardedLikeItForTheIssuesOperators) {
  const DeviceMesh& mesh = test_meshes().front();
  const Placements rows{Shard(0)};
  const ShardSizes sizes = uneven_rows(7, mesh.size());
  struct Case {
    const char* name;
    std::function<at::Tensor(const at::Tensor&)> fn;
  };
  const std::vector<Case> cases = {
      {"sum", [](const at::Tensor& x) { return x.sum(); }},
      {"mean over uneven shards", [](const at::Tensor& x) { return x.mean(0); }},
      {"softmax over the sharded dim", [](const at::Tensor& x) { return at::softmax(x, 0); }},
      {"slicing", [](const at::Tensor& x) { return x.slice(0, 1, 5).slice(1, 0, 3); }},
      {"embedding of the sharded vocabulary",
       [](const at::Tensor& w) {
         const at::Tensor ids = at::tensor({6, 0, 3, 3}, at::kLong);
         return at::embedding(w, is_shard_tensor(w) ? distribute_tensor(ids, spec(w).mesh(), {Replicate()}) : ids);
       }},
  };
  for (const Case& c : cases) {
    at::manual_seed(7);
    Leaf x = leaf(mesh, {7, 5}, rows, sizes);
    const at::Tensor expected = c.fn(x.reference);
    at::manual_seed(8);
    const at::Tensor w = at::randn(expected.sizes(), at::kDouble);
    (expected * w).sum().backward();
    (full_tensor(c.fn(x.sharded)) * w).sum().backward();
    expect_gradient_like_leaf(x, c.name);
  }
}

// The gradient's move into the leaf's layout is local where it can be: a Replicate gradient
// (sum's and mean's broadcasts) is cut, not communicated.
TEST(GradientLayout, AReplicateGradientIsCutIntoTheLeafsShardsWithoutCommunication) {
  const DeviceMesh& mesh = test_meshes().front();
  Leaf x = leaf(mesh, {7, 5}, {Shard(0)}, uneven_rows(7, mesh.size()));
  const at::Tensor loss = x.sharded.mean();
  x.reference.mean().backward();
  CommDebugMode comms;
  loss.backward();
  EXPECT_EQ(comms.total(), 0) << comms.table();
  expect_gradient_like_leaf(x, "mean");
}

// Where the leaf is Replicate, a Partial gradient keeps its reduction pending (read once, by
// whatever reads it), as DTensor's does.
TEST(GradientLayout, AReplicateLeafKeepsAPartialGradientPending) {
  if (world_size() == 1) GTEST_SKIP() << "one rank: no Partial gradient to keep";
  const DeviceMesh& mesh = test_meshes().front();
  at::manual_seed(3);
  const at::Tensor a = at::randn({6, 4}, at::kDouble);
  Leaf w = leaf(mesh, {4, 3}, {Replicate()}, {});
  const at::Tensor x = distribute_tensor(a, mesh, {Shard(0)}, uneven_rows(6, mesh.size()));
  at::matmul(x, w.sharded).sum().backward();
  at::matmul(a, w.reference).sum().backward();
  EXPECT_EQ(spec(w.sharded.grad()).placements(), (Placements{Partial(ReduceOp::Sum)}));
  EXPECT_TRUE(at::allclose(full_tensor(w.sharded.grad()), w.reference.grad()));
}

// A Partial(sum) cotangent: each rank holds a term of the output's gradient.
TEST(GradientLayout, APartialCotangentIsResolvedOnTheWayToTheLeaf) {
  for (const DeviceMesh& mesh : test_meshes()) {
    at::manual_seed(5);
    Leaf x = leaf(mesh, {7, 5}, Placements(mesh.ndim(), Shard(0)), {});
    const at::Tensor expected = at::tanh(x.reference).mul(3).sum(1);
    const at::Tensor out = at::tanh(x.sharded).mul(3).sum(1);
    const at::Tensor w = at::randn(expected.sizes(), at::kDouble);
    expected.backward(w);
    out.backward(distribute_tensor(w, mesh, Placements(mesh.ndim(), Partial(ReduceOp::Sum))));
    expect_gradient_like_leaf(x, mesh.to_string());
  }
}

// DTensor's rule: to_local()'s backward gives the gradient the tensor's own placements, so a
// Partial leaf's gradient is Partial, each rank's term being the gradient of its local piece.
// And from a Partial leaf through an op that keeps Partial (scaling), the backward makes no
// reduction at all.
TEST(GradientLayout, APartialLeafsGradientFollowsDTensorsRuleAndIsNeverReduced) {
  const DeviceMesh& mesh = test_meshes().front();
  const Placements partial{Partial(ReduceOp::Sum)};
  const at::Tensor x = distribute_tensor(at::ones({4, 3}, at::kDouble).requires_grad_(true), mesh, partial);
  const at::Tensor scaled = x.mul(3);
  ASSERT_EQ(spec(scaled).placements(), partial);
  const at::Tensor local = to_local(scaled, std::nullopt);
  const at::Tensor w = at::arange(12, at::kDouble).reshape({4, 3}) + world_rank();
  CommDebugMode comms;
  (local * w).sum().backward();
  EXPECT_EQ(comms.total(), 0) << "a Partial -> Partial backward reduces nothing\n" << comms.table();
  EXPECT_EQ(spec(x.grad()).placements(), partial);
  EXPECT_TRUE(at::allclose(to_local(x.grad()), w * 3));
}

}  // namespace shardtensor::testing
