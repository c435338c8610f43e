// The oracle for layout tests, written independently of the spec's own tables: torch.chunk
// and split_with_sizes applied to a real tensor, one mesh dim at a time.
#pragma once

#include <ATen/core/Tensor.h>

#include <random>
#include <vector>

#include "shardtensor/shardtensor.h"

namespace shardtensor::testing {

// A tensor whose every element is its own global linear index, so a misrouted element shows up by value.
at::Tensor iota(const std::vector<int64_t>& shape, c10::ScalarType dtype = c10::kFloat);

// The piece of `global` that the rank at `coordinate` owns under `placements` on a mesh of
// `mesh_shape`. `sizes` empty means torch.chunk sizes; otherwise the explicit tables
// (row-major over the sharding mesh dims, outer first), split level by level.
at::Tensor reference_piece(const at::Tensor& global, const std::vector<int64_t>& mesh_shape,
                           const Placements& placements, const ShardSizes& sizes,
                           const std::vector<int64_t>& coordinate);

// Every mesh shape the tests use for a world size: 1-D, 2-D with unit dims, 2x2, 2x1x2.
std::vector<std::vector<int64_t>> mesh_shapes_for(int64_t world_size);

// A random table of `pieces` non-negative sizes (zeros included) that adds up to `total`.
std::vector<int64_t> random_sizes(std::mt19937& rng, int64_t total, int64_t pieces);

// All coordinates of a mesh, row-major.
std::vector<std::vector<int64_t>> all_coordinates(const std::vector<int64_t>& mesh_shape);

// Checks that `statement` raises a c10::Error whose message contains every one of `parts`.
#define EXPECT_ERROR_CONTAINS(statement, ...)                                                        \
  do {                                                                                               \
    try {                                                                                            \
      statement;                                                                                     \
      ADD_FAILURE() << "expected an error from: " #statement;                                        \
    } catch (const c10::Error& e) {                                                                  \
      const std::string message = e.what_without_backtrace();                                        \
      for (const std::string& part : std::initializer_list<std::string>{__VA_ARGS__})                 \
        EXPECT_NE(message.find(part), std::string::npos) << "message lacks '" << part << "': " << message; \
    }                                                                                                \
  } while (0)

}  // namespace shardtensor::testing

namespace shardtensor::testing {

// For every coordinate of the spec's mesh, checks local_shape() and local_offsets() against
// reference_piece() of an iota tensor (offsets read back from the piece's first value).
void expect_spec_matches_reference(const ShardTensorSpec& spec, const ShardSizes& sizes);

// A random layout for a mesh: placements (Shard of a random dim, Replicate or Partial per mesh
// dim), a global shape with small dims (often smaller than the mesh, sometimes 0) and, when
// `explicit_sizes`, random uneven tables for every sharded dim.
struct RandomLayout {
  Placements placements;
  std::vector<int64_t> shape;
  ShardSizes sizes;
  std::string describe() const;
};
RandomLayout random_layout(std::mt19937& rng, const std::vector<int64_t>& mesh_shape, bool explicit_sizes);

}  // namespace shardtensor::testing
