// What lets a trace take a move it already recorded instead of recording it again: the bytes a
// traced tensor names. A derivative often moves what its forward moved (autograd saves pow's
// input x before shardtensor moves it, and pow's derivative reads x again), and eager mode saves
// the moved tensor instead; in a graph a second move would be a second collective each step.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>

#include <cstdint>
#include <vector>

namespace shardtensor {

// Only pieces being traced (fake or functional) are compared so: a real piece (dynamo's eager
// backend runs its graph on them) may hold the same bytes twice while a peer's changed.
inline bool is_traced_piece(const at::Tensor& t) {
  return t.defined() && t.has_storage() &&
         (t.is_meta() || t.key_set().has(c10::DispatchKey::Python) || t.key_set().has(c10::DispatchKey::Functionalize));
}

// A tensor's storage (held weakly, so that a freed one never matches a new one at its address),
// where in it, and the version of its values.
struct TracedBytes {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  const c10::StorageImpl* address = nullptr;
  int64_t offset = 0;
  std::vector<int64_t> sizes, strides;
  int64_t version = 0;

  explicit TracedBytes(const at::Tensor& t)
      : storage(t.storage().getWeakStorageImpl()),
        address(t.storage().unsafeGetStorageImpl()),
        offset(t.storage_offset()),
        sizes(t.sizes().vec()),
        strides(t.strides().vec()),
        version(t._version()) {}
  bool same_as(const TracedBytes& o) const {
    return address == o.address && !storage.expired() && offset == o.offset && sizes == o.sizes && strides == o.strides &&
           version == o.version;
  }
};

}  // namespace shardtensor
