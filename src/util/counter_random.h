// Counter-based random numbers indexed by global element position: the same seed gives the
// same value at the same global position, whatever the mesh, placements or shard sizes. The
// random factories and dropout draw from here.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace shardtensor {

// Philox 4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"): counter =
// the element's global index, key = the seed.
std::array<uint32_t, 4> philox(uint64_t counter, uint64_t key);

// 53 random bits in [0, 1).
double uniform_from(uint32_t hi, uint32_t lo);

// Calls fn(global linear index) for every element of the box (offsets, shape) of a tensor of
// `global_shape`, in row-major order.
template <typename Fn>
void for_each_global_index(const std::vector<int64_t>& offsets, const std::vector<int64_t>& shape,
                           const std::vector<int64_t>& global_shape, Fn&& fn) {
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  if (numel == 0) return;
  const int64_t ndim = static_cast<int64_t>(global_shape.size());
  std::vector<int64_t> index(ndim, 0);
  for (int64_t n = 0; n < numel; ++n) {
    int64_t linear = 0;
    for (int64_t d = 0; d < ndim; ++d) linear = linear * global_shape[d] + offsets[d] + index[d];
    fn(linear);
    for (int64_t d = ndim - 1; d >= 0 && ++index[d] == shape[d]; --d) index[d] = 0;
  }
}

// The key of the next random draw: a per-process counter that manual_seed() restarts. Every
// rank makes the same calls in the same order, so the ranks agree without communicating.
uint64_t next_random_key();
void set_random_seed(uint64_t seed);

}  // namespace shardtensor
