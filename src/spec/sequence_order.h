// The order in which a sequence split along a mesh dim sits on its ranks, as causal attention
// reads it (shardtensor/context_parallel.h): contiguous shards, or zigzag chunks. Pure
// geometry plus the process-wide setting, so that rules read it without communicating.
#pragma once

#include <cstdint>
#include <vector>

#include "shardtensor/context_parallel.h"
#include "spec/halo_geometry.h"  // Range

namespace shardtensor {

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

// Bumps whenever set_zigzag_causal changes a setting: part of the propagation cache's validity.
uint64_t sequence_order_generation();

}  // namespace shardtensor
