// Copies through the peers' memory: the runs of bytes a part spans on each side, which side
// copies it, and the protocol around the copies.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "redistribute/transports/peer_memory/copies.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "comm/comm.h"
#include "comm/comm_debug.h"
#include "comm/fingerprint.h"
#include "redistribute/transports/peer_memory/peer_memory.h"
#include "util/strings.h"

namespace shardtensor {
namespace {

std::atomic<int> copies_to_fail{0};
std::atomic<int64_t> parts_written{0};
std::atomic<int64_t> parts_read_in_place{0};
std::atomic<int64_t> reductions_in_place{0};

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

// The kernel walks each side of a copy stretch by stretch, at about 60 ns a stretch: for
// stretches shorter than this, a local copy through a contiguous buffer is faster.
constexpr int64_t kShortStretchBytes = 1024;
bool in_short_stretches(const Box& part, const Box& holds, int64_t element) {
  return part.numel() * element < kShortStretchBytes * stretches(part, holds);
}

// What a member offers a peer for one part (see PeerMemory::Exchange), in a contiguous buffer
// at `base` (of `extent` bytes) that covers `holds`, with its element size: a holder offers its
// part to be read, a receiver the place its part lands in, to be written. As words: kind, peer,
// base, extent, element, ndim, then part's and holds' offsets and shapes.
enum class OfferKind : uint64_t { ToRead = 0, ToWrite = 1 };
struct Offer {
  OfferKind kind = OfferKind::ToRead;
  int64_t peer = -1;  // the receiver that may read, or the holder that may write
  uint64_t base = 0, extent = 0;
  int64_t element = 0;
  Box part, holds;
};

void append_offer(std::vector<uint64_t>& words, const Offer& o) {
  const size_t ndim = o.part.shape.size();
  for (uint64_t w : {static_cast<uint64_t>(o.kind), static_cast<uint64_t>(o.peer), o.base, o.extent, static_cast<uint64_t>(o.element),
                     static_cast<uint64_t>(ndim)})
    words.push_back(w);
  for (const std::vector<int64_t>* v : {&o.part.offsets, &o.part.shape, &o.holds.offsets, &o.holds.shape})
    for (int64_t x : *v) words.push_back(static_cast<uint64_t>(x));
}

// The offer of `kind` that `words` makes to `peer` for `part`; false when there is none. Offers
// come from another process: every length is checked before it is used.
bool find_offer(const std::vector<uint64_t>& words, OfferKind kind, int64_t peer, const Box& part, Offer& found) {
  constexpr size_t kFixed = 6;
  for (size_t at = 0; at + kFixed <= words.size();) {
    const size_t ndim = words[at + 5];
    if (ndim > 64 || at + kFixed + 4 * ndim > words.size()) return false;
    auto box = [&](size_t first) {
      Box b;
      for (size_t d = 0; d < ndim; ++d) b.offsets.push_back(static_cast<int64_t>(words[first + d]));
      for (size_t d = 0; d < ndim; ++d) b.shape.push_back(static_cast<int64_t>(words[first + ndim + d]));
      return b;
    };
    Offer o{static_cast<OfferKind>(words[at]), static_cast<int64_t>(words[at + 1]), words[at + 2], words[at + 3],
            static_cast<int64_t>(words[at + 4]), box(at + kFixed), box(at + kFixed + 2 * ndim)};
    at += kFixed + 4 * ndim;
    if (o.kind == kind && o.peer == peer && o.part.offsets == part.offsets && o.part.shape == part.shape) {
      found = std::move(o);
      return true;
    }
  }
  return false;
}

bool contains(const Box& outer, const Box& inner) {
  if (outer.shape.size() != inner.shape.size()) return false;
  const Box common = intersect(outer, inner);
  return common.offsets == inner.offsets && common.shape == inner.shape;
}

std::string describe(const Box& b) { return "offsets [" + join(b.offsets, ", ") + "] shape [" + join(b.shape, ", ") + "]"; }

// Whether part `from` offers is written by its holder into the place `into` offers, instead of
// read by its receiver: where the holder's side lies in more stretches than the receiver's.
// The kernel pins the other process's memory stretch by stretch, about 0.85 µs each, while a
// stretch of one's own costs 0.08 µs (bench/cross_memory_stretches.cpp measures both): the copier should be the
// side with many stretches. Holder and receiver decide alike, from the same two offers.
// A group whose members read each other's arenas never writes: a part in its holder's arena is
// read in place, where a stretch costs what a local one does; the rest (small tensors, those of
// a full arena) are read through cross-memory attach, slower where they lie in many stretches,
// but no member ever writes into another's memory.
bool holder_writes(bool in_place, const Offer& from, const Offer& into) {
  return !in_place && stretches(from.part, from.holds) > stretches(into.part, into.holds);
}

// This rank's offer of part `p` to its receiver: straight from `source`, or, where the part
// lies in short stretches of it that the receiver cannot read in place, from a packed copy
// added to `packed` (kept until the end).
Offer offer_for(const PeerMemory& memory, bool in_place, const PeerPart& p, const at::Tensor& source, std::vector<at::Tensor>& packed) {
  const int64_t element = static_cast<int64_t>(source.element_size());
  if (!in_short_stretches(p.part, p.holder_holds, element) ||
      (in_place && memory.readable_in_place(p.holder, reinterpret_cast<uintptr_t>(source.data_ptr()), source.nbytes())))
    return {OfferKind::ToRead, p.receiver, reinterpret_cast<uintptr_t>(source.data_ptr()), source.nbytes(), element, p.part, p.holder_holds};
  packed.push_back(at::empty(p.part.shape, source.options()));
  packed.back().copy_(view_in(source, p.holder_holds, p.part));
  return {OfferKind::ToRead, p.receiver, reinterpret_cast<uintptr_t>(packed.back().data_ptr()), packed.back().nbytes(), element, p.part,
          p.part};
}

// The place part `p` lands in `destination` (which covers p.receiver_holds), offered to its
// holder for writing; none where this rank's side lies in short stretches (it is read into a
// staging buffer then).
bool landing_for(const PeerPart& p, const at::Tensor& destination, Offer& into) {
  const int64_t element = static_cast<int64_t>(destination.element_size());
  if (in_short_stretches(p.part, p.receiver_holds, element)) return false;
  into = {OfferKind::ToWrite, p.holder, reinterpret_cast<uintptr_t>(destination.data_ptr()), destination.nbytes(), element, p.part,
          p.receiver_holds};
  return true;
}

// The bytes a buffer covering `holds` spans; false where a size is negative or the product
// overflows (an offer from another process is checked before it is trusted).
bool bytes_of(const Box& holds, int64_t element, uint64_t& bytes) {
  bytes = static_cast<uint64_t>(element);
  for (int64_t size : holds.shape)
    if (size < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(size), &bytes)) return false;
  return element > 0;
}

// Whether `parts` lists the part `p` moves more than once between the same two members (a halo
// window that wraps around an axis more than once could). Such parts are read, never written:
// a holder could not tell which landing each of its copies is for.
bool listed_twice(const std::vector<PeerPart>& parts, const PeerPart& p) {
  int count = 0;
  for (const PeerPart& q : parts)
    count += q.holder == p.holder && q.receiver == p.receiver && q.part.offsets == p.part.offsets && q.part.shape == p.part.shape;
  return count > 1;
}

// Checks `peer`'s offer of part `p` against what this rank copies: the same element size, and
// a buffer whose extent holds the box it claims to cover, which covers the part. Every run of
// the copy then lies inside the offered extent.
void check_offer(const PeerMemory::Exchange& exchange, int64_t peer, const PeerPart& p, const Offer& offer, int64_t element) {
  uint64_t spans = 0;
  const bool consistent = offer.element == element && contains(offer.holds, p.part) && bytes_of(offer.holds, element, spans) &&
                          offer.extent >= spans;
  TORCH_CHECK(consistent, "shardtensor: exchange through peer memory failed: group rank ", peer, " offers part ", describe(p.part),
              offer.kind == OfferKind::ToRead ? " from" : " into", " a buffer that cannot hold it (it holds ", describe(offer.holds), " in ",
              offer.extent, " bytes of ", offer.element, "-byte elements; this rank copies ", element, "-byte elements) in \"",
              exchange.operation().description, "\"");
}

// Reads part `p` (this rank is its receiver) as `offer` describes it, into `destination`,
// which covers p.receiver_holds. Where this rank's side is in short stretches, the part goes
// through a contiguous staging buffer. The offer is checked against the part first.
bool read_part(PeerMemory::Exchange& exchange, const PeerPart& p, const Offer& offer, const at::Tensor& destination, std::string& error) {
  const int64_t element = static_cast<int64_t>(destination.element_size());
  check_offer(exchange, p.holder, p, offer, element);
  TORCH_INTERNAL_ASSERT(contains(p.receiver_holds, p.part) && destination.nbytes() >= static_cast<size_t>(p.receiver_holds.numel() * element));
  if (take_injected_copy_failure(error)) return false;
  PeerPart layout{p.holder, p.receiver, p.part, offer.holds, p.receiver_holds};
  const bool in_place = exchange.readable_in_place(p.holder, offer.base, offer.extent);
  at::Tensor staging;
  if (in_short_stretches(p.part, p.receiver_holds, element) && !in_place) {
    staging = at::empty(p.part.shape, destination.options());
    layout.receiver_holds = p.part;
  }
  char* const here = static_cast<char*>(staging.defined() ? staging.data_ptr() : destination.data_ptr());
  std::vector<PeerMemory::Run> runs;
  for (const ElementRun& r : runs_of(layout))
    runs.push_back({offer.base + static_cast<uint64_t>(r.holder * element), here + r.receiver * element, static_cast<size_t>(r.length * element)});
  const bool ok = exchange.read(p.holder, runs, error);
  if (ok && in_place) ++parts_read_in_place;
  if (ok && staging.defined()) view_in(destination, p.receiver_holds, p.part).copy_(staging);
  return ok;
}

// Writes part `p` (this rank is its holder) from `source`, which covers p.holder_holds, into
// the place its receiver offered. The offer is checked against the part first.
bool write_part(PeerMemory::Exchange& exchange, const PeerPart& p, const Offer& into, const at::Tensor& source, std::string& error) {
  const int64_t element = static_cast<int64_t>(source.element_size());
  check_offer(exchange, p.receiver, p, into, element);
  TORCH_INTERNAL_ASSERT(contains(p.holder_holds, p.part) && source.nbytes() >= static_cast<size_t>(p.holder_holds.numel() * element));
  if (take_injected_copy_failure(error)) return false;
  char* const here = static_cast<char*>(source.data_ptr());
  std::vector<PeerMemory::Run> runs;
  for (const ElementRun& r : runs_of({p.holder, p.receiver, p.part, p.holder_holds, into.holds}))
    runs.push_back({into.base + static_cast<uint64_t>(r.receiver * element), here + r.holder * element, static_cast<size_t>(r.length * element)});
  if (!exchange.write(p.receiver, runs, error)) return false;
  ++parts_written;
  return true;
}

// Part `p` of a reduce-scatter (this rank is its receiver) where it lies in its holder's
// arena: a view of the holder's memory with `out`'s shape, read while the exchange lasts.
at::Tensor in_place_piece(const PeerMemory::Exchange& exchange, const PeerPart& p, const Offer& offer, const at::Tensor& out) {
  check_offer(exchange, p.holder, p, offer, static_cast<int64_t>(out.element_size()));
  const at::Tensor holds = at::from_blob(const_cast<char*>(exchange.in_place(p.holder, offer.base)), offer.holds.shape, out.options());
  return view_in(holds, offer.holds, p.part).view(out.sizes());
}

// The slot of a reduce-scatter's destination that part `p` lands in (reduction.h).
int64_t slot_of(const PeerPart& p) { return p.part.offsets[0] - p.receiver_holds.offsets[0]; }

}  // namespace

void fail_next_peer_copies(int count) { copies_to_fail = count; }

int64_t peer_parts_written() { return parts_written.load(); }

int64_t peer_parts_read_in_place() { return parts_read_in_place.load(); }

int64_t peer_reductions_in_place() { return reductions_in_place.load(); }

bool take_injected_copy_failure(std::string& error) {
  if (copies_to_fail.load(std::memory_order_relaxed) <= 0) return false;
  --copies_to_fail;
  error = "failed on purpose by fail_next_peer_copies";
  return true;
}

bool copy_through_memory(Comm& comm, PeerMemory& memory, const at::Tensor& source, const at::Tensor& destination,
                         const std::vector<PeerPart>& parts, const char* counted_as, bool counts,
                         const std::function<void()>& local_work, const PartReduction* reduction, bool in_place_asked) {
  TORCH_INTERNAL_ASSERT(source.is_contiguous() && destination.is_contiguous());
  const int64_t me = comm.rank();
  const bool in_place = in_place_asked && memory.reads_in_place();
  std::vector<at::Tensor> packed;
  std::vector<uint64_t> offers;
  std::vector<std::pair<const PeerPart*, Offer>> held, received;  // this rank's offers, part by part
  bool open_to_writes = false;
  int64_t bytes_sent = 0;
  for (const PeerPart& p : parts) {
    if (p.part.empty()) continue;
    if (p.holder == me) {
      bytes_sent += p.part.numel() * static_cast<int64_t>(source.element_size());
      held.emplace_back(&p, offer_for(memory, in_place, p, source, packed));
      append_offer(offers, held.back().second);
    } else if (p.receiver == me) {
      received.emplace_back(&p, Offer{});
      if (listed_twice(parts, p) || in_place || !landing_for(p, destination, received.back().second)) continue;
      append_offer(offers, received.back().second);
      open_to_writes = true;
    }
  }
  PeerMemory::Exchange exchange(memory, fingerprint_of(std::string(counted_as) + " of " + std::string(c10::toString(source.scalar_type()))),
                                offers, in_place, local_work, open_to_writes ? destination : at::Tensor());
  bool ok = true;
  std::string error;
  for (const auto& [p, from] : held) {
    Offer into;
    if (ok && find_offer(exchange.offers_of(p->receiver), OfferKind::ToWrite, me, p->part, into) && holder_writes(in_place, from, into))
      ok = write_part(exchange, *p, into, source, error);
  }
  std::vector<Offer> offered(received.size());
  for (size_t i = 0; i < received.size(); ++i) {
    const PeerPart* p = received[i].first;
    TORCH_CHECK(find_offer(exchange.offers_of(p->holder), OfferKind::ToRead, me, p->part, offered[i]),
                "shardtensor: exchange through peer memory failed: group rank ", p->holder, " offers no part ", describe(p->part),
                " to this rank (group rank ", me, ") in \"", exchange.operation().description,
                "\": the ranks disagree on the layout (sizes or placements differ between ranks)");
  }
  // A reduce-scatter whose every part lies in its holder's arena is combined straight from there,
  // before this rank reports done (the holders keep their buffers until then); otherwise its parts
  // land in their slots and are combined once every writer is done.
  bool combine_in_place = reduction && !received.empty();
  for (size_t i = 0; i < received.size() && combine_in_place; ++i)
    combine_in_place = exchange.readable_in_place(received[i].first->holder, offered[i].base, offered[i].extent);
  std::vector<at::Tensor> pieces(combine_in_place ? static_cast<size_t>(destination.size(0)) : 0);
  for (size_t i = 0; i < received.size(); ++i) {
    const auto& [p, into] = received[i];
    if (combine_in_place) {
      pieces.at(static_cast<size_t>(slot_of(*p))) = in_place_piece(exchange, *p, offered[i], reduction->out);
      continue;
    }
    const bool written = into.kind == OfferKind::ToWrite && holder_writes(in_place, offered[i], into);
    if (ok && !written) ok = read_part(exchange, *p, offered[i], destination, error);
  }
  if (combine_in_place) {
    ok = ok && !take_injected_copy_failure(error);
    if (ok) {
      fault_point("peer_memory:read");  // reading the holders' memory, as a copy would
      reduce_pieces_into(reduction->out, reduction->own, pieces, reduction->op, reduction->members);
      parts_read_in_place += static_cast<int64_t>(pieces.size());
      ++reductions_in_place;
    }
  }
  record_collective(counted_as, bytes_sent, counts);
  if (!ok) TORCH_WARN("shardtensor: copying through a peer's memory failed (", error, "); the group goes back to messages.");
  if (exchange.finish(ok)) {
    if (reduction && !combine_in_place) combine_slots(*reduction, destination);
    return true;
  }
  // Every member saw the failure and stops with this one.
  stop_peer_memory(comm, ok ? "another member's copy failed" : "a copy failed: " + error);
  return false;
}

}  // namespace shardtensor
