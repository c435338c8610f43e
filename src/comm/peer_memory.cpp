// PeerMemory: the probe, the mailbox handshake and the copies (see peer_memory.h).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "comm/peer_memory.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <sys/uio.h>
#include <unistd.h>

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
#include "util/strings.h"

namespace shardtensor {

// A member's mailbox (see the header). Words are written with release stores and read by the
// others one word per read, so a reader that sees `posted` == k then reads k's addresses.
struct Mailbox {
  std::atomic<uint64_t> posted{0};  // the last exchange whose addresses are below
  std::atomic<uint64_t> source{0};
  std::atomic<uint64_t> destination{0};
  std::atomic<uint64_t> done{0};  // 2 * (the last exchange this member finished) + failed
};

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

// A random value this process publishes with its address; a reader that finds it there has
// read the right process.
const int64_t& cookie() {
  static const int64_t value = static_cast<int64_t>((static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}()) | 1;
  return value;
}

std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> flag{[] {
    const char* v = std::getenv("SHARDTENSOR_PEER_MEMORY");
    return !(v && std::string(v) == "0");
  }()};
  return flag;
}

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

}  // namespace

bool peer_memory_enabled() { return enabled_flag().load(std::memory_order_relaxed); }
void set_peer_memory_enabled(bool enabled) { enabled_flag() = enabled; }

// The mailbox is never freed: a peer may still poll it after this member has finished its last
// exchange (it saw every "done", the peer has not yet seen this one's), and a freed mailbox could
// hold anything by then. It is four words per communicator.
PeerMemory::PeerMemory(Comm& comm) : comm_(comm), mailbox_(new Mailbox) {}

std::unique_ptr<PeerMemory> PeerMemory::probe(Comm& comm, std::string& why_not) {
  CommDebugPause pause;  // set-up traffic, not a collective the user asked for
  const int64_t n = comm.size();
  std::unique_ptr<PeerMemory> candidate(new PeerMemory(comm));
  at::Tensor mine = at::tensor(std::vector<int64_t>{static_cast<int64_t>(getpid()), static_cast<int64_t>(reinterpret_cast<uintptr_t>(&cookie())),
                                                    cookie(), host_identity(),
                                                    static_cast<int64_t>(reinterpret_cast<uintptr_t>(candidate->mailbox_))},
                               at::kLong);
  at::Tensor all = at::empty({n, mine.numel()}, at::kLong);
  comm.all_gather(mine, all);
  for (int64_t p = 0; p < n; ++p) {
    candidate->pids_.push_back(all[p][0].item<int64_t>());
    candidate->mailboxes_.push_back(static_cast<uint64_t>(all[p][4].item<int64_t>()));
  }
  bool ok = true;
  for (int64_t p = 0; p < n && ok; ++p) {
    if (p == comm.rank()) continue;
    const int64_t* row = all[p].data_ptr<int64_t>();
    if (row[3] == 0 || row[3] != host_identity()) {
      why_not = "group rank " + std::to_string(p) + " runs on another host or in another PID namespace";
      ok = false;
      continue;
    }
    int64_t seen = 0;
    std::string error;
    if (!candidate->read(p, {{static_cast<uint64_t>(row[1]), &seen, sizeof(seen)}}, error) || seen != row[2]) {
      why_not = "cannot read the memory of group rank " + std::to_string(p) + " (pid " + std::to_string(row[0]) +
                "): " + (error.empty() ? "another value is there" : error);
      // Same host, yet no access: worth saying once, since the fix is the machine's.
      TORCH_WARN_ONCE("shardtensor: ranks on this host ", why_not,
                      "; redistribution goes over Gloo messages instead. Ranks of one user may read each other's memory "
                      "unless Yama's ptrace_scope or a container's seccomp profile forbids process_vm_readv; "
                      "SHARDTENSOR_PEER_MEMORY=0 skips the attempt.");
      ok = false;
    }
  }
  at::Tensor verdict = at::tensor(std::vector<int64_t>{ok ? 1 : 0}, at::kLong);
  comm.all_reduce(verdict, ReduceOp::Min);
  if (verdict.item<int64_t>() == 0) {
    if (why_not.empty()) why_not = "another member of the group cannot read its peers";
    return nullptr;
  }
  return candidate;
}

bool PeerMemory::peek(int64_t peer, size_t field, uint64_t& value, std::string& error) const {
  return read(peer, {{mailboxes_[peer] + field, &value, sizeof(value)}}, error);
}

// Polls every other member's mailbox until `ready(peer)` and raises after the group's timeout.
// Between polls it yields the core (ranks often share cores), then sleeps, longer as the wait
// goes on (20 µs doubling to 320 µs), so that a rank waiting for a busy one costs little CPU.
template <class Ready>
void PeerMemory::wait_for_everyone(const char* what, Ready&& ready) const {
  const auto deadline = std::chrono::steady_clock::now() + comm_.timeout();
  for (int64_t p = 0; p < comm_.size(); ++p) {
    if (p == comm_.rank()) continue;
    for (int polls = 0; !ready(p); ++polls) {
      constexpr int kYields = 64, kSleepsPerStep = 32, kSteps = 4;
      if (polls < kYields) {
        std::this_thread::yield();
        continue;
      }
      TORCH_CHECK(std::chrono::steady_clock::now() < deadline, "shardtensor: all_to_all (peer memory) on the group of global ranks [",
                  join(comm_.global_ranks(), ", "), "] timed out (timeout ", comm_.timeout().count() / 1000.0, " s) waiting for group rank ",
                  p, " to ", what, "; another rank may have stopped before this collective.");
      const int step = std::min((polls - kYields) / kSleepsPerStep, kSteps);
      std::this_thread::sleep_for(std::chrono::microseconds(20 << step));
    }
  }
}

std::vector<PeerMemory::Addresses> PeerMemory::share_addresses(const void* source, const void* destination) {
  const uint64_t k = ++exchange_;
  mailbox_->source.store(reinterpret_cast<uintptr_t>(source), std::memory_order_relaxed);
  mailbox_->destination.store(reinterpret_cast<uintptr_t>(destination), std::memory_order_relaxed);
  mailbox_->posted.store(k, std::memory_order_release);
  auto word = [&](int64_t p, size_t field) {
    uint64_t value = 0;
    std::string error;
    TORCH_CHECK(peek(p, field, value, error), "shardtensor: all_to_all (peer memory) on the group of global ranks [",
                join(comm_.global_ranks(), ", "), "] lost group rank ", p, " (pid ", pids_[p], "): ", error);
    return value;
  };
  wait_for_everyone("post its addresses", [&](int64_t p) { return word(p, offsetof(Mailbox, posted)) >= k; });
  std::atomic_thread_fence(std::memory_order_acquire);  // the addresses were posted before `posted`
  std::vector<Addresses> addresses;
  for (int64_t p = 0; p < comm_.size(); ++p) {
    if (p == comm_.rank())
      addresses.push_back({reinterpret_cast<uintptr_t>(source), reinterpret_cast<uintptr_t>(destination)});
    else
      addresses.push_back({word(p, offsetof(Mailbox, source)), word(p, offsetof(Mailbox, destination))});
  }
  return addresses;
}

bool PeerMemory::read(int64_t peer, const std::vector<Run>& runs, std::string& error) const { return copy(peer, runs, false, error); }
bool PeerMemory::write(int64_t peer, const std::vector<Run>& runs, std::string& error) const { return copy(peer, runs, true, error); }

bool PeerMemory::copy(int64_t peer, const std::vector<Run>& runs, bool to_peer, std::string& error) const {
  std::vector<iovec> local, remote;
  // Up to IOV_MAX runs per call, so that neither side's list can exceed it.
  for (size_t begin = 0; begin < runs.size(); begin += IOV_MAX) {
    const size_t end = std::min(runs.size(), begin + static_cast<size_t>(IOV_MAX));
    iovecs_of(runs, begin, end, local, remote);
    size_t wanted = 0;
    for (const iovec& v : local) wanted += v.iov_len;
    const pid_t pid = static_cast<pid_t>(pids_[peer]);
    const ssize_t done = to_peer ? process_vm_writev(pid, local.data(), local.size(), remote.data(), remote.size(), 0)
                                 : process_vm_readv(pid, local.data(), local.size(), remote.data(), remote.size(), 0);
    const char* call = to_peer ? "process_vm_writev" : "process_vm_readv";
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

bool PeerMemory::all_succeeded(bool mine) {
  const uint64_t k = exchange_;
  std::atomic_thread_fence(std::memory_order_release);  // this member's copies come before its "done"
  mailbox_->done.store(2 * k + (mine ? 0 : 1), std::memory_order_release);
  bool everyone = mine;
  wait_for_everyone("finish copying", [&](int64_t p) {
    uint64_t done = 0;
    std::string error;
    // A peer that cannot be read any more has exited, and it exits only after this exchange:
    // had its copies failed, it would be falling back to messages with everyone, not exiting.
    // What this member copied from it was complete before its "done".
    if (!peek(p, offsetof(Mailbox, done), done, error)) return true;
    if (done / 2 < k) return false;
    if (done / 2 == k && done % 2 == 1) everyone = false;
    return true;
  });
  // What the others wrote here happened before their "done": see it before reading on.
  std::atomic_thread_fence(std::memory_order_acquire);
  return everyone;
}

}  // namespace shardtensor
