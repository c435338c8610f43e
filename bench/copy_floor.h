// The copy floor of a redistribute among the processes of one host: what it costs when every
// rank's source piece and result already lie in memory all of them map, and each rank makes its
// result by plain copies of exactly its bytes (one summing pass where the source is a pending
// sum). No transport can do less; redistribute_bench times it beside ours, in the same process
// group and in turns, so every row reports ours / floor.
//
// Plain C++ and POSIX: no torch in what is timed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace copy_floor {

// A mapping of `bytes` that the processes of one host share under `name` (POSIX shared memory).
// The creator makes it; the others open it once the creator has (the caller orders the two).
class SharedMapping {
 public:
  SharedMapping(const std::string& name, size_t bytes, bool create);
  ~SharedMapping();
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;

  char* data() const { return data_; }
  size_t size() const { return bytes_; }
  // Removes the name (every process has the mapping open by then); the memory lives on until
  // the last process unmaps it.
  void unlink() const;

 private:
  std::string name_;
  size_t bytes_;
  char* data_ = nullptr;
};

// One contiguous stretch of a rank's result, as byte offsets into the shared mapping: `bytes`
// at `to`, copied from the one offset of `from`, or the float sum of the stretches at each.
struct Stretch {
  size_t to = 0;
  std::vector<size_t> from;
  size_t bytes = 0;
};

// Appends the stretches of a box of `shape` (elements of `element_bytes`) in row-major tensors:
// in each source its first element lies at byte offset `from_bases[k]`, with `from_strides`
// (elements, one per dim; the same for every source), and in the result at `to_base`, with
// `to_strides`. Runs that continue one another in every source and in the result are merged.
void append_box(std::vector<Stretch>* stretches, const std::vector<int64_t>& shape, const std::vector<int64_t>& from_strides,
                const std::vector<size_t>& from_bases, const std::vector<int64_t>& to_strides, size_t to_base,
                size_t element_bytes);

// Runs `stretches` on the mapping at `base`: copies, or float sums of 2 to 4 sources.
void run(char* base, const std::vector<Stretch>& stretches);

}  // namespace copy_floor
