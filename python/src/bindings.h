// The pieces of the extension module shardtensor._C, one function per area. Each binds C++
// entry points and nothing else: the Python layer (python/shardtensor/) holds the DTensor and
// PhysicsNeMo surface, and no Python runs when an ATen operator meets a ShardTensor.
#pragma once

#include <torch/csrc/utils/pybind.h>

#include <vector>

#include "shardtensor/placement.h"
#include "shardtensor/spec.h"

namespace shardtensor::python {

namespace py = pybind11;

// Placements cross the boundary as (kind, value) pairs: (0, tensor dim) for Shard,
// (1, 0) for Replicate, (2, ReduceOp) for Partial, (3, the bits of p) for a pending p-norm,
// (4, unit << 32 | tensor dim as 32 bits) for ZigzagShard. The Python classes encode and decode them.
using EncodedPlacements = std::vector<std::pair<int, int64_t>>;
Placements decode_placements(const EncodedPlacements& encoded);
EncodedPlacements encode_placements(const Placements& placements);

// Shard sizes cross as {tensor dim: sizes}.
using EncodedSizes = std::vector<std::pair<int64_t, std::vector<int64_t>>>;
ShardSizes decode_sizes(const EncodedSizes& encoded);
EncodedSizes encode_sizes(const ShardSizes& sizes);

void bind_mesh(py::module_& m);
void bind_tensor(py::module_& m);
void bind_dispatch(py::module_& m);
void bind_checkpoint(py::module_& m);
void bind_rules(py::module_& m);
void bind_tracing(py::module_& m);

}  // namespace shardtensor::python
