// Creating ShardTensors without ever materialising the global tensor: each rank allocates and
// fills only its own piece. Random factories are sharding-invariant: with the same seed the
// global tensor is the same whatever the mesh, placements or shard sizes, because every
// element's value comes from a counter-based generator (Philox 4x32-10) indexed by the
// element's global position.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <optional>

#include "shardtensor/device_mesh.h"
#include "shardtensor/placement.h"
#include "shardtensor/spec.h"

namespace shardtensor {

// Shared arguments of the factories. `sizes` gives explicit shard sizes (default torch.chunk).
struct FactoryLayout {
  std::vector<int64_t> shape;
  DeviceMesh mesh;
  Placements placements;
  // dtype (default: torch's default dtype, float unless set_default_dtype changed it) and
  // requires_grad; the device comes from the mesh.
  c10::TensorOptions options = {};
  ShardSizes sizes = {};
};

at::Tensor empty(const FactoryLayout& layout);
at::Tensor zeros(const FactoryLayout& layout);
at::Tensor ones(const FactoryLayout& layout);
at::Tensor full(const FactoryLayout& layout, double value);
// Uniform on [0, 1) and standard normal. Without a seed, the next value of a per-process
// counter started by manual_seed() (every rank makes the same calls, so they agree).
at::Tensor rand(const FactoryLayout& layout, std::optional<uint64_t> seed = std::nullopt);
at::Tensor randn(const FactoryLayout& layout, std::optional<uint64_t> seed = std::nullopt);
// Restarts the counter. The first draw on each mesh after it checks, with one small
// all-gather, that every rank of the mesh passed the same seed, and raises on every rank if
// not (SHARDTENSOR_CHECK_AGREEMENT=0 skips the check). With a mesh, the check runs now, as
// DTensor's manual_seed(seed, device_mesh) does.
void manual_seed(uint64_t seed);
void manual_seed(uint64_t seed, const DeviceMesh& mesh);

// Shards a tensor that only `src_rank` has: the other ranks learn its shape and dtype from it
// (pass an undefined tensor there) in one small broadcast, and each receives only its own
// piece. With requires_grad the result is a leaf that requires grad. `global_shape` and
// `dtype` (PhysicsNeMo's keywords), where a rank passes them, must be the source's: every rank
// checks them against the broadcast and raises the same error.
at::Tensor scatter_tensor(const at::Tensor& tensor_on_src, int64_t src_rank, const DeviceMesh& mesh,
                          const Placements& placements, bool requires_grad = false,
                          const std::optional<std::vector<int64_t>>& global_shape = std::nullopt,
                          std::optional<c10::ScalarType> dtype = std::nullopt);

}  // namespace shardtensor
