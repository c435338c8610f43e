// ShardTensorSpec: everything about a sharded tensor's layout except its data.
//
// A spec holds the mesh, one placement per mesh dim, the global shape, stride and dtype, and the
// size of every shard. Shard sizes are first-class: each may differ (uneven sharding), they
// default to torch.chunk sizes, and nested sharding (two mesh dims splitting one tensor dim)
// keeps a table whose inner sizes may depend on the outer coordinate:
//
//   [10, 6] with [S(0)] on mesh(4), default    -> rows 3,3,3,1 at offsets 0,3,6,9
//   [10, 6] with [S(0)] on mesh(4), {1,4,2,3}  -> rows 1,4,2,3 at offsets 0,1,5,7
//   [10, 6] with [S(0), S(0)] on mesh(2x2)     -> outer 5,5; table {3,2, 3,2} (row-major by
//                                                 (coord0, coord1)), offsets 0,3,5,8
//
// The spec answers local shapes and offsets for any coordinate without communicating. It is
// immutable, and copies share one block, so passing it by value costs a reference count.
// Only c10 headers are included: rules and the planner use specs without ATen.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "shardtensor/device_mesh.h"
#include "shardtensor/placement.h"

namespace shardtensor {

// Shard sizes a caller gives for one tensor dim: a table over the coordinates of the mesh dims
// that shard it, outermost mesh dim first, row-major. With one sharding mesh dim of size 4 it is
// just the four sizes, e.g. {0, {1, 4, 2, 3}}.
struct DimShardSizes {
  int64_t tensor_dim = 0;
  std::vector<int64_t> sizes;

  bool operator==(const DimShardSizes& o) const { return tensor_dim == o.tensor_dim && sizes == o.sizes; }
};
using ShardSizes = std::vector<DimShardSizes>;

// The default split, as torch.chunk: pieces of ceil(size / num_shards); the trailing pieces may
// be smaller or empty. chunk_sizes(10, 4) = {3, 3, 3, 1}; chunk_sizes(2, 4) = {1, 1, 0, 0}.
// This is the one owner of the default uneven split: every other place asks it.
std::vector<int64_t> chunk_sizes(int64_t size, int64_t num_shards);

// How one tensor dim is split: by which mesh dims (outermost first) into which pieces.
// Because the outer mesh dim splits first, the row-major order of `sizes` is the order of the
// pieces along the tensor dim, so `offsets` is the exclusive prefix sum of `sizes`.
struct DimSharding {
  int64_t tensor_dim = 0;
  std::vector<int64_t> mesh_dims;
  std::vector<int64_t> sizes;
  std::vector<int64_t> offsets;  // in the pieces' own order: global offsets unless `zigzag`
  // Split by one ZigzagShard (placement.h): `sizes` are zigzag_shard_sizes, and a piece is two
  // stretches of the dim, not the one at its offset (ShardTensorSpec::local_offsets refuses it).
  bool zigzag = false;
  int64_t zigzag_unit = 1;  // Placement::zigzag_unit

  // Row-major index into sizes/offsets of the piece held at a mesh coordinate.
  int64_t piece_index(const std::vector<int64_t>& mesh_shape, const std::vector<int64_t>& coordinate) const;
};

class ShardTensorSpec {
 public:
  // Builds and validates a spec. Shard(d) with negative d counts from the end. `sizes` gives the
  // shard sizes of some or all sharded tensor dims; the others follow chunk_sizes.
  ShardTensorSpec(DeviceMesh mesh, Placements placements, std::vector<int64_t> global_shape,
                  c10::ScalarType dtype, const ShardSizes& sizes = {});

  const DeviceMesh& mesh() const;
  const Placements& placements() const;       // normalised: Shard dims are non-negative
  const std::vector<int64_t>& shape() const;  // global
  const std::vector<int64_t>& stride() const; // global, contiguous
  c10::ScalarType dtype() const;
  int64_t ndim() const;

  // One entry per sharded tensor dim, in increasing tensor_dim order.
  const std::vector<DimSharding>& shardings() const;
  const DimSharding* sharding_of(int64_t tensor_dim) const;  // nullptr when not sharded
  ShardSizes shard_sizes() const;  // the explicit sizes that rebuild this spec

  std::vector<int64_t> local_shape(const std::vector<int64_t>& coordinate) const;
  // Raises for a dim split in zigzag order, whose pieces have no single offset.
  std::vector<int64_t> local_offsets(const std::vector<int64_t>& coordinate) const;
  std::vector<int64_t> local_shape() const;    // at this rank's coordinate; all zeros outside the mesh
  std::vector<int64_t> local_offsets() const;  // at this rank's coordinate; all zeros outside the mesh

  bool is_even() const;        // every sharded dim splits into equal pieces
  bool is_replicated() const;  // no Shard and no Partial
  bool has_partial() const;

  bool operator==(const ShardTensorSpec& other) const;
  bool operator!=(const ShardTensorSpec& other) const { return !(*this == other); }
  size_t hash() const;
  std::string to_string() const;

 private:
  struct Data;
  std::shared_ptr<const Data> data_;
};

std::ostream& operator<<(std::ostream& os, const ShardTensorSpec& spec);

}  // namespace shardtensor

template <>
struct std::hash<shardtensor::ShardTensorSpec> {
  size_t operator()(const shardtensor::ShardTensorSpec& s) const { return s.hash(); }
};
