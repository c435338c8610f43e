// The order in which a sequence split along a mesh dim sits on its ranks: in order (one stretch
// per rank) or in zigzag chunks (ZigzagShard, shardtensor/placement.h), as causal attention
// and the exchanges between the two orders read it. Pure geometry: c10 and the spec only.
#pragma once

#include <cstdint>
#include <vector>

#include "shardtensor/spec.h"
#include "spec/halo_geometry.h"  // Range

namespace shardtensor {

// Also declared, for users, in shardtensor/context_parallel.h.
std::vector<int64_t> zigzag_chunk_lengths(int64_t length, int64_t ranks);
std::vector<int64_t> zigzag_shard_sizes(int64_t length, int64_t ranks);

// zigzag_shard_sizes of a dim cut into `length / unit` whole units of `unit` positions, in
// positions (Placement::zigzag_unit); `unit` divides `length`.
std::vector<int64_t> zigzag_sizes_in_units(int64_t length, int64_t ranks, int64_t unit);

// A rank's share of a sequence: the global positions it holds, piece after piece in local
// order. One piece for contiguous shards; two under zigzag.
using Pieces = std::vector<Range>;
int64_t length(const Pieces& pieces);
// The pieces' offsets in local order (exclusive prefix sum of their sizes).
std::vector<int64_t> local_starts(const Pieces& pieces);

// The global positions rank `coordinate` holds under zigzag, in local order: its early chunk,
// then its late one (either may be empty).
Pieces zigzag_positions(int64_t length, int64_t ranks, int64_t coordinate);

// Every rank's pieces: contiguous shards of `sizes` (one piece each), or zigzag chunks.
std::vector<Pieces> contiguous_pieces(const std::vector<int64_t>& sizes);
std::vector<Pieces> zigzag_pieces(int64_t length, int64_t ranks);

// The stretches of `sharding`'s tensor dim that the mesh coordinate holds, in local order:
// the one at its offset, or its two zigzag chunks.
Pieces stretches_held(const ShardTensorSpec& spec, const DimSharding& sharding, const std::vector<int64_t>& coordinate);

bool has_zigzag(const ShardTensorSpec& spec);
// `spec` with every ZigzagShard(d) made Shard(d) in torch.chunk sizes: the in-order layout a
// zigzag tensor is unshuffled to.
ShardTensorSpec in_order(const ShardTensorSpec& spec);
// `spec` with every ZigzagShard(d) made Shard(d) of the same sizes: the layout as its own pieces
// see it, positions numbered in the ranks' order. Between two layouts that split every zigzag
// dim alike, moves computed on these are the true moves (redistribute/planner.cpp).
ShardTensorSpec in_piece_order(const ShardTensorSpec& spec);

}  // namespace shardtensor
