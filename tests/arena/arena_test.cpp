// The shared arena's allocator and mappings on their own (src/redistribute/transports/peer_memory/
// arena.h), built with AddressSanitizer: arena.cpp is compiled into this program, not taken
// from the library. ctest runs it with SHARDTENSOR_ARENA=1 (arena_asan) and again with a 4 MiB
// arena (arena_asan_full); a test that needs the other one says so and skips.
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "redistribute/transports/peer_memory/arena.h"

using namespace shardtensor;

namespace {

constexpr size_t kLarge = size_t{1} << 20;

uint64_t address_of(const c10::DataPtr& p) { return reinterpret_cast<uintptr_t>(p.get()); }

c10::DataPtr allocate(size_t bytes) { return c10::GetCPUAllocator()->allocate(bytes); }

bool small_arena() { return own_arena().capacity <= (uint64_t{8} << 20); }

#define REQUIRE_ARENA() \
  if (own_arena().base == 0) GTEST_SKIP() << "SHARDTENSOR_ARENA is not 1 here: ctest's arena_asan runs this test with the arena on"

}  // namespace

TEST(ArenaAllocator, LargeBlocksLieInTheArenaSmallOnesDoNot) {
  REQUIRE_ARENA();
  const c10::DataPtr large = allocate(kLarge), small = allocate(kArenaMinBytes - 1);
  EXPECT_TRUE(own_arena().covers(address_of(large), kLarge));
  EXPECT_FALSE(own_arena().covers(address_of(small), kArenaMinBytes - 1));
  std::memset(large.get(), 1, kLarge);  // every byte of the block is this process's to write
  EXPECT_EQ(address_of(large) % 64, 0u);
}

TEST(ArenaAllocator, AFreedBlockServesTheNextRequestOfItsClassOnly) {
  REQUIRE_ARENA();
  c10::DataPtr block = allocate(kLarge);
  const void* where = block.get();
  block.clear();
  const c10::DataPtr other_class = allocate(3 * kLarge);
  EXPECT_NE(other_class.get(), where);
  const c10::DataPtr same_class = allocate(kLarge - 4096);  // rounds up to the same class
  EXPECT_EQ(same_class.get(), where);
  const c10::DataPtr next = allocate(kLarge);
  EXPECT_NE(next.get(), where) << "a block in use was handed out twice";
}

TEST(ArenaAllocator, AFullArenaFallsBackToTheAllocatorItReplaced) {
  REQUIRE_ARENA();
  if (!small_arena()) GTEST_SKIP() << "the arena holds " << own_arena().capacity << " bytes; ctest's arena_asan_full gives it 4 MiB";
  const ArenaStatistics before = arena_statistics();
  std::vector<c10::DataPtr> blocks;
  while (arena_statistics().fallbacks == before.fallbacks) blocks.push_back(allocate(kLarge));
  ASSERT_FALSE(blocks.empty());
  EXPECT_FALSE(own_arena().covers(address_of(blocks.back()), kLarge));
  std::memset(blocks.back().get(), 2, kLarge);
  blocks.clear();
  EXPECT_EQ(arena_statistics().blocks_in_use, before.blocks_in_use) << "every block came back";
}

// c10's raw_allocate / raw_deallocate (some extensions use them): the raw deleter hands each
// block back to where it came from.
TEST(ArenaAllocator, RawAllocationsOfEitherKindGoBackWhereTheyCameFrom) {
  REQUIRE_ARENA();
  if (small_arena()) GTEST_SKIP() << "the arena may be full here; ctest's arena_asan runs this test with room";
  c10::Allocator* allocator = c10::GetCPUAllocator();
  const uint64_t in_use = arena_statistics().blocks_in_use;
  void* large = allocator->raw_allocate(kLarge);
  void* small = allocator->raw_allocate(64);
  EXPECT_TRUE(own_arena().covers(reinterpret_cast<uintptr_t>(large), kLarge));
  EXPECT_FALSE(own_arena().covers(reinterpret_cast<uintptr_t>(small), 64));
  EXPECT_EQ(arena_statistics().blocks_in_use, in_use + 1);
  allocator->raw_deallocate(large);
  allocator->raw_deallocate(small);
  EXPECT_EQ(arena_statistics().blocks_in_use, in_use);
}

TEST(MappedArena, APeerSeesWhatTheOwnerWrote) {
  REQUIRE_ARENA();
  const c10::DataPtr block = allocate(kLarge);
  std::memset(block.get(), 7, kLarge);
  MappedArena mapped;
  std::string error;
  ASSERT_TRUE(mapped.map(getpid(), own_arena(), error)) << error;
  const char* seen = mapped.at(address_of(block));
  EXPECT_EQ(seen[0], 7);
  EXPECT_EQ(seen[kLarge - 1], 7);
  static_cast<char*>(block.get())[5] = 9;
  EXPECT_EQ(seen[5], 9) << "the mapping shares the owner's pages";
}

TEST(MappedArena, RefusesAnArenaThatDoesNotCarryTheCookie) {
  REQUIRE_ARENA();
  ArenaRange wrong = own_arena();
  wrong.cookie ^= 2;
  MappedArena mapped;
  std::string error;
  EXPECT_FALSE(mapped.map(getpid(), wrong, error));
  EXPECT_NE(error.find("not the arena"), std::string::npos) << error;
  EXPECT_FALSE(mapped.mapped());
}

TEST(MappedArena, RefusesAFileShorterThanTheArena) {
  REQUIRE_ARENA();
  ArenaRange longer = own_arena();
  longer.capacity *= 2;
  MappedArena mapped;
  std::string error;
  EXPECT_FALSE(mapped.map(getpid(), longer, error));
  EXPECT_NE(error.find("cannot map"), std::string::npos) << error;
}

TEST(MappedArena, RefusesAProcessThatIsGone) {
  REQUIRE_ARENA();
  const pid_t child = fork();
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);
  MappedArena mapped;
  std::string error;
  EXPECT_FALSE(mapped.map(child, own_arena(), error));
  EXPECT_NE(error.find("cannot open"), std::string::npos) << error;
}

// A forked child keeps fork's copy-on-write: what it writes into the parent's tensors stays its
// own, and it allocates outside the arena.
TEST(ArenaAllocator, AForkedChildWritesOnlyItsOwnCopy) {
  REQUIRE_ARENA();
  const c10::DataPtr block = allocate(kLarge);
  std::memset(block.get(), 1, kLarge);
  const ArenaRange parent = own_arena();
  const pid_t child = fork();
  if (child == 0) {
    std::memset(block.get(), 2, kLarge);
    const c10::DataPtr fresh = allocate(kLarge);
    std::memset(fresh.get(), 3, kLarge);
    _exit(own_arena().base == 0 && !parent.covers(address_of(fresh), kLarge) ? 0 : 1);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(static_cast<const char*>(block.get())[0], 1);
  EXPECT_EQ(static_cast<const char*>(block.get())[kLarge - 1], 1);
}
