// Copying straight between group members' memory, for members that are processes on this host.
//
// Over Gloo, bytes between two processes on one host cross a loopback socket: the sender packs
// them into a contiguous message, the kernel copies them into the socket and out again. Linux's
// cross-memory attach (process_vm_readv / process_vm_writev) copies them once, straight from the
// holder's tensor into the receiver's, with no packing: strided parts travel as lists of runs.
// It is what MPI libraries use within a node. The kernel pins the other process's pages run by
// run, so a part is read when it is contiguous in the holder and written when it is contiguous
// in the receiver.
//
// Coordination goes through a small mailbox in each member's memory, which the others read the
// same way: a member posts the addresses of its source and destination for exchange k, the
// others wait for them, copy, and post "done k" (with whether they succeeded); a member returns
// only when every member is done, so no source or destination changes while others use it.
// Small Gloo collectives would do the same but cost 0.1 ms each, and 2-5 ms in one call out of
// four on a busy machine.
// A member that never arrives makes the others raise after the group's timeout, as a
// collective would; one that died before posting makes them raise at once.
//
// Whether a group may use it is probed collectively (over c10d), once per communicator: every
// member must run on this host, in this PID namespace, and be allowed to read the others (same
// user, no seccomp or Yama rule against it). The probe reads a random cookie from every peer
// and compares it with the value the peer published, so a wrong process is never read.
// SHARDTENSOR_PEER_MEMORY=0 turns it off.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace shardtensor {

class Comm;
struct Mailbox;

class PeerMemory {
 public:
  // Collective over `comm`: every member gets the same answer (null where any member cannot
  // read every other one; `why_not` then says why, on the members that know).
  static std::unique_ptr<PeerMemory> probe(Comm& comm, std::string& why_not);

  // One contiguous stretch of `bytes`: at address `remote` in the peer and `local` here.
  struct Run {
    uint64_t remote;
    void* local;
    size_t bytes;
  };
  struct Addresses {
    uint64_t source, destination;
  };

  // Starts an exchange: posts this member's source and destination and returns every member's,
  // by group rank, once they have all posted theirs.
  std::vector<Addresses> share_addresses(const void* source, const void* destination);
  // Copies every run from `peer`'s memory to this process's (read) or the other way (write); on
  // failure returns false and says why in `error`.
  bool read(int64_t peer, const std::vector<Run>& runs, std::string& error) const;
  bool write(int64_t peer, const std::vector<Run>& runs, std::string& error) const;
  // Ends the exchange: posts whether this member's copies succeeded and waits until every
  // member has posted; true when all succeeded. After it every source and destination may
  // change or be freed.
  bool all_succeeded(bool mine);

 private:
  explicit PeerMemory(Comm& comm);
  // One word of `peer`'s mailbox; false when the peer cannot be read (it has exited).
  bool peek(int64_t peer, size_t field, uint64_t& value, std::string& error) const;
  bool copy(int64_t peer, const std::vector<Run>& runs, bool to_peer, std::string& error) const;
  template <class Ready>
  void wait_for_everyone(const char* what, Ready&& ready) const;

  Comm& comm_;
  Mailbox* mailbox_;                  // this member's, read by the others; never freed (see .cpp)
  std::vector<int64_t> pids_;         // by group rank
  std::vector<uint64_t> mailboxes_;   // their addresses, by group rank
  uint64_t exchange_ = 0;             // exchanges started on this group
};

// Switched off where the environment says SHARDTENSOR_PEER_MEMORY=0; tests switch it to run
// both transports. Every rank must hold the same setting.
bool peer_memory_enabled();
void set_peer_memory_enabled(bool enabled);

}  // namespace shardtensor
