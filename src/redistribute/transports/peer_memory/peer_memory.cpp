// PeerMemory: the probe, the mailbox protocol and the copies (see peer_memory.h).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "redistribute/transports/peer_memory/peer_memory.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <thread>

#include "comm/comm.h"
#include "comm/comm_debug.h"
#include "comm/traced_collectives.h"
#include "util/below_tracer_modes.h"
#include "util/strings.h"

namespace shardtensor {

// A member's mailbox (see the header), read by the others. The first four words are what a
// waiting peer polls; the rest describe the posted exchange and are written before `posted`
// (release), so a reader that sees `posted` == k and then reads them gets k's.
constexpr size_t kDescriptionBytes = 200;
struct alignas(64) Mailbox {
  std::atomic<uint64_t> cookie{0};  // this member's random identity; never changes
  std::atomic<uint64_t> posted{0};  // the last exchange whose operation and offers are below
  std::atomic<uint64_t> done{0};    // 2 * (the last exchange this member finished) + failed
  std::atomic<uint64_t> closed{0};  // non-zero: the exchange this member gave up; it is gone
  std::atomic<uint64_t> seen{0};    // the last exchange whose every "done" this member has seen
  std::atomic<uint64_t> operation{0};
  std::atomic<uint64_t> table{0};  // address of the offers
  std::atomic<uint64_t> table_words{0};
  char description[kDescriptionBytes] = {0};
  std::atomic<uint64_t> written{0};  // what the probe writes, to learn whether peers may write here
};

// A reader's copy of a mailbox: the same layout, as plain words.
struct PeerMemory::Header {
  uint64_t cookie, posted, done, closed, seen, operation, table, table_words;
  char description[kDescriptionBytes];
};
static_assert(sizeof(PeerMemory::Header) <= sizeof(Mailbox) && offsetof(PeerMemory::Header, description) == offsetof(Mailbox, description),
              "a Header mirrors a Mailbox");
constexpr size_t kPolledBytes = 5 * sizeof(uint64_t);  // cookie, posted, done, closed, seen

// How long a member that leaves its group waits for its peers to see its last "done": they are
// normally a scheduling delay behind; one that is stopped must not hold up this process's exit
// for the whole timeout.
constexpr std::chrono::milliseconds kLeaveWait{5000};

namespace {

// Which machine and PID namespace this process runs in: a PID names the same process for two
// members only when both agree on this.
int64_t host_identity() {
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  char ns[256] = {0};
  const ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
  if (boot_id.empty() || n <= 0) return 0;  // unknown: the probe fails
  return static_cast<int64_t>(std::hash<std::string>{}(boot_id + "/" + std::string(ns, static_cast<size_t>(n))));
}

uint64_t random_cookie() { return ((static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}()) | 1; }


// The iovec lists for runs[begin, end): each side's adjacent stretches become one, since the
// kernel pins the other process's memory stretch by stretch.
void iovecs_of(const std::vector<PeerMemory::Run>& runs, size_t begin, size_t end, std::vector<iovec>& local, std::vector<iovec>& remote) {
  local.clear();
  remote.clear();
  for (size_t i = begin; i < end; ++i) {
    const PeerMemory::Run& r = runs[i];
    if (!local.empty() && static_cast<char*>(local.back().iov_base) + local.back().iov_len == r.local)
      local.back().iov_len += r.bytes;
    else
      local.push_back({r.local, r.bytes});
    void* at = reinterpret_cast<void*>(static_cast<uintptr_t>(r.remote));
    if (!remote.empty() && static_cast<char*>(remote.back().iov_base) + remote.back().iov_len == at)
      remote.back().iov_len += r.bytes;
    else
      remote.push_back({at, r.bytes});
  }
}

// A buffer that this member offered for writing in an exchange it left by an error. A peer that
// checked the offer before this member gave up may have been stopped since, and may write at
// any time after it resumes: the buffer is never freed. Its storage keeps one reference that
// nothing drops (taking it allocates nothing, so it cannot fail on an error path). A group uses
// messages after a failure, so this keeps at most one exchange's buffer per group.
void keep_for_late_writers(const at::Tensor& buffer) {
  c10::raw::intrusive_ptr::incref(buffer.storage().unsafeGetStorageImpl());
}

// The most offer words a member reads from a peer: far above any exchange's (a few words per
// part), and a bound on what a corrupt or hostile table could make this member allocate.
constexpr uint64_t kMaxOfferWords = uint64_t{1} << 20;

}  // namespace

namespace {

// What a communicator keeps of its peer memory: the probe's result, and why it is null.
struct PeerMemoryState final : Comm::Attachment {
  std::unique_ptr<PeerMemory> memory;
  bool probed = false;
  std::string why_not;
};

const char kStateKey = 0;  // its address names the attachment

PeerMemoryState& state_of(Comm& comm) {
  std::unique_ptr<Comm::Attachment>& slot = comm.attachment(&kStateKey);
  if (!slot) slot = std::make_unique<PeerMemoryState>();
  return static_cast<PeerMemoryState&>(*slot);
}

}  // namespace

PeerMemory* peer_memory_of(Comm& comm) {
  // Host memory only: a CUDA group (NCCL) moves device tensors, and its probe would need them.
  if (comm.size() == 1 || !peer_memory_enabled() || comm.backend_name() == "nccl") return nullptr;
  PeerMemoryState& state = state_of(comm);
  if (!state.probed) {
    // The first move on a group may come while torch.compile traces (a from_local inside the
    // compiled region), on the group's traced Comm: the probe runs on its eager one, its
    // messages and tensors real even then (below the tracer's modes, counted as eager mode's);
    // the graph records the moves that use the memory, not the probe.
    const TracingPause real_messages;
    const BelowTracerModes real_tensors;
    state.memory = PeerMemory::probe(comm.eager(), state.why_not);
    state.probed = true;
  }
  // A member that gave up an exchange (an error) never offers or reads through memory again.
  if (state.memory && state.memory->closed()) stop_peer_memory(comm, "an exchange through peer memory failed on this rank");
  return state.memory.get();
}

const std::string& why_no_peer_memory(Comm& comm) { return state_of(comm).why_not; }

void stop_peer_memory(Comm& comm, const std::string& why) {
  PeerMemoryState& state = state_of(comm);
  state.memory.reset();
  state.why_not = why;
  state.probed = true;
}

bool peer_memory_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("SHARDTENSOR_PEER_MEMORY");
    return !(v && std::string(v) == "0");
  }();
  return enabled;
}

// The mailbox is never freed: a peer may still poll it after this member has finished its last
// exchange (it saw every "done", the peer has not yet seen this one's), and a freed mailbox could
// hold anything by then. It is 256 bytes per communicator.
PeerMemory::PeerMemory(Comm& comm) : comm_(comm), me_(comm.rank()), timeout_(comm.timeout()), mailbox_(new Mailbox) {
  mailbox_->cookie.store(random_cookie());
}
PeerMemory::~PeerMemory() {
  if (open_to_writes_.defined()) keep_for_late_writers(open_to_writes_);  // an exchange was never closed: keep what it offered
  leave();
}

void PeerMemory::leave() const noexcept {
  const uint64_t k = exchange_;
  // A member that gave up, or never finished its last exchange, owes its peers nothing: they
  // raise on its closed mailbox or at their own end of that exchange.
  if (k == 0 || closed_ || mailbox_->seen.load(std::memory_order_acquire) != k) return;
  const auto deadline = std::chrono::steady_clock::now() + std::min(timeout_, kLeaveWait);
  try {
    for (size_t p = 0; p < pids_.size(); ++p) {
      if (static_cast<int64_t>(p) == me_) continue;
      for (;;) {
        Header header;
        std::string error;
        const bool gone = !copy_across(static_cast<int64_t>(p), {{mailboxes_[p], &header, kPolledBytes}}, error, Direction::Read) ||
                          header.cookie != cookies_[p];
        if (gone || header.seen >= k || header.closed != 0) break;
        if (std::chrono::steady_clock::now() >= deadline) return;
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  } catch (...) {  // an allocation failed: leave without waiting
  }
}

std::unique_ptr<PeerMemory> PeerMemory::probe(Comm& comm, std::string& why_not) {
  CommDebugPause pause;  // set-up traffic, not a collective the user asked for
  const int64_t n = comm.size();
  std::unique_ptr<PeerMemory> candidate(new PeerMemory(comm));
  const uint64_t cookie = candidate->mailbox_->cookie.load();
  const ArenaRange arena = own_arena();
  at::Tensor mine = at::tensor(std::vector<int64_t>{static_cast<int64_t>(getpid()), static_cast<int64_t>(cookie), host_identity(),
                                                    static_cast<int64_t>(reinterpret_cast<uintptr_t>(candidate->mailbox_)),
                                                    static_cast<int64_t>(arena.base), static_cast<int64_t>(arena.capacity), arena.fd,
                                                    static_cast<int64_t>(arena.cookie)},
                               at::kLong);
  at::Tensor all = at::empty({n, mine.numel()}, at::kLong);
  comm.all_gather(mine, all);
  for (int64_t p = 0; p < n; ++p) {
    const int64_t* row = all[p].data_ptr<int64_t>();
    candidate->pids_.push_back(row[0]);
    candidate->cookies_.push_back(static_cast<uint64_t>(row[1]));
    candidate->mailboxes_.push_back(static_cast<uint64_t>(row[3]));
    candidate->arena_ranges_.push_back({static_cast<uint64_t>(row[4]), static_cast<uint64_t>(row[5]), row[6], static_cast<uint64_t>(row[7])});
  }
  bool ok = true;
  for (int64_t p = 0; p < n && ok; ++p) {
    if (p == comm.rank()) continue;
    const int64_t* row = all[p].data_ptr<int64_t>();
    if (row[2] == 0 || row[2] != host_identity()) {
      why_not = "group rank " + std::to_string(p) + " runs on another host or in another PID namespace";
      ok = false;
      continue;
    }
    Header header;
    std::string error;
    uint64_t written = cookie;
    const bool writes = candidate->read_mailbox(p, header, error) && header.cookie == candidate->cookies_[p] &&
                        candidate->copy(p, {{row[3] + offsetof(Mailbox, written), &written, sizeof(written)}}, error, Direction::Write);
    if (!writes) {
      why_not = "cannot read and write the memory of group rank " + std::to_string(p) + " (pid " + std::to_string(row[0]) +
                "): " + (error.empty() ? "another value is there" : error);
      // Same host, yet no access: worth saying once, since the fix is the machine's.
      TORCH_WARN_ONCE("shardtensor: ranks on this host ", why_not,
                      "; redistribution goes over Gloo messages instead. Ranks of one user may read each other's memory "
                      "unless Yama's ptrace_scope or a container's seccomp profile forbids process_vm_readv or process_vm_writev; "
                      "SHARDTENSOR_PEER_MEMORY=0 skips the attempt.");
      ok = false;
    }
  }
  // Reads in place need every member's arena mapped by every other one; a member that cannot
  // map one keeps the group on cross-memory attach.
  bool maps_every_arena = ok;
  candidate->arenas_.resize(static_cast<size_t>(n));
  for (int64_t p = 0; p < n && maps_every_arena; ++p) {
    if (candidate->arena_ranges_[p].base == 0) maps_every_arena = false;
    if (p == comm.rank() || !maps_every_arena) continue;
    std::string error;
    if (!candidate->arenas_[p].map(candidate->pids_[p], candidate->arena_ranges_[p], error)) {
      TORCH_WARN_ONCE("shardtensor: cannot map the shared arena of group rank ", p, " (", error,
                      "); ranks on this host copy through cross-memory attach instead of reading in place.");
      maps_every_arena = false;
    }
  }
  at::Tensor verdict = at::tensor(std::vector<int64_t>{ok ? 1 : 0, maps_every_arena ? 1 : 0}, at::kLong);
  comm.all_reduce(verdict, ReduceOp::Min);
  if (verdict[0].item<int64_t>() == 0) {
    if (why_not.empty()) why_not = "another member of the group cannot read its peers";
    return nullptr;
  }
  candidate->reads_in_place_ = verdict[1].item<int64_t>() == 1;
  if (!candidate->reads_in_place_) candidate->arenas_.clear();
  return candidate;
}

bool PeerMemory::read_mailbox(int64_t peer, Header& header, std::string& error) const {
  return copy(peer, {{mailboxes_[peer], &header, sizeof(Header)}}, error);
}

std::string PeerMemory::name_of(int64_t peer) const {
  return "group rank " + std::to_string(peer) + " (global rank " + std::to_string(comm_.global_ranks()[peer]) + ", pid " +
         std::to_string(pids_[peer]) + ")";
}

void PeerMemory::close(uint64_t k) {
  mailbox_->closed.store(k, std::memory_order_release);
  closed_ = true;
  if (open_to_writes_.defined()) keep_for_late_writers(open_to_writes_);
  open_to_writes_ = at::Tensor();
}

void PeerMemory::give_up(uint64_t k, const std::string& why) {
  close(k);
  TORCH_CHECK(false, "shardtensor: exchange through peer memory on ", comm_.group_name(), " failed: ", why);
}

// Polls every other member's mailbox until `ready(peer, header)`. Between polls it yields the
// core (ranks often share cores), then sleeps, longer as the wait goes on (20 µs doubling to
// 320 µs), so that a rank waiting for a busy one costs little CPU. Every failure closes this
// member's mailbox before it raises, so that the others raise too.
template <class Ready>
void PeerMemory::wait_for_everyone(const char* what, uint64_t k, Ready&& ready) {
  const auto deadline = std::chrono::steady_clock::now() + comm_.timeout();
  auto raise = [&](const std::string& why) { give_up(k, std::string("while waiting for ") + what + ": " + why); };
  for (int64_t p = 0; p < comm_.size(); ++p) {
    if (p == comm_.rank()) continue;
    for (int polls = 0;; ++polls) {
      Header header;
      std::string error;
      if (!copy(p, {{mailboxes_[p], &header, kPolledBytes}}, error))
        raise(name_of(p) + " cannot be read any more (" + error + "): it exited or was killed");
      if (header.cookie != cookies_[p]) raise(name_of(p) + " is gone: its PID now names another process");
      // What the peer posted before it gave up still counts: it finished the exchange this
      // member waits on, or it posted another operation (the error should name both).
      if (ready(p, header)) break;
      if (header.closed != 0)
        raise(name_of(p) + " gave up its exchange #" + std::to_string(header.closed) + " (it timed out or raised an error)");
      constexpr int kYields = 64, kSleepsPerStep = 32, kSteps = 4;
      if (polls < kYields) {
        std::this_thread::yield();
        continue;
      }
      if (std::chrono::steady_clock::now() >= deadline)
        raise("timed out (timeout " + std::to_string(comm_.timeout().count() / 1000.0) + " s) waiting for " + name_of(p) +
              "; another rank may have stopped before this collective");
      const int step = std::min((polls - kYields) / kSleepsPerStep, kSteps);
      std::this_thread::sleep_for(std::chrono::microseconds(20 << step));
    }
  }
}

PeerMemory::Exchange::Exchange(PeerMemory& memory, const Fingerprint& operation, const std::vector<uint64_t>& offers, bool in_place,
                               const std::function<void()>& while_peers_post, const at::Tensor& open_to_writes)
    : memory_(memory), in_place_(in_place), operation_(operation), k_(++memory.exchange_), offers_(memory.comm_.size()) {
  TORCH_CHECK(!memory.closed_, "shardtensor: internal error: an exchange started on a closed peer memory");
  TORCH_INTERNAL_ASSERT(!memory.open_to_writes_.defined(), "an exchange started while the last one still offers a buffer");
  memory.open_to_writes_ = open_to_writes;  // before the post: from then on a peer may write
  Mailbox& box = *memory.mailbox_;
  box.operation.store(operation.hash, std::memory_order_relaxed);
  box.table.store(reinterpret_cast<uintptr_t>(offers.data()), std::memory_order_relaxed);
  box.table_words.store(offers.size(), std::memory_order_relaxed);
  std::strncpy(box.description, operation.description.c_str(), kDescriptionBytes - 1);
  box.posted.store(k_, std::memory_order_release);
  // The destructor does not run for a constructor that throws: whatever raises from here on
  // (a peer's error, local work, an allocation) closes this member's mailbox first.
  try {
    fault_point("peer_memory:posted");
    if (while_peers_post) while_peers_post();
    memory.wait_for_everyone("every member to post the same exchange", k_, [&](int64_t p, const Header& polled) {
      if (polled.posted < k_) return false;
      Header header;
      std::string error;
      if (!memory.read_mailbox(p, header, error)) memory.give_up(k_, memory.name_of(p) + " cannot be read any more (" + error + ")");
      if (header.posted != k_)
        memory.give_up(k_, memory.name_of(p) + " is at exchange #" + std::to_string(header.posted) + " where this rank is at #" +
                               std::to_string(k_) + ": the ranks ran different sequences of collectives");
      if (header.operation != operation_.hash)
        memory.give_up(k_, different_operations(memory.comm_.group_name(), memory.comm_.rank(), operation_.description, k_, memory.name_of(p),
                                                std::string(header.description, strnlen(header.description, kDescriptionBytes)), header.posted));
      // Posted, then gave up: its offers may be freed already, and must not be read.
      if (header.closed == k_) memory.give_up(k_, memory.name_of(p) + " gave up this exchange (it timed out or raised an error)");
      if (header.table_words > kMaxOfferWords)
        memory.give_up(k_, memory.name_of(p) + " posts " + std::to_string(header.table_words) + " offer words, more than the " +
                               std::to_string(kMaxOfferWords) + " any exchange makes: its mailbox is corrupt");
      offers_[p].resize(header.table_words);
      if (header.table_words > 0 && !memory.copy(p, {{header.table, offers_[p].data(), header.table_words * sizeof(uint64_t)}}, error))
        memory.give_up(k_, "cannot read the offers of " + memory.name_of(p) + " (" + error + ")");
      return true;
    });
  } catch (...) {
    memory.close(k_);  // give_up closed it already where it raised; closing twice is harmless
    throw;
  }
}

PeerMemory::Exchange::~Exchange() {
  if (!finished_) memory_.close(k_);  // an error left this exchange: no one may trust it now
}

bool PeerMemory::Exchange::read(int64_t peer, const std::vector<Run>& runs, std::string& error) {
  fault_point("peer_memory:read");
  return memory_.copy(peer, runs, error, Direction::Read, in_place_);
}

bool PeerMemory::Exchange::write(int64_t peer, const std::vector<Run>& runs, std::string& error) {
  // Re-identified right before the write: a peer that is gone, or no longer the process that
  // joined, is never written into; one that gave up keeps the buffer, but this exchange failed.
  Header header;
  std::string why;
  if (!memory_.copy(peer, {{memory_.mailboxes_[peer], &header, kPolledBytes}}, why))
    memory_.give_up(k_, memory_.name_of(peer) + " cannot be read any more (" + why + "): it exited or was killed");
  if (header.cookie != memory_.cookies_[peer]) memory_.give_up(k_, memory_.name_of(peer) + " is gone: its PID now names another process");
  if (header.closed == k_) memory_.give_up(k_, memory_.name_of(peer) + " gave up this exchange (it timed out or raised an error)");
  // A writer stopped here writes after the peer may have given up: into the buffer it keeps.
  fault_point("peer_memory:write");
  return memory_.copy(peer, runs, error, Direction::Write);
}

bool PeerMemory::Exchange::finish(bool mine) {
  fault_point("peer_memory:finish");
  std::atomic_thread_fence(std::memory_order_release);  // this member's copies come before its "done"
  memory_.mailbox_->done.store(2 * k_ + (mine ? 0 : 1), std::memory_order_release);
  fault_point("peer_memory:done");
  bool everyone = mine;
  memory_.wait_for_everyone("every member to finish copying", k_, [&](int64_t p, const Header& polled) {
    // A peer that marked itself done and then gave up this exchange left it while this member
    // may still have been copying from or into its buffers: what was copied cannot be trusted.
    // Read after this member's copies, "not closed" means the peer was still waiting here, its
    // buffers alive.
    if (polled.closed == k_) memory_.give_up(k_, memory_.name_of(p) + " gave up this exchange while it was being read");
    if (polled.done / 2 < k_) return false;
    if (polled.done / 2 == k_ && polled.done % 2 == 1) everyone = false;
    return true;
  });
  std::atomic_thread_fence(std::memory_order_acquire);  // the peers' writes come before their "done"
  memory_.mailbox_->seen.store(k_, std::memory_order_release);
  finished_ = true;
  memory_.open_to_writes_ = at::Tensor();  // every writer is done
  return everyone;
}

bool PeerMemory::copy(int64_t peer, const std::vector<Run>& runs, std::string& error, Direction direction, bool in_place) const {
  if (direction == Direction::Read && in_place && reads_in_place_) {
    const MappedArena& arena = arenas_[static_cast<size_t>(peer)];
    const auto in_arena = [&](const Run& r) { return arena.range().covers(r.remote, r.bytes); };
    if (std::any_of(runs.begin(), runs.end(), in_arena)) {
      // The peer's post was read before this: its bytes are there.
      std::atomic_thread_fence(std::memory_order_acquire);
      std::vector<Run> elsewhere;
      for (const Run& r : runs) {
        if (in_arena(r))
          std::memcpy(r.local, arena.at(r.remote), r.bytes);
        else
          elsewhere.push_back(r);
      }
      return elsewhere.empty() || copy_across(peer, elsewhere, error, direction);
    }
  }
  return copy_across(peer, runs, error, direction);
}

bool PeerMemory::copy_across(int64_t peer, const std::vector<Run>& runs, std::string& error, Direction direction) const {
  std::vector<iovec> local, remote;
  // Up to IOV_MAX runs per call, so that neither side's list can exceed it.
  for (size_t begin = 0; begin < runs.size(); begin += IOV_MAX) {
    const size_t end = std::min(runs.size(), begin + static_cast<size_t>(IOV_MAX));
    iovecs_of(runs, begin, end, local, remote);
    size_t wanted = 0;
    for (const iovec& v : local) wanted += v.iov_len;
    const pid_t pid = static_cast<pid_t>(pids_[peer]);
    const bool reads = direction == Direction::Read;
    const ssize_t done = reads ? process_vm_readv(pid, local.data(), local.size(), remote.data(), remote.size(), 0)
                               : process_vm_writev(pid, local.data(), local.size(), remote.data(), remote.size(), 0);
    const char* call = reads ? "process_vm_readv" : "process_vm_writev";
    if (done < 0) {
      error = std::string(call) + ": " + std::strerror(errno);
      return false;
    }
    if (static_cast<size_t>(done) != wanted) {
      error = std::string(call) + " copied " + std::to_string(done) + " of " + std::to_string(wanted) + " bytes";
      return false;
    }
  }
  return true;
}

}  // namespace shardtensor
