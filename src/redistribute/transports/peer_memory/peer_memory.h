// Copying straight between group members' memory, for members that are processes on this host.
//
// Over Gloo, bytes between two processes on one host cross a loopback socket: the sender packs
// them into a contiguous message, the kernel copies them into the socket and out again. Linux's
// cross-memory attach (process_vm_readv/writev) copies them once, straight from the holder's tensor
// into the receiver's, with no packing: strided parts travel as lists of runs. It is what MPI
// libraries use within a node.
//
// Receivers copy by reading, except where the holder's side of a part lies in many stretches
// and the receiver's in few: there the holder writes it, since the kernel pins the other
// process's memory stretch by stretch (about 0.85 µs each, against 0.08 µs for a stretch of
// one's own; bench/cross_memory_stretches.cpp), so the side with many stretches should be local.
// Reading is safe by construction: a member that gave up an exchange (it timed out, or raised)
// may already have freed its buffers, and a peer that still reads them fills only its own memory
// with stale bytes and learns at the end of the exchange that it failed (see below). Writing is
// made safe by its owner: a member offers for writing only a buffer it allocated for the
// exchange, and when it leaves the exchange by an error it never frees that buffer (a stopped
// writer may resume and write at any time later), so no process writes into memory its owner
// no longer offers while that owner lives. The writer checks every run against the extent
// offered, and checks that the receiver is still the process that joined right before it
// writes. One window is left, as in MPI's same-host copies: a receiver that exits between that
// check and the write, its PID taken by a new process of the same user within that moment.
//
// An exchange, through a small mailbox in each member's memory that the others read:
//  1. every member posts the exchange's sequence number, its operation fingerprint
//     (fingerprint.h) and a table of its offers: for each part it holds, where and how it lies
//     in its memory (to be read), and for each part it receives, where it lands (to be
//     written), each with the buffer's real extent;
//  2. each member waits until every peer has posted the same exchange; a peer that posted a
//     different operation is an error naming both operations, before any byte moves;
//  3. each part is copied once, by its receiver reading or its holder writing, after the copier
//     checked the other side's offer against the part it expects and every run against the
//     offered extent;
//  4. every member posts "done k" (and whether its copies succeeded) and waits for the others'.
//     A member returns only when every member is done, so no offered buffer changes while a
//     peer copies, and no written part is used before its writer is done; it then posts
//     "seen k".
// A peer reads a member's "done" from that member's memory, which ends with its process: a
// member that leaves the group (its communicator is released, as at exit) first waits until
// every peer has seen its last exchange (see leave()), so that its going cannot fail a slower
// peer that had not yet read its "done".
// A peer that cannot be read any more (it exited), that is not the process that joined (its
// random cookie is gone: a reused PID), or that closed its mailbox (it gave up) is an error on
// every member, at whatever step it is found: never a success. A member that leaves an exchange
// by an error closes its mailbox first, so the others raise at once instead of waiting out the
// timeout, and it uses messages from then on.
//
// Whether a group may use it is probed collectively (over c10d), once per communicator: every
// member must run on this host, in this PID namespace, and be allowed to read and write the
// others (same user, no seccomp or Yama rule against it). SHARDTENSOR_PEER_MEMORY=0 turns it off.
// Where every member has a shared arena (arena.h) and maps every other one, parts that lie in
// their holder's arena are read in place instead: a plain copy, no kernel call, and never
// written by their holder.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/fingerprint.h"
#include "redistribute/transports/peer_memory/arena.h"

namespace shardtensor {

class Comm;
struct Mailbox;

class PeerMemory {
 public:
  // Collective over `comm`: every member gets the same answer (null where any member cannot
  // read every other one; `why_not` then says why, on the members that know).
  static std::unique_ptr<PeerMemory> probe(Comm& comm, std::string& why_not);
  // Leaves the group (leave()).
  ~PeerMemory();

  // One contiguous stretch of `bytes`: at address `remote` in the peer and `local` here.
  struct Run {
    uint64_t remote;
    void* local;
    size_t bytes;
  };

  // Steps 1-4 above. Constructing it posts and waits for every peer (step 2); an Exchange
  // destroyed before finish() (an error unwinds) closes this member's mailbox.
  class Exchange {
   public:
    // `offers` (words whose meaning the caller defines) must stay alive, with every buffer they
    // point at, until finish(). `while_peers_post`, when given, runs between this member's post
    // and its wait for the others (step 2): local work that then overlaps the peers' posting.
    // `open_to_writes`, when defined, is the buffer the offers let peers write into: one this
    // member allocated for the exchange and returns to no one else. Should the exchange fail,
    // it is kept for good instead of freed (see above). With `in_place` (the same on every
    // member), what lies in a peer's shared arena is read in place, where the group can.
    Exchange(PeerMemory& memory, const Fingerprint& operation, const std::vector<uint64_t>& offers, bool in_place,
             const std::function<void()>& while_peers_post = {}, const at::Tensor& open_to_writes = {});
    ~Exchange();
    Exchange(const Exchange&) = delete;
    Exchange& operator=(const Exchange&) = delete;

    // `peer`'s offers, as it posted them (read for every peer when the exchange started).
    const std::vector<uint64_t>& offers_of(int64_t peer) const { return offers_[peer]; }
    // Reads every run from `peer`; false (and why in `error`) when a copy failed.
    bool read(int64_t peer, const std::vector<Run>& runs, std::string& error);
    // Writes every run into `peer`, whose offer the caller checked them against; false (and
    // why in `error`) when a copy failed. Raises when `peer` is gone or gave up this exchange.
    bool write(int64_t peer, const std::vector<Run>& runs, std::string& error);
    // Step 4. True when every member's copies succeeded, false when one failed (every member
    // gets the same answer; the group then moves its data as messages). Raises when a peer is
    // gone or gave up.
    bool finish(bool mine);
    const Fingerprint& operation() const { return operation_; }
    bool readable_in_place(int64_t member, uint64_t address, uint64_t bytes) const {
      return in_place_ && memory_.readable_in_place(member, address, bytes);
    }
    // Where `peer`'s `address` lies here; only for what readable_in_place says lies in its arena.
    const char* in_place(int64_t peer, uint64_t address) const { return memory_.arenas_[static_cast<size_t>(peer)].at(address); }

   private:
    PeerMemory& memory_;
    const bool in_place_;
    Fingerprint operation_;
    uint64_t k_;
    std::vector<std::vector<uint64_t>> offers_;
    bool finished_ = false;
  };

  // True once this member gave up an exchange: it offers and reads nothing from then on.
  bool closed() const { return closed_; }
  // Exchanges started on this group so far: what tells a caller whether a movement went
  // through peer memory at all.
  uint64_t exchanges_started() const { return exchange_; }
  // Whether `bytes` at `address` of `member` (this one included) lie in its shared arena, which
  // every member maps (arena.h): then they are read in place, with no kernel call. Every
  // member gives the same answer for the same words, so holder and receiver agree on who copies.
  bool readable_in_place(int64_t member, uint64_t address, uint64_t bytes) const {
    return reads_in_place_ && arena_ranges_[static_cast<size_t>(member)].covers(address, bytes);
  }
  // Whether every member has an arena that every other one maps. Such a group only reads: no
  // member offers memory for writing, so none writes into another's (the PID-reuse window of
  // the writes below does not exist there).
  bool reads_in_place() const { return reads_in_place_; }

  struct Header;  // a reader's copy of a peer's mailbox

 private:
  explicit PeerMemory(Comm& comm);
  // Reads `peer`'s mailbox words [0, words); false (and why) when it cannot.
  bool read_mailbox(int64_t peer, Header& header, std::string& error) const;
  enum class Direction { Read, Write };
  // Reads what lies in the peer's arena in place where `in_place` and the group can.
  bool copy(int64_t peer, const std::vector<Run>& runs, std::string& error, Direction direction = Direction::Read,
            bool in_place = false) const;
  // The same through cross-memory attach only.
  bool copy_across(int64_t peer, const std::vector<Run>& runs, std::string& error, Direction direction) const;
  std::string name_of(int64_t peer) const;
  // Polls every peer's mailbox until `ready(peer, header)`; raises when a peer is gone or
  // closed, or after the group's timeout.
  template <class Ready>
  void wait_for_everyone(const char* what, uint64_t k, Ready&& ready);
  // Marks exchange `k` given up in this member's mailbox, so that the others raise too.
  void close(uint64_t k);
  // Closes and raises: exchange `k` failed for `why`.
  [[noreturn]] void give_up(uint64_t k, const std::string& why);
  // Waits, at most kLeaveWait, until every peer has posted "seen" for this member's last
  // exchange, has given up, or is gone. Uses nothing of comm_, which may be half destroyed.
  void leave() const noexcept;

  Comm& comm_;
  const int64_t me_;                           // comm_.rank(), for leave()
  const std::chrono::milliseconds timeout_;    // comm_.timeout(), for leave()
  Mailbox* mailbox_;                  // this member's, read by the others; never freed (see .cpp)
  std::vector<int64_t> pids_;         // by group rank
  std::vector<uint64_t> cookies_;     // each member's random identity, by group rank
  std::vector<uint64_t> mailboxes_;   // their addresses, by group rank
  std::vector<ArenaRange> arena_ranges_;  // each member's shared arena, by group rank
  std::vector<MappedArena> arenas_;       // the peers' arenas mapped here (this member's: unmapped)
  bool reads_in_place_ = false;           // every member has an arena and maps every other one
  uint64_t exchange_ = 0;             // exchanges started on this group
  at::Tensor open_to_writes_;         // what the current exchange lets peers write into
  bool closed_ = false;
};

// Off where the environment says SHARDTENSOR_PEER_MEMORY=0: no group is ever probed, and
// TransportOptions::peer_memory defaults to false. Read once; every rank must see the same.
// (Plans switch peer memory off per call or scope with TransportOptions.)
bool peer_memory_enabled();

// The group's peer memory, or null where it is unavailable (one member, NCCL, members on
// other hosts or forbidden to read each other) or switched off. The first call with it switched
// on probes collectively, so every member must make it at the same point, as with any
// collective. Kept as an attachment of `comm` (comm.h), which knows nothing of it.
PeerMemory* peer_memory_of(Comm& comm);
// Why peer_memory_of(comm) is null (empty before the probe, or when it is not null).
const std::string& why_no_peer_memory(Comm& comm);
// After a failed copy (which every member learns of together): messages from then on.
void stop_peer_memory(Comm& comm, const std::string& why);

}  // namespace shardtensor
