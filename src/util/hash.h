// hash_combine for the value types' hash() (placements, meshes, specs): boost's mixing step.
#pragma once

#include <cstddef>

namespace shardtensor {

inline size_t hash_combine(size_t seed, size_t value) {
  return seed ^ (value + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2));
}

}  // namespace shardtensor
