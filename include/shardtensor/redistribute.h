// Moving a ShardTensor between layouts, and building ShardTensors from whole tensors.
//
// Every function here is differentiable: the gradient flows back through the inverse move
// (a Partial source gets a Replicate gradient, as in DTensor). All ranks of the mesh must call
// them together; argument errors are raised on every rank before any collective starts.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "shardtensor/device_mesh.h"
#include "shardtensor/placement.h"
#include "shardtensor/spec.h"
#include "shardtensor/transport_options.h"

namespace shardtensor {

// New shards take torch.chunk sizes; tensor dims sharded exactly as before keep their sizes.
at::Tensor redistribute(const at::Tensor& t, const Placements& placements);
// With explicit target sizes: Shard(0) sizes 1,4,2,3 -> Shard(0) sizes 3,3,2,2 is one call.
at::Tensor redistribute(const at::Tensor& t, const Placements& placements, const ShardSizes& sizes);
// As above, naming the mesh: it must be the tensor's own mesh (moving between meshes is not
// supported and raises).
at::Tensor redistribute(const at::Tensor& t, const DeviceMesh& mesh, const Placements& placements,
                        const std::optional<ShardSizes>& sizes = std::nullopt, const TransportOptions& options = {});

// As above, with plan options (transport_options.h) in place of this process's defaults: the
// move and its gradient's move use them.
at::Tensor redistribute(const at::Tensor& t, const Placements& placements, const TransportOptions& options,
                        const std::optional<ShardSizes>& sizes = std::nullopt);

// The whole tensor on every rank, as a plain tensor. Its gradient is laid out as
// `grad_placements` (default: the tensor's own placements, Partial turned Replicate).
at::Tensor full_tensor(const at::Tensor& t, const std::optional<Placements>& grad_placements = std::nullopt);

// Differentiable to_local: the gradient of the local tensor comes back as a ShardTensor laid
// out as `grad_placements` (default: the tensor's placements).
at::Tensor to_local(const at::Tensor& t, const std::optional<Placements>& grad_placements);

// Shards a tensor every rank has. As in DTensor, the source of truth is the rank at coordinate
// `src_data_rank` of each mesh dim (default 0): each rank receives its box of that rank's
// tensor, and only its box. With src_data_rank = nullopt (Python's None) each rank keeps its
// box of its own tensor and no data moves. Partial placements hold the value on the source's
// coordinate and the reduction's identity elsewhere (all ranks for avg/max/min). A tensor on
// the meta device (a module built under torch.device("meta")) gives a ShardTensor whose
// pieces are on meta: no values move, and empty_like(x, device) (Module.to_empty) then
// allocates each rank's piece only, never the whole tensor. Every rank
// must pass the same shape, dtype, placements, sizes and src_data_rank: one small all-gather
// checks it, and a difference raises on every rank.
at::Tensor distribute_tensor(const at::Tensor& global, const DeviceMesh& mesh, const Placements& placements,
                             const std::optional<ShardSizes>& sizes = std::nullopt,
                             std::optional<int64_t> src_data_rank = 0);

// The plan a redistribution would run, without running it, with the transport of each step:
// "[S(0)] -[AllGather(mesh_dim=0, tensor_dim=0) by all_gather (c10d collective)]-> [R] (...)".
// Needs no communication.
std::string explain_redistribute(const ShardTensorSpec& source, const ShardTensorSpec& target);
std::string explain_redistribute(const ShardTensorSpec& source, const ShardTensorSpec& target, const TransportOptions& options);

}  // namespace shardtensor
