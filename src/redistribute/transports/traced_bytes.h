// What lets a trace take a move it already recorded instead of recording it again: the bytes a
// traced tensor names. A derivative often moves what its forward moved (autograd saves pow's
// input x before shardtensor moves it, and pow's derivative reads x again), and eager mode saves
// the moved tensor instead; in a graph a second move would be a second collective each step.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace shardtensor {

// Only pieces being traced (fake or functional) are compared so: a real piece (dynamo's eager
// backend runs its graph on them) may hold the same bytes twice while a peer's changed. A piece
// whose place in its storage is symbolic (a view into a buffer that dynamo made dynamic: FSDP's
// flat shards) is not compared either: its offset has no value to compare.
inline bool is_traced_piece(const at::Tensor& t) {
  return t.defined() && t.has_storage() && !t.unsafeGetTensorImpl()->has_symbolic_sizes_strides() &&
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

// The moves one thread's traces recorded, newest last, at most `capacity` of them: what each
// read (TracedBytes), under which description (Key, with ==), and what it gave. A second move
// of the same bytes under an equal description takes the first one's result, as long as nothing
// wrote to that result since. Both kinds of traced move keep one: a whole redistribute
// (executor.cpp), and an exchange that is no redistribute, a halo or a mid-op reduction that a
// derivative repeats (traced_exchange.cpp).
template <typename Key>
class RecordedMoves {
 public:
  explicit RecordedMoves(size_t capacity) : capacity_(capacity) {}

  // The earlier result, or an undefined tensor.
  at::Tensor find(const Key& key, const std::vector<TracedBytes>& read) const {
    for (const Entry& e : entries_)
      if (e.key == key && e.result._version() == e.result_version && same_bytes(e.read, read)) return e.result;
    return at::Tensor();
  }

  void add(Key key, std::vector<TracedBytes> read, const at::Tensor& result) {
    if (entries_.size() == capacity_) entries_.erase(entries_.begin());
    entries_.push_back(Entry{std::move(key), std::move(read), result, result._version()});
  }

 private:
  struct Entry {
    Key key;
    std::vector<TracedBytes> read;
    at::Tensor result;
    int64_t result_version;
  };
  static bool same_bytes(const std::vector<TracedBytes>& a, const std::vector<TracedBytes>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!a[i].same_as(b[i])) return false;
    return true;
  }

  size_t capacity_;
  std::vector<Entry> entries_;
};

}  // namespace shardtensor
