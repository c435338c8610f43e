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

// The key of the next random draw. Until manual_seed() is first called, one 64-bit draw from
// torch's default generator: torch.manual_seed, fork_rng and set_rng_state then decide
// ShardTensor draws as they decide plain ones. From then on, a per-process counter that
// manual_seed() restarts. Either way every rank makes the same calls in the same order, so
// ranks seeded alike agree without communicating.
uint64_t next_random_key();
void set_random_seed(uint64_t seed);

// The seed of torch's default generator (what torch.manual_seed last set), which keys follow
// until manual_seed() is called.
uint64_t torch_generator_seed();

// The seed manual_seed() last set, and how many times it has been called: 0 means never (keys
// follow torch's generator). Ranks given different seeds would draw different values for one
// Replicate tensor; comm/agreement.h checks this, for torch's seed too.
struct SeedState {
  uint64_t seed = 0;
  uint64_t generation = 0;
};
SeedState random_seed_state();

}  // namespace shardtensor
