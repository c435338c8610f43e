// hash_combine for the value types' hash() (placements, meshes, specs): boost's mixing step.
// stable_hash for hashes that cross processes (fingerprints, agreement rows): FNV-1a, the same
// in every process and build, which std::hash need not be.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace shardtensor {

inline size_t hash_combine(size_t seed, size_t value) {
  return seed ^ (value + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2));
}

inline uint64_t stable_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace shardtensor
