// See checksum.h.
#include "checkpoint/checksum.h"

#include <c10/util/Exception.h>
// The whole of XXH64 from the header: no libxxhash.so at run time (src/CMakeLists.txt).
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstdio>

namespace shardtensor::checkpoint {

uint64_t xxh64(const void* data, size_t size) { return XXH64(data, size, /*seed=*/0); }

std::string to_hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

uint64_t from_hex(const std::string& hex, const std::string& what) {
  TORCH_CHECK(hex.size() == 16, "checkpoint metadata: '", what, "' should be 16 hex digits, got \"", hex, "\".");
  uint64_t v = 0;
  for (char c : hex) {
    v <<= 4;
    if (c >= '0' && c <= '9') v |= uint64_t(c - '0');
    else if (c >= 'a' && c <= 'f') v |= uint64_t(c - 'a' + 10);
    else TORCH_CHECK(false, "checkpoint metadata: '", what, "' should be lowercase hex digits, got \"", hex, "\".");
  }
  return v;
}

}  // namespace shardtensor::checkpoint
