// Boxes: the index range a rank owns in the global tensor, and which rank feeds which.
//
// Every redistribution that only changes Shard/Replicate placements is an exchange of box
// intersections: receiver j needs its target box; it gets each part from the one source rank
// that holds it and "feeds" j. A sender feeds j when it agrees with j on every mesh dim the
// source layout does not shard (Replicate, or a Partial that stays Partial). Within that set
// the source boxes tile the tensor, so every element has exactly one sender, and j itself is
// that sender for everything it already holds, so nothing it has crosses the wire.
// Pure metadata (c10 + spec), shared by the planner and the executor.
#pragma once

#include <cstdint>
#include <vector>

#include "shardtensor/spec.h"

namespace shardtensor {

struct Box {
  std::vector<int64_t> offsets;
  std::vector<int64_t> shape;
  bool nothing = false;  // "no box", distinct from the one-element box of a 0-d tensor

  static Box none() { return Box{{}, {}, /*nothing=*/true}; }
  int64_t numel() const;
  bool empty() const { return numel() == 0; }
};

// A part that moves from group member `holder` to group member `receiver`. The boxes share one
// coordinate system: the holder's source tensor (contiguous) covers `holder_holds`, the
// receiver's destination tensor (contiguous) covers `receiver_holds`.
struct PeerPart {
  int64_t holder, receiver;
  Box part, holder_holds, receiver_holds;
};

// A zigzag dim's piece is two stretches, not a box: box_of refuses it (spec.h's local_offsets).
Box box_of(const ShardTensorSpec& spec, const std::vector<int64_t>& coordinate);
// The box with a zigzag dim's positions numbered in the ranks' order (spec/sequence_order.h:
// in_piece_order): its shape is the piece's; its offsets mean something only against another
// layout that splits the zigzag dims alike.
Box box_in_piece_order(const ShardTensorSpec& spec, const std::vector<int64_t>& coordinate);
// All of a tensor of `shape`, except along `dim`: there [begin, begin + size). Exchanges that
// move stretches of one dim (halos, zigzag's reorder) describe their parts with it.
// A piece as stretches of the global tensor: each a box of global positions and where it starts
// in the piece. One per piece, but a zigzag dim (placement.h: ZigzagShard) cuts each in two.
struct Stretch {
  Box global;
  std::vector<int64_t> local_start;
};
std::vector<Stretch> stretches_of(const ShardTensorSpec& spec, const std::vector<int64_t>& coordinate);

Box box_along(const std::vector<int64_t>& shape, int64_t dim, int64_t begin, int64_t size);
Box intersect(const Box& a, const Box& b);  // shape all-zero-extent when disjoint

// The coordinates of the members of `mesh_dim`'s group that this rank belongs to, in the
// communicator's rank order (group rank i is coordinate i along `mesh_dim`); with mesh_dim -1,
// every rank of the mesh, in the mesh communicator's order.
std::vector<std::vector<int64_t>> members_along(const DeviceMesh& mesh, int64_t mesh_dim);

// Whether `sender` feeds `receiver` under `source` (see the file comment).
bool feeds(const ShardTensorSpec& source, const std::vector<int64_t>& sender, const std::vector<int64_t>& receiver);

}  // namespace shardtensor
