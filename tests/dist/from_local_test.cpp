// from_local in its three sizing modes, on every mesh of this world size, against the oracle:
// each rank's local piece is cut from the same global iota tensor by reference_piece().
#include <ATen/ATen.h>

#include <sstream>

#include "dispatch/shard_tensor_impl.h"
#include "dist/dist_fixture.h"

using namespace shardtensor;
using namespace shardtensor::testing;

namespace {

at::Tensor my_piece(const DeviceMesh& mesh, const Placements& placements, const std::vector<int64_t>& shape,
                    const ShardSizes& sizes) {
  return reference_piece(iota(shape), mesh.shape(), placements, sizes, mesh.coordinate()).contiguous();
}

void expect_wraps(const at::Tensor& t, const at::Tensor& local, const ShardTensorSpec& expected) {
  ASSERT_TRUE(is_shard_tensor(t));
  EXPECT_EQ(spec(t), expected);
  EXPECT_EQ(t.sizes().vec(), expected.shape());
  EXPECT_EQ(t.dtype(), local.dtype());
  EXPECT_EQ(t.device(), local.device());
  EXPECT_TRUE(to_local(t).is_same(local));
}

}  // namespace

TEST(FromLocal, ExplicitUnevenRowsOneFourTwoThree) {
  if (world_size() != 4) GTEST_SKIP() << "the 1,4,2,3 split needs 4 ranks; the random sweep covers this world size";
  DeviceMesh mesh = test_meshes().front();
  ShardSizes sizes = {{0, {1, 4, 2, 3}}};
  at::Tensor local = my_piece(mesh, {Shard(0)}, {10, 6}, sizes);
  ShardTensor t(from_local(local, mesh, {Shard(0)}, ShardSizing::given(sizes)));
  EXPECT_EQ(t.sizes().vec(), (std::vector<int64_t>{10, 6}));
  const std::vector<int64_t> rows = {1, 4, 2, 3}, starts = {0, 1, 5, 7};
  EXPECT_EQ(t.local_shape(), (std::vector<int64_t>{rows[world_rank()], 6}));
  EXPECT_EQ(t.offsets(), (std::vector<int64_t>{starts[world_rank()], 0}));
  EXPECT_TRUE(at::equal(t.to_local(), iota({10, 6}).narrow(0, starts[world_rank()], rows[world_rank()])));
  EXPECT_EQ(t.placements(), (Placements{Shard(0)}));
  EXPECT_EQ(t.device_mesh(), mesh);
  std::ostringstream os;
  os << t;
  EXPECT_EQ(os.str(), "ShardTensor(shape [10, 6], Float, [S(0)] on mesh(4), dim 0 sizes [1, 4, 2, 3]; rank " +
                          std::to_string(world_rank()) + " holds [" + std::to_string(rows[world_rank()]) +
                          ", 6] at offsets [" + std::to_string(starts[world_rank()]) + ", 0] on cpu)");
}

TEST(FromLocal, ChunkWithoutShapeAssumesEvenShards) {
  for (const DeviceMesh& mesh : test_meshes()) {
    Placements ps(mesh.ndim(), Replicate());
    ps[0] = Shard(1);
    at::Tensor local = at::rand({2, 3});
    at::Tensor t = from_local(local, mesh, ps);  // ShardSizing::chunk()
    EXPECT_EQ(t.sizes().vec(), (std::vector<int64_t>{2, 3 * mesh.size(0)}));
    EXPECT_TRUE(spec(t).is_even());
  }
}

TEST(FromLocal, RandomLayoutsInAllThreeModesAgreeWithTheReference) {
  const uint32_t seed = 7;
  std::mt19937 rng(seed);  // same stream on every rank: every rank draws the same layouts
  int cases = 0;
  for (const DeviceMesh& mesh : test_meshes()) {
    for (int i = 0; i < 40; ++i, ++cases) {
      RandomLayout layout = random_layout(rng, mesh.shape(), /*explicit_sizes=*/true);
      SCOPED_TRACE("seed " + std::to_string(seed) + ", case " + std::to_string(cases) + " on " + mesh.to_string() + ": " + layout.describe());
      const ShardTensorSpec expected(mesh, layout.placements, layout.shape, c10::kFloat, layout.sizes);

      at::Tensor uneven = my_piece(mesh, layout.placements, layout.shape, layout.sizes);
      expect_wraps(from_local(uneven, mesh, layout.placements, ShardSizing::given(layout.sizes)), uneven, expected);
      expect_wraps(from_local(uneven, mesh, layout.placements, ShardSizing::infer()), uneven, expected);
      expect_wraps(from_local(uneven, mesh, layout.placements, ShardSizing::given(layout.sizes), /*run_check=*/true), uneven, expected);

      const ShardTensorSpec chunked(mesh, layout.placements, layout.shape, c10::kFloat);
      at::Tensor piece = my_piece(mesh, layout.placements, layout.shape, {});
      expect_wraps(from_local(piece, mesh, layout.placements, ShardSizing::chunk(layout.shape)), piece, chunked);
      expect_wraps(from_local(piece, mesh, layout.placements, ShardSizing::infer()), piece, chunked);
      expect_spec_matches_reference(spec(from_local(piece, mesh, layout.placements, ShardSizing::chunk(layout.shape))), {});
    }
  }
  if (world_rank() == 0) std::cout << cases << " random from_local layouts checked (seed " << seed << ")" << std::endl;
}

TEST(FromLocal, DetachedShardTensorKeepsLocalTensorAndSpec) {
  DeviceMesh mesh = test_meshes().front();
  at::Tensor local = my_piece(mesh, {Shard(0)}, {7, 2}, {});
  at::Tensor t = from_local(local, mesh, {Shard(0)}, ShardSizing::chunk({7, 2}));
  at::Tensor d = t.detach();
  ASSERT_TRUE(is_shard_tensor(d));
  EXPECT_EQ(spec(d), spec(t));
  EXPECT_TRUE(at::equal(to_local(d), local));
  EXPECT_EQ(d.sizes().vec(), (std::vector<int64_t>{7, 2}));
}

TEST(FromLocal, WrapperReportsGlobalMetadataAndHasNoStorage) {
  DeviceMesh mesh = test_meshes().front();
  at::Tensor local = my_piece(mesh, {Shard(0)}, {9, 4}, {});
  at::Tensor t = from_local(local, mesh, {Shard(0)}, ShardSizing::chunk({9, 4}));
  EXPECT_EQ(t.numel(), 36);
  EXPECT_EQ(t.strides().vec(), (std::vector<int64_t>{4, 1}));
  EXPECT_EQ(t.dim(), 2);
  EXPECT_TRUE(t.is_cpu());
  EXPECT_THROW(t.data_ptr(), c10::Error);
}

TEST(FromLocal, PermutedPiecesReportTheMatchingGlobalStrides) {
  // Every rank holds its columns laid out column-major (a transposed tensor's layout): the
  // ShardTensor reports the strides a [4, C] column-major tensor has, as one process would.
  for (const DeviceMesh& mesh : test_meshes()) {
    const int64_t n = mesh.size(0);
    at::manual_seed(41);
    const at::Tensor global = at::randn({4, 2 * n + 1}, at::kDouble);
    std::vector<int64_t> cols = chunk_sizes(2 * n + 1, n);
    if (n > 1) cols = [&] {  // an empty piece has no say in the order
      std::vector<int64_t> c(n, 2);
      c[0] = 0, c[1] = 5;
      return c;
    }();
    Placements ps(mesh.ndim(), Replicate());
    ps[0] = Shard(1);
    const ShardSizes sizes{{1, cols}};
    const at::Tensor piece = reference_piece(global, mesh.shape(), ps, sizes, mesh.coordinate());
    const at::Tensor column_major = piece.t().contiguous().t();
    for (ShardSizing sizing : {ShardSizing::given(sizes), ShardSizing::infer()}) {
      const at::Tensor x = from_local(column_major, mesh, ps, sizing);
      EXPECT_EQ(x.strides().vec(), global.t().contiguous().t().strides().vec());
      EXPECT_FALSE(x.is_contiguous());
      EXPECT_TRUE(at::equal(full_tensor(x), global));
      const at::Tensor y = from_local(piece, mesh, ps, sizing);  // row-major pieces: contiguous
      EXPECT_TRUE(y.is_contiguous());
    }
  }
}
