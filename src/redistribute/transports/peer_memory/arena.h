// The shared arena: where this process's large CPU tensors live, so that its same-host peers
// read them in place.
//
// Cross-memory attach (peer_memory.h) copies once, but the kernel pins the other process's
// pages stretch by stretch on every call, and that alone costs 1.5-3x a plain copy
// (bench/RESULTS.md, the copy floor). MPI libraries and NCCL's shared-memory transport put
// the buffers themselves in memory that every rank of the node maps. The arena does that for
// CPU tensors: one memfd per process, mapped by its owner for reading and writing and by its
// peers for reading only. It is the CPU allocator of c10 while installed, so every tensor of
// kArenaMinBytes or more that this process allocates afterwards lies in it, shardtensor's own
// pieces and the user's alike; smaller ones, and every allocation once the arena is full
// (with a one-time warning), come from the allocator it replaced.
//
// Peers only read, and only inside an exchange (peer_memory.h), so the protocol's guarantees
// hold unchanged: while a peer reads, the owner waits for its "done" before it may free or
// reuse a block; a peer that reads a block after its owner gave up the exchange fills only its
// own memory with stale bytes and learns the exchange failed. The mapping outlives its owner (a
// killed owner's pages stay readable, never a fault), the owner never shrinks it, and no process
// writes into another's memory through it. A forked child (a DataLoader worker) remaps its
// view private, so what it writes stays its own, and allocates outside the arena; unlike a
// plain fork, pages it has not written keep showing what the parent writes there later. A
// process forked after the library loaded gets no arena of its own: start ranks with exec
// (torchrun, shardrun, mp "spawn"). Cached blocks are never returned to the system: the arena's
// resident size is the most its process ever held at once, per size class.
//
// Opt-in: SHARDTENSOR_ARENA=1 installs it when the library loads; SHARDTENSOR_ARENA_BYTES sets
// how much address space it reserves (default 16 GiB; pages cost memory only once touched).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace shardtensor {

// Smaller allocations stay with the allocator the arena replaced: a read in place saves a
// kernel call per part, which matters only for parts of many pages.
constexpr size_t kArenaMinBytes = size_t{64} << 10;

// Where an arena lies in its owner's address space, and how a peer finds it.
struct ArenaRange {
  uint64_t base = 0;      // the owner's address of byte 0 (0: no arena)
  uint64_t capacity = 0;  // bytes
  int64_t fd = -1;        // the owner's descriptor of its memfd (/proc/PID/fd/FD)
  uint64_t cookie = 0;    // a random identity, written at byte 0 of the arena

  bool covers(uint64_t address, uint64_t bytes) const {
    return base != 0 && address >= base && bytes <= capacity && address - base <= capacity - bytes;
  }
};

// This process's arena (a null range where none is installed).
ArenaRange own_arena();
// Installs the arena as c10's CPU allocator if SHARDTENSOR_ARENA=1 (once; later calls return
// at once). Called when the library loads.
void install_arena_if_enabled();
// Test hook: the bytes the arena hands out, and those it turned away since it was full.
struct ArenaStatistics {
  uint64_t blocks_in_use = 0, bytes_reserved = 0, fallbacks = 0;
};
ArenaStatistics arena_statistics();

// A peer's arena, mapped here for reading.
class MappedArena {
 public:
  MappedArena() = default;
  MappedArena(MappedArena&& other) noexcept;
  MappedArena& operator=(MappedArena&& other) noexcept;
  MappedArena(const MappedArena&) = delete;
  MappedArena& operator=(const MappedArena&) = delete;
  ~MappedArena();

  // Maps the arena `range` of process `pid`; false (and why in `error`) where it cannot be
  // opened or mapped, or where what lies there does not carry the range's cookie (the PID now
  // names another process).
  bool map(int64_t pid, const ArenaRange& range, std::string& error);
  bool mapped() const { return local_ != nullptr; }
  // Where the owner's `address` lies here; only for addresses that range().covers().
  const char* at(uint64_t address) const { return local_ + (address - range_.base); }
  const ArenaRange& range() const { return range_; }

 private:
  ArenaRange range_;
  const char* local_ = nullptr;
};

}  // namespace shardtensor
