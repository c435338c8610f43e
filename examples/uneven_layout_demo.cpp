// The first demo: one logical 10 x 6 tensor split unevenly over the ranks, in the three ways
// shardtensor can learn the split, and a 2-D mesh that splits rows and columns at once.
//
//   shardrun -n 4 ./examples/uneven_layout_demo        (any number of ranks works)
//
// Every rank builds the same global tensor (each element holds its linear index), keeps only
// the piece it owns, and wraps it with from_local. Rank 0 prints who owns what, computed from
// the layout alone; every rank then prints the piece it actually holds.
#include <ATen/ATen.h>

#include <iostream>

#include "shardtensor/shardtensor.h"

using namespace shardtensor;

namespace {

// The piece of the global tensor that this rank owns under `spec`.
at::Tensor my_piece(const at::Tensor& global, const ShardTensorSpec& spec) {
  at::Tensor piece = global;
  for (const DimSharding& d : spec.shardings()) {
    const int64_t i = d.piece_index(spec.mesh().shape(), spec.mesh().coordinate());
    piece = piece.narrow(d.tensor_dim, d.offsets[i], d.sizes[i]);
  }
  return piece.contiguous();
}

void show(const std::string& title, const ShardTensor& t) {
  if (t.device_mesh().rank() == 0) std::cout << "\n== " << title << " ==\n" << layout_table(t.spec()) << visualize_sharding(t.spec());
  const at::Tensor local = t.to_local();
  std::cout << title << ": holds local " << local.sizes() << " at offsets " << at::IntArrayRef(t.offsets())
            << (local.numel() ? ", first value " + std::to_string(local.flatten()[0].item<int64_t>()) : std::string(", empty"))
            << std::endl;
}

// Explicit uneven sizes for any world size: 1, 4, 2, 3 on four ranks, otherwise a rising split.
std::vector<int64_t> uneven_rows(int64_t ranks, int64_t total) {
  if (ranks == 4 && total == 10) return {1, 4, 2, 3};
  std::vector<int64_t> sizes(ranks, 0);
  for (int64_t row = 0, r = 0; row < total; ++row, r = (r + 1) % ranks) sizes[ranks - 1 - (r % ranks)] += 1;
  return sizes;
}

}  // namespace

int main() {
  const int64_t world = world_size();
  const std::vector<int64_t> shape = {10, 6};
  const at::Tensor global = at::arange(60, at::kFloat).reshape(shape);
  DeviceMesh mesh = DeviceMesh::create({world}, {"rows"});
  if (mesh.rank() == 0) std::cout << "shardtensor demo on " << world << " rank(s), " << mesh << "\n";

  // 1. Explicit sizes: the caller decides every shard's size.
  const ShardSizes explicit_sizes = {{0, uneven_rows(world, 10)}};
  ShardTensorSpec wanted(mesh, {Shard(0)}, shape, c10::kFloat, explicit_sizes);
  ShardTensor given(from_local(my_piece(global, wanted), mesh, {Shard(0)}, ShardSizing::given(explicit_sizes)));
  show("explicit sizes", given);

  // 2. torch.chunk sizes of a known global shape, no communication.
  ShardTensorSpec chunked(mesh, {Shard(0)}, shape, c10::kFloat);
  ShardTensor chunk(from_local(my_piece(global, chunked), mesh, {Shard(0)}, ShardSizing::chunk(shape)));
  show("torch.chunk sizes", chunk);

  // 3. Sizes inferred from whatever each rank holds (one all-gather of shapes).
  ShardTensor inferred(from_local(my_piece(global, wanted), mesh, {Shard(0)}, ShardSizing::infer()));
  if (mesh.rank() == 0)
    std::cout << "\ninferred layout equals the explicit one: " << (inferred.spec() == given.spec() ? "yes" : "NO") << "\n";

  // 4. On four ranks: a 2 x 2 mesh that shards rows over one mesh dim and columns over the other.
  if (world == 4) {
    DeviceMesh grid = DeviceMesh::create({2, 2}, {"rows", "cols"});
    ShardTensorSpec tiles(grid, {Shard(0), Shard(1)}, shape, c10::kFloat, {{0, {3, 7}}, {1, {4, 2}}});
    ShardTensor tiled(from_local(my_piece(global, tiles), grid, {Shard(0), Shard(1)}, ShardSizing::infer()));
    show("rows and columns on a 2x2 mesh, uneven both ways", tiled);
  }
  return 0;
}
