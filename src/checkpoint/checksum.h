// The checksum of checkpoint data: XXH64 with seed 0, computed by libxxhash, and its text form
// in metadata.json (16 lowercase hex digits, most significant first: the canonical form the
// xxhash tools print, so `xxh64sum` over the bytes of a chunk gives the string stored there).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace shardtensor::checkpoint {

uint64_t xxh64(const void* data, size_t size);

std::string to_hex(uint64_t v);  // 16 lowercase hex digits
// Raises naming `what` unless `hex` is 16 lowercase hex digits.
uint64_t from_hex(const std::string& hex, const std::string& what);

}  // namespace shardtensor::checkpoint
