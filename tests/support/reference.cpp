// See reference.h.
#include "support/reference.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <sstream>

namespace shardtensor::testing {

at::Tensor iota(const std::vector<int64_t>& shape, c10::ScalarType dtype) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return at::arange(n, at::TensorOptions().dtype(dtype)).reshape(shape);
}

namespace {
// torch.chunk returns fewer pieces when the dim is small; the missing ones are empty.
at::Tensor chunk_piece(const at::Tensor& t, int64_t pieces, int64_t index, int64_t dim) {
  std::vector<at::Tensor> chunks = t.size(dim) == 0 ? std::vector<at::Tensor>{} : t.chunk(pieces, dim);
  if (index < static_cast<int64_t>(chunks.size())) return chunks[index];
  return t.narrow(dim, t.size(dim), 0);
}
// Sizes of the pieces at the outermost level of a table: its sums over every deeper axis.
at::Tensor sum_over_deeper_axes(const at::Tensor& table) {
  if (table.dim() == 1) return table.contiguous();
  std::vector<int64_t> deeper;
  for (int64_t k = 1; k < table.dim(); ++k) deeper.push_back(k);
  return table.sum(deeper).contiguous();
}
}  // namespace

at::Tensor reference_piece(const at::Tensor& global, const std::vector<int64_t>& mesh_shape,
                           const Placements& placements, const ShardSizes& sizes,
                           const std::vector<int64_t>& coordinate) {
  at::Tensor t = global;
  const int64_t ndim = global.dim();
  for (int64_t d = 0; d < ndim; ++d) {
    std::vector<int64_t> mesh_dims;
    for (size_t m = 0; m < placements.size(); ++m) {
      const Placement& p = placements[m];
      if (p.is_shard() && (p.tensor_dim + ndim) % ndim == d) mesh_dims.push_back(static_cast<int64_t>(m));
    }
    if (mesh_dims.empty()) continue;
    auto given = std::find_if(sizes.begin(), sizes.end(), [&](const DimShardSizes& s) { return s.tensor_dim == d; });
    if (given == sizes.end()) {
      for (int64_t m : mesh_dims) t = chunk_piece(t, mesh_shape[m], coordinate[m], d);
      continue;
    }
    // Table with one axis per sharding mesh dim; level j splits by sums over the deeper axes.
    std::vector<int64_t> table_shape;
    for (int64_t m : mesh_dims) table_shape.push_back(mesh_shape[m]);
    at::Tensor table = at::tensor(given->sizes, at::kLong).reshape(table_shape);
    for (int64_t m : mesh_dims) {
      at::Tensor level = sum_over_deeper_axes(table);
      std::vector<int64_t> split(level.data_ptr<int64_t>(), level.data_ptr<int64_t>() + level.numel());
      t = t.split_with_sizes(split, d)[coordinate[m]];
      table = table[coordinate[m]];
    }
  }
  return t;
}

std::vector<std::vector<int64_t>> mesh_shapes_for(int64_t world_size) {
  switch (world_size) {
    case 1: return {{1}, {1, 1}};
    case 2: return {{2}, {1, 2}, {2, 1}};
    case 3: return {{3}, {1, 3}, {3, 1}};
    case 4: return {{4}, {2, 2}, {1, 4}, {4, 1}, {2, 1, 2}};
    default: return {{world_size}};
  }
}

std::vector<int64_t> random_sizes(std::mt19937& rng, int64_t total, int64_t pieces) {
  // Cut points drawn uniformly (with repeats, so empty pieces occur) split [0, total).
  std::vector<int64_t> cuts = {0, total};
  std::uniform_int_distribution<int64_t> pick(0, total);
  for (int64_t i = 0; i + 1 < pieces; ++i) cuts.push_back(pick(rng));
  std::sort(cuts.begin(), cuts.end());
  std::vector<int64_t> sizes;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) sizes.push_back(cuts[i + 1] - cuts[i]);
  return sizes;
}

std::vector<std::vector<int64_t>> all_coordinates(const std::vector<int64_t>& mesh_shape) {
  std::vector<std::vector<int64_t>> out = {{}};
  for (int64_t n : mesh_shape) {
    std::vector<std::vector<int64_t>> next;
    for (const auto& prefix : out)
      for (int64_t c = 0; c < n; ++c) {
        auto coord = prefix;
        coord.push_back(c);
        next.push_back(coord);
      }
    out = std::move(next);
  }
  return out;
}

}  // namespace shardtensor::testing

namespace shardtensor::testing {

void expect_spec_matches_reference(const ShardTensorSpec& spec, const ShardSizes& sizes) {
  const at::Tensor global = iota(spec.shape(), c10::kLong);
  for (const auto& coord : all_coordinates(spec.mesh().shape())) {
    const at::Tensor piece = reference_piece(global, spec.mesh().shape(), spec.placements(), sizes, coord);
    const std::vector<int64_t> shape = spec.local_shape(coord);
    const std::vector<int64_t> offsets = spec.local_offsets(coord);
    EXPECT_EQ(shape, piece.sizes().vec()) << spec << " at coordinate " << at::IntArrayRef(coord);
    for (size_t d = 0; d < offsets.size(); ++d) EXPECT_LE(offsets[d] + shape[d], spec.shape()[d]) << spec;
    if (piece.numel() == 0) continue;
    int64_t first = piece.flatten()[0].item<int64_t>();
    std::vector<int64_t> expected_offsets(spec.ndim());
    for (int64_t d = spec.ndim() - 1; d >= 0; --d) {
      expected_offsets[d] = first % spec.shape()[d];
      first /= spec.shape()[d];
    }
    EXPECT_EQ(offsets, expected_offsets) << spec << " at coordinate " << at::IntArrayRef(coord);
  }
}

std::string RandomLayout::describe() const {
  std::ostringstream os;
  os << to_string(placements) << " shape " << at::IntArrayRef(shape);
  for (const auto& s : sizes) os << " dim" << s.tensor_dim << "=" << at::IntArrayRef(s.sizes);
  return os.str();
}

RandomLayout random_layout(std::mt19937& rng, const std::vector<int64_t>& mesh_shape, bool explicit_sizes) {
  RandomLayout layout;
  const int64_t ndim = std::uniform_int_distribution<int64_t>(1, 3)(rng);
  for (int64_t d = 0; d < ndim; ++d) layout.shape.push_back(std::uniform_int_distribution<int64_t>(0, 9)(rng));
  for (size_t m = 0; m < mesh_shape.size(); ++m) {
    switch (std::uniform_int_distribution<int>(0, 5)(rng)) {
      case 0: layout.placements.push_back(Replicate()); break;
      case 1: layout.placements.push_back(Partial()); break;
      default: layout.placements.push_back(Shard(std::uniform_int_distribution<int64_t>(0, ndim - 1)(rng)));
    }
  }
  if (!explicit_sizes) return layout;
  for (int64_t d = 0; d < ndim; ++d) {
    int64_t pieces = 1;
    for (size_t m = 0; m < mesh_shape.size(); ++m)
      if (layout.placements[m].is_shard(d)) pieces *= mesh_shape[m];
    bool sharded = std::any_of(layout.placements.begin(), layout.placements.end(), [&](const Placement& p) { return p.is_shard(d); });
    if (sharded) layout.sizes.push_back({d, random_sizes(rng, layout.shape[d], pieces)});
  }
  return layout;
}

}  // namespace shardtensor::testing
