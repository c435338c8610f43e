// Bad input raises a clear error on every rank and never hangs: checks on the arguments are
// local and identical everywhere; checks on local shapes run after an all-gather, so every
// rank sees every shape and raises the same error.
#include <ATen/ATen.h>

#include "dist/dist_fixture.h"

using namespace shardtensor;
using namespace shardtensor::testing;

TEST(FromLocalBadInput, PlacementCountMustMatchTheMesh) {
  for (const DeviceMesh& mesh : test_meshes()) {
    Placements too_many(mesh.ndim() + 1, Replicate());
    EXPECT_ERROR_CONTAINS(from_local(at::zeros({4}), mesh, too_many, ShardSizing::infer()), "from_local:",
                          "placements", "one placement per mesh dim");
  }
}

TEST(FromLocalBadInput, ShardDimOutOfRange) {
  for (const DeviceMesh& mesh : test_meshes()) {
    Placements ps(mesh.ndim(), Replicate());
    ps[0] = Shard(2);
    EXPECT_ERROR_CONTAINS(from_local(at::zeros({4, 4}), mesh, ps, ShardSizing::infer()), "Shard(2)",
                          "out of range for a 2-d tensor", "[-2, 2)");
  }
}

TEST(FromLocalBadInput, ExplicitSizesThatAreNegativeOrMiscounted) {
  DeviceMesh mesh = test_meshes().front();
  std::vector<int64_t> sizes(world_size(), 1);
  sizes[0] = -1;
  EXPECT_ERROR_CONTAINS(from_local(at::zeros({1}), mesh, {Shard(0)}, ShardSizing::given({{0, sizes}})), "negative size -1");
  std::vector<int64_t> too_few(world_size() + 1, 1);
  EXPECT_ERROR_CONTAINS(from_local(at::zeros({1}), mesh, {Shard(0)}, ShardSizing::given({{0, too_few}})),
                        "give one size per piece");
  // Sizes that do not add up to the global size chunk(shape) announces.
  EXPECT_ERROR_CONTAINS(ShardTensorSpec(mesh, {Shard(0)}, {100}, c10::kFloat, {{0, std::vector<int64_t>(world_size(), 1)}}),
                        "add up to", "global size 100");
}

TEST(FromLocalBadInput, LocalShapesThatDoNotConcatenateRaiseOnEveryRank) {
  if (world_size() == 1) GTEST_SKIP() << "one rank's shape always concatenates";
  for (const DeviceMesh& mesh : test_meshes()) {
    // Dim 1 is never sharded here, yet the last rank has a different size there.
    Placements ps(mesh.ndim(), Replicate());
    ps[0] = Shard(0);
    const int64_t cols = world_rank() == world_size() - 1 ? 4 : 3;
    EXPECT_ERROR_CONTAINS(from_local(at::zeros({2, cols}), mesh, ps, ShardSizing::infer()), "do not concatenate",
                          "tensor dim 1", "global rank " + std::to_string(world_size() - 1));
  }
  // Replicas along a mesh dim that does not shard the tensor must hold equal pieces.
  DeviceMesh mesh = test_meshes().front();
  EXPECT_ERROR_CONTAINS(from_local(at::zeros({world_rank() + 1}), mesh, {Replicate()}, ShardSizing::infer()),
                        "do not concatenate", "tensor dim 0 is not sharded");
}

TEST(FromLocalBadInput, DifferentRanksOrDtypesRaiseOnEveryRank) {
  if (world_size() == 1) GTEST_SKIP() << "needs two ranks to disagree";
  DeviceMesh mesh = test_meshes().front();
  at::Tensor odd_rank = world_rank() == 1 ? at::zeros({2, 2}) : at::zeros({2});
  EXPECT_ERROR_CONTAINS(from_local(odd_rank, mesh, {Replicate()}, ShardSizing::infer()), "different numbers of dims");
  at::Tensor odd_dtype = world_rank() == 1 ? at::zeros({2}, at::kDouble) : at::zeros({2});
  EXPECT_ERROR_CONTAINS(from_local(odd_dtype, mesh, {Shard(0)}, ShardSizing::infer()), "different dtypes", "Double");
}

TEST(FromLocalBadInput, OneWrongShapeMakesEveryRankRaise) {
  DeviceMesh mesh = test_meshes().front();
  const int64_t last = world_size() - 1;
  // chunk({10}) gives the last rank chunk_sizes(10, n).back() rows; it passes one row more.
  // With or without run_check, the ranks agree on the layout first (comm/agreement.h), so the
  // rank that holds the wrong shape raises and every other rank with it.
  const int64_t rows = chunk_sizes(10, world_size())[world_rank()] + (world_rank() == last ? 1 : 0);
  for (bool run_check : {true, false}) {
    EXPECT_ERROR_CONTAINS(from_local(at::zeros({rows}), mesh, {Shard(0)}, ShardSizing::chunk({10}), run_check),
                          "global rank " + std::to_string(last), "passed a local tensor of shape", "ShardSizing::infer()");
  }
}

TEST(FromLocalBadInput, PlainTensorsAndShardTensorsInTheWrongPlace) {
  DeviceMesh mesh = test_meshes().front();
  at::Tensor plain = at::zeros({2, 3});
  EXPECT_ERROR_CONTAINS(to_local(plain), "to_local: expects a ShardTensor", "plain", "[2, 3]");
  EXPECT_ERROR_CONTAINS(spec(plain), "spec: expects a ShardTensor");
  EXPECT_ERROR_CONTAINS(ShardTensor{plain}, "expects a ShardTensor");
  EXPECT_ERROR_CONTAINS(to_local(at::Tensor()), "an undefined tensor");
  at::Tensor t = from_local(plain, mesh, {Replicate()});
  EXPECT_ERROR_CONTAINS(from_local(t, mesh, {Replicate()}), "got a ShardTensor", "redistribute");
  EXPECT_ERROR_CONTAINS(from_local(at::Tensor(), mesh, {Replicate()}), "undefined");
}

TEST(SpatialBadInput, ErrorsNameTheOperatorAndWhatWasWrongOnEveryRank) {
  const DeviceMesh& mesh = test_meshes().front();
  const Placements rows(mesh.ndim(), Shard(2));
  const at::Tensor x = distribute_tensor(at::randn({1, 2, 9, 4}), mesh, rows);
  const at::Tensor weight = distribute_tensor(at::randn({3, 2, 7, 3}), mesh, Placements(mesh.ndim(), Replicate()));
  // A kernel of 7 rows does not fit a field of 3 rows without padding.
  const at::Tensor thin = distribute_tensor(at::randn({1, 2, 3, 4}), mesh, rows);
  EXPECT_ERROR_CONTAINS(at::conv2d(thin, weight), "smaller than the kernel extent 7");
  EXPECT_ERROR_CONTAINS(at::max_pool2d(x, {2, 2}, {2, 2}, {2, 0}), "max_pool2d_with_indices", "padding 2",
                        "at most half the kernel size");
  // Batch norm updates its running statistics in place: they must be replicated.
  const at::Tensor stats = distribute_tensor(at::zeros({2}), mesh, Placements(mesh.ndim(), Shard(0)));
  const at::Tensor ones = distribute_tensor(at::ones({2}), mesh, Placements(mesh.ndim(), Replicate()));
  EXPECT_ERROR_CONTAINS(at::batch_norm(x, {}, {}, stats, ones, true, 0.1, 1e-5, false), "native_batch_norm",
                        "running mean", "must be replicated");
}
