// Counter-based random numbers indexed by global element position: the same seed gives the
// same value at the same global position, whatever the mesh, placements or shard sizes. The
// random factories and the random operators (dropout, uniform_, ...) draw from here.
#pragma once

#include <cstdint>
#include <vector>

namespace at {
class Tensor;
}

namespace shardtensor {

// The values at the box (offsets, shape) of a tensor of `global_shape`, as a double tensor of
// `shape`: uniform in [0, 1), or standard normal. Philox 4x32-10 (Salmon et al., "Parallel
// random numbers: as easy as 1, 2, 3"): counter = the element's global index, key = `key`.
at::Tensor counter_draws(const std::vector<int64_t>& offsets, const std::vector<int64_t>& shape,
                         const std::vector<int64_t>& global_shape, uint64_t key, bool normal);

// The key of the next random draw: a per-process counter that manual_seed() restarts. Every
// rank makes the same calls in the same order, so the ranks agree without communicating.
uint64_t next_random_key();
void set_random_seed(uint64_t seed);

// The seed manual_seed() last set, and how many times it has been called: 0 means never, and
// then every rank starts from key 0 and agrees by construction. Ranks given different seeds
// would draw different values for one Replicate tensor; comm/agreement.h checks this.
struct SeedState {
  uint64_t seed = 0;
  uint64_t generation = 0;
};
SeedState random_seed_state();

}  // namespace shardtensor
