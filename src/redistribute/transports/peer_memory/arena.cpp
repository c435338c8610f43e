// The shared arena (arena.h): a memfd mapping, carved into blocks by size class, installed as
// c10's CPU allocator; and a peer's arena mapped for reading.
#include "redistribute/transports/peer_memory/arena.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <unordered_map>
#include <vector>

#include "util/torch_compat.h"

namespace shardtensor {
namespace {

// Byte 0 holds the cookie; blocks start after this much, so every block is 64 KiB-aligned.
constexpr size_t kHeaderBytes = kArenaMinBytes;
constexpr uint64_t kDefaultCapacity = uint64_t{16} << 30;

// Sizes round up to one of four classes per power of two (at most a third more than asked),
// so that a freed block serves the next tensor of about its size: blocks are cached, never
// split or merged, as in c10's CUDA caching allocator.
size_t class_bytes(size_t n) {
  const int top = 63 - __builtin_clzll(n);  // floor(log2 n): 16 or more, since n >= 64 KiB
  const size_t step = size_t{1} << (top - 2);
  return (n + step - 1) / step * step;
}

void release_block(void* block);
void release_any(void* data);

class ArenaAllocator final : public c10::Allocator {
 public:
  ArenaAllocator(c10::Allocator* fallback, int fd, char* base, size_t capacity, uint64_t cookie)
      : fallback_(fallback), fd_(fd), base_(base), capacity_(capacity), cookie_(cookie) {}

  c10::DataPtr allocate(size_t n) SHARDTENSOR_ALLOCATE_CONST override {
    if (n < kArenaMinBytes || !active_.load(std::memory_order_relaxed)) return fallback_->allocate(n);
    if (char* block = const_cast<ArenaAllocator*>(this)->take(class_bytes(n)))
      return {block, block, &release_block, c10::Device(c10::DeviceType::CPU)};
    const_cast<ArenaAllocator*>(this)->fallbacks_.fetch_add(1, std::memory_order_relaxed);
    TORCH_WARN_ONCE("shardtensor: the shared arena (SHARDTENSOR_ARENA_BYTES=", capacity_,
                    ") is full; larger tensors are allocated outside it from now on, and peers on this host copy them through "
                    "cross-memory attach instead of reading them in place.");
    return fallback_->allocate(n);
  }
  // Pure in 2.x (a plain memcpy, as c10's own CPU allocator), absent in 1.13.
  void copy_data(void* dest, const void* src, std::size_t count) const { std::memcpy(dest, src, count); }
  // raw_allocate / raw_deallocate (c10's, used by some extensions): a block of the arena or one
  // of the allocator it replaced, told apart by address.
  c10::DeleterFnPtr raw_deleter() const override { return &release_any; }

  bool owns(const void* data) const { return range().covers(reinterpret_cast<uintptr_t>(data), 1); }
  void release_foreign(void* data) const { fallback_->raw_deleter()(data); }

  void give_back(void* block) {
    if (forked_.load(std::memory_order_relaxed)) return;  // a child's copy of the parent's books
    std::lock_guard<std::mutex> lock(mutex_);
    const auto found = in_use_.find(static_cast<char*>(block));
    TORCH_INTERNAL_ASSERT(found != in_use_.end(), "shardtensor: the arena was handed back a block it never gave out");
    free_[found->second].push_back(found->first);
    in_use_.erase(found);
  }

  // In a forked child: what the child writes into the parent's tensors stays its own (a private
  // mapping of the file, copy-on-write), and it allocates elsewhere (it is no rank its peers
  // know). Unlike fork's snapshot, a page the child has not written shows the parent's later
  // writes (arena.h). Where the private mapping cannot be made (no memory to commit it), the
  // child may only read the arena: a write then faults instead of reaching the parent.
  void after_fork_in_child() {
    forked_.store(true);
    active_.store(false);
    if (mmap(base_, capacity_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED | MAP_NORESERVE, fd_, 0) == MAP_FAILED)
      mprotect(base_, capacity_, PROT_READ);
  }

  ArenaRange range() const {
    if (forked_.load(std::memory_order_relaxed)) return {};
    return {reinterpret_cast<uintptr_t>(base_), capacity_, fd_, cookie_};
  }

  ArenaStatistics statistics() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {in_use_.size(), next_, fallbacks_.load(std::memory_order_relaxed)};
  }

 private:
  char* take(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    char* block = nullptr;
    std::vector<char*>& cached = free_[bytes];
    if (!cached.empty()) {
      block = cached.back();
      cached.pop_back();
    } else if (capacity_ - next_ >= bytes) {
      block = base_ + next_;
      next_ += bytes;
    } else {
      return nullptr;
    }
    in_use_.emplace(block, bytes);
    return block;
  }

  c10::Allocator* const fallback_;
  const int fd_;
  char* const base_;
  const size_t capacity_;
  const uint64_t cookie_;
  std::atomic<bool> active_{true}, forked_{false};
  std::mutex mutex_;
  size_t next_ = kHeaderBytes;                       // the first byte never handed out
  std::map<size_t, std::vector<char*>> free_;        // cached blocks, by class
  std::unordered_map<char*, size_t> in_use_;         // block -> its class
  std::atomic<uint64_t> fallbacks_{0};
};

// Never destroyed: tensors in it may outlive every static.
ArenaAllocator* arena = nullptr;

void release_block(void* block) { arena->give_back(block); }

void release_any(void* data) {
  if (arena->owns(data))
    arena->give_back(data);
  else
    arena->release_foreign(data);
}

uint64_t capacity_from_environment() {
  const char* v = std::getenv("SHARDTENSOR_ARENA_BYTES");
  if (!v || !*v) return kDefaultCapacity;
  char* end = nullptr;
  const unsigned long long bytes = std::strtoull(v, &end, 10);
  TORCH_CHECK(end && *end == '\0' && bytes >= 2 * kHeaderBytes, "shardtensor: SHARDTENSOR_ARENA_BYTES=", v,
              " is not a byte count of at least ", 2 * kHeaderBytes);
  return bytes;
}

void install() {
  const char* v = std::getenv("SHARDTENSOR_ARENA");
  if (!v || std::string(v) != "1") return;
  uint64_t capacity = 0;
  try {  // at library load: a bad value must not end the process
    capacity = capacity_from_environment();
  } catch (const c10::Error& e) {
    TORCH_WARN(e.what_without_backtrace(), "; the shared arena stays off.");
    return;
  }
  const int fd = memfd_create("shardtensor-arena", MFD_CLOEXEC);
  void* base = MAP_FAILED;
  if (fd >= 0 && ftruncate(fd, static_cast<off_t>(capacity)) == 0)
    base = mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (base == MAP_FAILED) {
    TORCH_WARN("shardtensor: SHARDTENSOR_ARENA=1, but no shared arena of ", capacity, " bytes could be made (", std::strerror(errno),
               "); tensors stay in private memory.");
    if (fd >= 0) close(fd);
    return;
  }
  // A cookie from the address and the clock where the random device is unavailable: it names
  // this arena among the host's, it guards nothing secret.
  uint64_t cookie = reinterpret_cast<uintptr_t>(base) ^ static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  try {
    cookie = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  } catch (const std::exception&) {
  }
  cookie |= 1;
  std::memcpy(base, &cookie, sizeof(cookie));
  arena = new ArenaAllocator(c10::GetCPUAllocator(), fd, static_cast<char*>(base), capacity, cookie);
  pthread_atfork(nullptr, nullptr, [] { arena->after_fork_in_child(); });
  c10::SetCPUAllocator(arena, /*priority=*/1);
}

// A program that links the library and sets SHARDTENSOR_ARENA=1 gets the arena before its
// first tensor.
[[maybe_unused]] const bool installed_at_load = (install_arena_if_enabled(), true);

}  // namespace

void install_arena_if_enabled() {
  static std::once_flag once;
  std::call_once(once, install);
}

ArenaRange own_arena() { return arena ? arena->range() : ArenaRange{}; }

ArenaStatistics arena_statistics() { return arena ? arena->statistics() : ArenaStatistics{}; }

MappedArena::MappedArena(MappedArena&& other) noexcept : range_(other.range_), local_(other.local_) { other.local_ = nullptr; }

MappedArena& MappedArena::operator=(MappedArena&& other) noexcept {
  if (this != &other) {
    this->~MappedArena();
    range_ = other.range_;
    local_ = other.local_;
    other.local_ = nullptr;
  }
  return *this;
}

MappedArena::~MappedArena() {
  if (local_) munmap(const_cast<char*>(local_), range_.capacity);
  local_ = nullptr;
}

bool MappedArena::map(int64_t pid, const ArenaRange& range, std::string& error) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(range.fd);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    error = "cannot open " + path + ": " + std::strerror(errno);
    return false;
  }
  // What that descriptor names now must be at least the arena's size: a shorter file would
  // fault when read past its end.
  struct stat about {};
  void* local = MAP_FAILED;
  if (fstat(fd, &about) == 0 && static_cast<uint64_t>(about.st_size) >= range.capacity)
    local = mmap(nullptr, range.capacity, PROT_READ, MAP_SHARED | MAP_NORESERVE, fd, 0);
  else
    errno = EINVAL;
  const int why = errno;
  close(fd);
  if (local == MAP_FAILED) {
    error = "cannot map " + path + ": " + std::strerror(why);
    return false;
  }
  uint64_t cookie = 0;
  std::memcpy(&cookie, local, sizeof(cookie));
  if (cookie != range.cookie) {
    munmap(local, range.capacity);
    error = path + " is not the arena that process offered (its PID names another process now)";
    return false;
  }
  this->~MappedArena();
  range_ = range;
  local_ = static_cast<const char*>(local);
  return true;
}

}  // namespace shardtensor
