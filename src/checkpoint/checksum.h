// The checksum of checkpoint data: XXH64 (seed 0), written here from its public specification
// (github.com/Cyan4973/xxHash, doc/xxhash_spec.md) so that no dependency is added. It runs at
// memory speed (four 64-bit lanes), and any reader can recompute it with the xxhash tools:
// `xxh64sum` over the bytes of a chunk gives the hex string stored in metadata.json.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace shardtensor::checkpoint {

uint64_t xxh64(const void* data, size_t size, uint64_t seed = 0);

std::string to_hex(uint64_t v);  // 16 lowercase hex digits
// Raises naming `what` unless `hex` is 16 hex digits.
uint64_t from_hex(const std::string& hex, const std::string& what);

}  // namespace shardtensor::checkpoint
