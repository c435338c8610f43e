// See spec/sequence_order.h and shardtensor/context_parallel.h.
#include "spec/sequence_order.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace shardtensor {
int64_t length(const Pieces& pieces) {
  int64_t n = 0;
  for (const Range& p : pieces) n += p.size();
  return n;
}

std::vector<int64_t> local_starts(const Pieces& pieces) {
  std::vector<int64_t> starts;
  int64_t at = 0;
  for (const Range& p : pieces) {
    starts.push_back(at);
    at += p.size();
  }
  return starts;
}

std::vector<int64_t> zigzag_chunk_lengths(int64_t length, int64_t ranks) {
  TORCH_CHECK(length >= 0 && ranks >= 1, "zigzag_chunk_lengths: needs a length >= 0 and ranks >= 1, got length ", length,
              " and ranks ", ranks, ".");
  const int64_t chunks = 2 * ranks, base = length / chunks, longer = length % chunks;
  std::vector<int64_t> lengths(chunks, base);
  for (int64_t i = 0; i < longer; ++i) ++lengths[i];
  return lengths;
}

std::vector<int64_t> zigzag_shard_sizes(int64_t length, int64_t ranks) {
  const std::vector<int64_t> chunks = zigzag_chunk_lengths(length, ranks);
  std::vector<int64_t> sizes;
  for (int64_t r = 0; r < ranks; ++r) sizes.push_back(chunks[r] + chunks[2 * ranks - 1 - r]);
  return sizes;
}

std::vector<int64_t> zigzag_sizes_in_units(int64_t length, int64_t ranks, int64_t unit) {
  std::vector<int64_t> sizes = zigzag_shard_sizes(length / unit, ranks);
  for (int64_t& s : sizes) s *= unit;
  return sizes;
}

Pieces zigzag_positions(int64_t length, int64_t ranks, int64_t coordinate) {
  const std::vector<Range> chunks = sizes_to_ranges(zigzag_chunk_lengths(length, ranks));
  return {chunks[coordinate], chunks[2 * ranks - 1 - coordinate]};
}

std::vector<Pieces> contiguous_pieces(const std::vector<int64_t>& sizes) {
  std::vector<Pieces> pieces;
  for (const Range& r : sizes_to_ranges(sizes)) pieces.push_back({r});
  return pieces;
}

std::vector<Pieces> zigzag_pieces(int64_t length, int64_t ranks) {
  std::vector<Pieces> pieces;
  for (int64_t r = 0; r < ranks; ++r) pieces.push_back(zigzag_positions(length, ranks, r));
  return pieces;
}

Pieces stretches_held(const ShardTensorSpec& spec, const DimSharding& sharding, const std::vector<int64_t>& coordinate) {
  if (sharding.zigzag) {
    const int64_t m = sharding.mesh_dims.front(), unit = sharding.zigzag_unit;
    Pieces pieces = zigzag_positions(spec.shape()[sharding.tensor_dim] / unit, spec.mesh().size(m), coordinate[m]);
    for (Range& r : pieces) r = Range{r.begin * unit, r.end * unit};
    return pieces;
  }
  const int64_t piece = sharding.piece_index(spec.mesh().shape(), coordinate);
  return {Range{sharding.offsets[piece], sharding.offsets[piece] + sharding.sizes[piece]}};
}

bool has_zigzag(const ShardTensorSpec& spec) {
  return std::any_of(spec.placements().begin(), spec.placements().end(), [](const Placement& p) { return p.is_zigzag(); });
}

namespace {
ShardTensorSpec without_zigzag(const ShardTensorSpec& spec, bool keep_sizes) {
  if (!has_zigzag(spec)) return spec;
  Placements placements = spec.placements();
  for (Placement& p : placements)
    if (p.is_zigzag()) p = Shard(p.tensor_dim);
  ShardSizes sizes;
  for (const DimSharding& s : spec.shardings())
    if (keep_sizes || !s.zigzag) sizes.push_back({s.tensor_dim, s.sizes});
  return ShardTensorSpec(spec.mesh(), std::move(placements), spec.shape(), spec.dtype(), sizes);
}
}  // namespace

ShardTensorSpec in_order(const ShardTensorSpec& spec) { return without_zigzag(spec, /*keep_sizes=*/false); }
ShardTensorSpec in_piece_order(const ShardTensorSpec& spec) { return without_zigzag(spec, /*keep_sizes=*/true); }

}  // namespace shardtensor
