// The ShardTensor API: wrap local tensors into one logical tensor, and look inside one.
//
// A ShardTensor IS an at::Tensor: sizes() are the global sizes, device() is the local
// tensor's device, and every ATen operator on it goes through shardtensor's kernel. Each rank
// holds the local piece its spec assigns to its mesh coordinate.
//
//   auto mesh = shardtensor::DeviceMesh::create({4});
//   // 10 rows over 4 ranks, explicitly uneven: rank r holds sizes[r] rows.
//   auto t = shardtensor::from_local(local, mesh, {shardtensor::Shard(0)},
//                                    shardtensor::ShardSizing::given({{0, {1, 4, 2, 3}}}));
#pragma once

#include <ATen/core/Tensor.h>

#include <iosfwd>
#include <optional>
#include <vector>

#include "shardtensor/device_mesh.h"
#include "shardtensor/placement.h"
#include "shardtensor/spec.h"

namespace shardtensor {

// How from_local learns the size of every shard.
class ShardSizing {
 public:
  enum class Mode { Chunk, Infer, Given };

  // torch.chunk sizes, no communication. Without a global shape the layout must be even and the
  // global size is local size x number of shards (as DTensor's from_local assumes); with one,
  // any torch.chunk split of that shape.
  static ShardSizing chunk();
  static ShardSizing chunk(std::vector<int64_t> global_shape);
  // One all-gather of every rank's local shape over the mesh; local shapes that do not
  // concatenate raise the same error on every rank.
  static ShardSizing infer();
  // Explicit sizes, validated against the placements; no communication.
  static ShardSizing given(ShardSizes sizes);
  // Explicit sizes that the caller derived from a layout every rank already shares (a parallel
  // style's own weight pieces), never from a user's arguments: from_local then skips the
  // agreement all-gather that makes a disagreement an error on every rank (each rank still
  // checks its own piece), as SHARDTENSOR_CHECK_AGREEMENT=0 does process-wide.
  static ShardSizing trusted(ShardSizes sizes);

  Mode mode() const { return mode_; }
  const std::optional<std::vector<int64_t>>& global_shape() const { return global_shape_; }
  const ShardSizes& sizes() const { return sizes_; }
  bool is_trusted() const { return trusted_; }

 private:
  explicit ShardSizing(Mode mode) : mode_(mode) {}
  Mode mode_;
  std::optional<std::vector<int64_t>> global_shape_;
  ShardSizes sizes_;
  bool trusted_ = false;
};

// A ShardTensor from this rank's piece. With run_check, the ranks also compare every local
// shape with the layout (one all-gather), so a rank holding the wrong shape makes every rank
// raise; without it, only the rank whose local shape is wrong raises.
at::Tensor from_local(const at::Tensor& local, const DeviceMesh& mesh, const Placements& placements,
                      const ShardSizing& sizing = ShardSizing::chunk(), bool run_check = false);

bool is_shard_tensor(const at::Tensor& t);
const ShardTensorSpec& spec(const at::Tensor& t);  // raises for a plain tensor
at::Tensor to_local(const at::Tensor& t);          // raises for a plain tensor

// A convenience view of an at::Tensor that holds a ShardTensor.
class ShardTensor : public at::Tensor {
 public:
  ShardTensor() = default;
  // Raises unless t is a ShardTensor.
  explicit ShardTensor(at::Tensor t);

  const ShardTensorSpec& spec() const;
  const Placements& placements() const { return spec().placements(); }
  const DeviceMesh& device_mesh() const { return spec().mesh(); }
  at::Tensor to_local() const;
  std::vector<int64_t> local_shape() const { return spec().local_shape(); }
  std::vector<int64_t> offsets() const { return spec().local_offsets(); }  // of this rank's piece
};

// One line: global shape, dtype, placements, mesh, shard sizes, and this rank's piece.
std::ostream& operator<<(std::ostream& os, const ShardTensor& t);

// A table, one row per rank: coordinate, the index range it owns in every tensor dim, and its
// local shape. Needs no communication, so rank 0 can print the whole layout.
std::string layout_table(const ShardTensorSpec& spec);

// For 1-D and 2-D tensors up to 64 x 64: a grid with the rank(s) owning every element, so
// uneven boundaries are visible at a glance. Larger or higher-rank tensors get layout_table().
// Needs no communication.
std::string visualize_sharding(const ShardTensorSpec& spec);

}  // namespace shardtensor
