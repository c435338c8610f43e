// Copies through the peers' memory: the runs of bytes a part spans on each side, which side
// copies it, and the protocol around the copies.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "redistribute/peer_copies.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <string>

#include "comm/comm.h"
#include "comm/comm_debug.h"
#include "comm/peer_memory.h"

namespace shardtensor {
namespace {

std::atomic<int64_t> copy_bytes_per_rank{kDefaultPeerCopyBytes};
std::atomic<int> copies_to_fail{0};

// Row-major strides, in elements, of a contiguous tensor that covers `holds`.
std::vector<int64_t> strides_of(const Box& holds) {
  std::vector<int64_t> stride(holds.shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(stride.size()) - 2; d >= 0; --d) stride[d] = stride[d + 1] * holds.shape[d + 1];
  return stride;
}

// The first dim of the innermost block of `part` that is one contiguous stretch of a tensor
// covering `holds`: the dims after it are whole there.
int64_t contiguous_from(const Box& part, const Box& holds) {
  int64_t inner = static_cast<int64_t>(part.shape.size()) - 1;
  while (inner > 0 && part.shape[inner] == holds.shape[inner]) --inner;
  return inner;
}

// How many contiguous stretches `part` makes in a tensor covering `holds`.
int64_t stretches(const Box& part, const Box& holds) {
  int64_t n = 1;
  for (int64_t d = 0; d < contiguous_from(part, holds); ++d) n *= part.shape[d];
  return n;
}

// The kernel pins the other process's pages stretch by stretch, so the side whose memory is in
// fewer stretches should be the other process: a part contiguous in the receiver is written by
// its holder, any other is read by its receiver. Both sides decide alike from the boxes.
bool written_by_holder(const PeerPart& p) { return stretches(p.part, p.receiver_holds) < stretches(p.part, p.holder_holds); }

// The runs that carry `p.part`, as (holder offset, receiver offset) in elements and a length:
// one per block of the innermost dims that both sides hold whole.
struct ElementRun {
  int64_t holder, receiver, length;
};
std::vector<ElementRun> runs_of(const PeerPart& p) {
  const int64_t ndim = static_cast<int64_t>(p.part.shape.size());
  if (ndim == 0) return {{0, 0, 1}};
  const std::vector<int64_t> holder_stride = strides_of(p.holder_holds), receiver_stride = strides_of(p.receiver_holds);
  const int64_t inner = std::max(contiguous_from(p.part, p.holder_holds), contiguous_from(p.part, p.receiver_holds));
  int64_t length = 1;
  for (int64_t d = inner; d < ndim; ++d) length *= p.part.shape[d];
  std::vector<ElementRun> runs;
  std::vector<int64_t> index(inner, 0);  // over the outer dims
  for (;;) {
    ElementRun run{0, 0, length};
    for (int64_t d = 0; d < ndim; ++d) {
      const int64_t i = p.part.offsets[d] + (d < inner ? index[d] : 0);
      run.holder += (i - p.holder_holds.offsets[d]) * holder_stride[d];
      run.receiver += (i - p.receiver_holds.offsets[d]) * receiver_stride[d];
    }
    runs.push_back(run);
    int64_t d = inner - 1;
    while (d >= 0 && ++index[d] == p.part.shape[d]) index[d--] = 0;
    if (d < 0) return runs;
  }
}

// `part` of a contiguous tensor that covers `holds`, as a view.
at::Tensor view_in(const at::Tensor& t, const Box& holds, const Box& part) {
  at::Tensor v = t.view(holds.shape);
  for (int64_t d = 0; d < v.dim(); ++d) v = v.narrow(d, part.offsets[d] - holds.offsets[d], part.shape[d]);
  return v;
}

// The kernel walks this process's side of a copy stretch by stretch too, at about 60 ns each:
// for stretches shorter than this, a local copy through a contiguous buffer is faster.
constexpr int64_t kShortStretchBytes = 1024;

// Copies one part: this rank is its receiver (a read) or its holder (a write). Where this
// rank's side is in short stretches, the part goes through a contiguous staging buffer.
bool copy_part(const PeerMemory& memory, const PeerPart& p, bool write, const PeerMemory::Addresses& other, const at::Tensor& source,
               const at::Tensor& destination, std::string& error) {
  if (copies_to_fail.load(std::memory_order_relaxed) > 0) {
    --copies_to_fail;
    error = "failed on purpose by fail_next_peer_copies";
    return false;
  }
  const int64_t element = static_cast<int64_t>(source.element_size());
  const Box& here_holds = write ? p.holder_holds : p.receiver_holds;
  PeerPart staged = p;
  at::Tensor staging;
  if (p.part.numel() * element < kShortStretchBytes * stretches(p.part, here_holds)) {
    staging = at::empty(p.part.shape, source.options());
    if (write) {
      staging.copy_(view_in(source, p.holder_holds, p.part));
      staged.holder_holds = p.part;
    } else {
      staged.receiver_holds = p.part;
    }
  }
  char* const here = static_cast<char*>(staging.defined() ? staging.data_ptr() : write ? source.data_ptr() : destination.data_ptr());
  const uint64_t there = write ? other.destination : other.source;
  std::vector<PeerMemory::Run> runs;
  for (const ElementRun& r : runs_of(staged)) {
    const int64_t mine = write ? r.holder : r.receiver, theirs = write ? r.receiver : r.holder;
    runs.push_back({there + static_cast<uint64_t>(theirs * element), here + mine * element, static_cast<size_t>(r.length * element)});
  }
  const bool ok = write ? memory.write(p.receiver, runs, error) : memory.read(p.holder, runs, error);
  if (ok && staging.defined() && !write) view_in(destination, p.receiver_holds, p.part).copy_(staging);
  return ok;
}

}  // namespace

PeerMemory* peer_memory_for(Comm& comm, const at::Tensor& local, int64_t bytes_per_rank) {
  if (!local.is_cpu() || bytes_per_rank < copy_bytes_per_rank.load(std::memory_order_relaxed)) return nullptr;
  return comm.peer_memory();
}

void set_peer_copy_bytes(int64_t bytes) {
  TORCH_CHECK(bytes >= 0, "set_peer_copy_bytes: ", bytes, " is not a size");
  copy_bytes_per_rank = bytes;
}

void fail_next_peer_copies(int count) { copies_to_fail = count; }

bool copy_through_memory(Comm& comm, PeerMemory& memory, const at::Tensor& source, const at::Tensor& destination,
                         const std::vector<PeerPart>& parts, const char* counted_as, bool counts) {
  TORCH_INTERNAL_ASSERT(source.is_contiguous() && destination.is_contiguous());
  const int64_t me = comm.rank();
  const std::vector<PeerMemory::Addresses> addresses = memory.share_addresses(source.data_ptr(), destination.data_ptr());
  bool ok = true;
  std::string error;
  int64_t bytes_sent = 0;
  for (const PeerPart& p : parts) {
    if (p.holder == me) bytes_sent += p.part.numel() * static_cast<int64_t>(source.element_size());
    if (!ok || p.part.empty()) continue;
    const bool write = written_by_holder(p);
    if (write ? p.holder == me : p.receiver == me)
      ok = copy_part(memory, p, write, addresses[write ? p.receiver : p.holder], source, destination, error);
  }
  record_collective(counted_as, bytes_sent, counts);
  if (!ok) TORCH_WARN("shardtensor: copying through a peer's memory failed (", error, "); the group goes back to messages.");
  if (memory.all_succeeded(ok)) return true;
  // Every member saw the failure and stops with this one.
  comm.stop_peer_memory(ok ? "another member's copy failed" : "a copy failed: " + error);
  return false;
}

}  // namespace shardtensor
