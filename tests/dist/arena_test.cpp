// The shared arena (redistribute/transports/peer_memory/arena.h): large CPU tensors lie in it,
// peers read them in place, and a reduce-scatter combines its terms straight from the holders'
// memory, with the values one process computes. The tests run where SHARDTENSOR_ARENA=1 (ctest's
// dist_arena_* entries set it, and SHARDTENSOR_ARENA_BYTES for the full-arena case); elsewhere
// each says why it skips.
#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dist/dist_fixture.h"
#include "redistribute/plan.h"
#include "redistribute/transports/peer_memory/arena.h"

using namespace shardtensor;
using namespace shardtensor::testing;

namespace {

uint64_t address_of(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()); }

// The cases every rank runs alike: S and R layouts, and pending reductions, over uneven splits.
struct Transition {
  Placements from, to;
};
const std::vector<Transition>& transitions() {
  static const std::vector<Transition> all = {
      {{Shard(0)}, {Replicate()}},           {{Shard(0)}, {Shard(1)}},
      {{Shard(2)}, {Shard(1)}},              {{Partial()}, {Replicate()}},
      {{Partial()}, {Shard(0)}},             {{Partial(ReduceOp::Max)}, {Shard(1)}},
      {{Partial(ReduceOp::Avg)}, {Replicate()}},
  };
  return all;
}

// Redistributes every transition of a [rows, 96, 24] double tensor (18 KiB a row, uneven over
// the ranks: with 4 rows a rank or more, every piece lies in the arena; with fewer, the Shard
// pieces lie outside it, and groups mix both) and checks each rank's piece against the slice of
// the one-process tensor it owns.
void expect_every_transition_matches_one_process(const DeviceMesh& mesh, int64_t rows) {
  const at::Tensor global = iota({rows, 96, 24}, at::kDouble);
  for (const Transition& t : transitions()) {
    const at::Tensor source = t.from[0].is_partial()
                                  ? from_local(partial_term(global, mesh, t.from), mesh, t.from)
                                  : distribute_tensor(global, mesh, t.from);
    const at::Tensor result = redistribute(source, t.to);
    const at::Tensor expected = reference_piece(global, mesh.shape(), t.to, {}, mesh.coordinate());
    EXPECT_TRUE(at::allclose(to_local(result), expected, 0, 1e-12))
        << to_string(t.from) << " -> " << to_string(t.to) << " on " << mesh << ", " << rows << " rows";
  }
}

// Why this rank has no peer whose memory it may read over `comm` (empty where it has).
std::string why_no_peer_to_read(Comm& comm) {
  if (comm.size() == 1) return "one rank reads from no peer";
  if (kernel_forbids_peer_memory(comm)) return "this machine forbids cross-memory attach: " + why_no_peer_memory(comm);
  return "";
}

#define REQUIRE_ARENA()                                                                                                 \
  if (own_arena().base == 0) GTEST_SKIP() << "the shared arena is off here (SHARDTENSOR_ARENA is not 1): ctest's " \
                                             "dist_arena_n2 and dist_arena_n4 run this test with it on"

}  // namespace

TEST(Arena, LargeTensorsLieInItAndFreedBlocksAreReused) {
  REQUIRE_ARENA();
  const ArenaRange arena = own_arena();
  at::Tensor large = at::empty({static_cast<int64_t>(kArenaMinBytes / sizeof(float))}, at::kFloat);
  const at::Tensor small = at::empty({16}, at::kFloat);
  ASSERT_TRUE(arena.covers(address_of(large), large.nbytes()));
  EXPECT_FALSE(arena.covers(address_of(small), small.nbytes()));
  const void* block = large.data_ptr();
  large.reset();
  const at::Tensor again = at::empty({static_cast<int64_t>(kArenaMinBytes / sizeof(float))}, at::kFloat);
  EXPECT_EQ(again.data_ptr(), block) << "a freed block serves the next tensor of its size class";
}

TEST(Arena, PeersReadInPlaceWithOneProcessValues) {
  REQUIRE_ARENA();
  const DeviceMesh& mesh = test_meshes().front();
  Comm& comm = mesh.comm(0);
  if (const std::string why = why_no_peer_to_read(comm); !why.empty()) GTEST_SKIP() << why;
  const UseTransport memory(UseTransport::kMemory);
  const int64_t read_before = peer_parts_read_in_place(), written_before = peer_parts_written();
  const int64_t combined_before = peer_reductions_in_place();
  for (int64_t rows : {4 * comm.size() + 1, comm.size() - 1}) expect_every_transition_matches_one_process(mesh, rows);
  EXPECT_GT(peer_parts_read_in_place(), read_before) << "no part was read in place";
  EXPECT_GT(peer_reductions_in_place(), combined_before) << "no reduce-scatter combined its terms in place";
  EXPECT_EQ(peer_parts_written(), written_before) << "a holder wrote a part that its receiver could read in place";
}

// Reading in place is a transport of its own ("shared arena"): explain names it, and the plan
// option shared_arena = false, per call or in a scope, moves the same exchanges by cross-memory
// attach instead (reductions and their in-place combines included), with the same values and no
// part read in place.
TEST(Arena, ExplainNamesItAndThePlanOptionTurnsItOff) {
  REQUIRE_ARENA();
  const DeviceMesh& mesh = test_meshes().front();
  Comm& comm = mesh.comm(0);
  if (const std::string why = why_no_peer_to_read(comm); !why.empty()) GTEST_SKIP() << why;
  const UseTransport memory(UseTransport::kMemory);
  const int64_t rows = 4 * comm.size() + 1;
  const at::Tensor global = iota({rows, 96, 24}, at::kDouble);
  const at::Tensor x = distribute_tensor(global, mesh, {Shard(0)});
  const ShardTensorSpec replicated = relayout(spec(x), {Replicate()}, {});
  TransportOptions off;
  off.shared_arena = false;
  const std::string in_place = explain_redistribute(spec(x), replicated), by_copies = explain_redistribute(spec(x), replicated, off);
  EXPECT_NE(in_place.find("by shared arena"), std::string::npos) << in_place;
  EXPECT_NE(by_copies.find("by peer memory"), std::string::npos) << by_copies;
  EXPECT_EQ(by_copies.find("shared arena"), std::string::npos) << by_copies;

  const int64_t read_before = peer_parts_read_in_place(), combined_before = peer_reductions_in_place();
  EXPECT_TRUE(at::equal(to_local(redistribute(x, {Replicate()}, off)), global));
  {
    const TransportOptionsScope scope(off);
    expect_every_transition_matches_one_process(mesh, rows);
  }
  EXPECT_EQ(peer_parts_read_in_place(), read_before) << "a part was read in place with shared_arena off";
  EXPECT_EQ(peer_reductions_in_place(), combined_before) << "a reduce-scatter combined in place with shared_arena off";
  EXPECT_TRUE(at::equal(to_local(redistribute(x, {Replicate()})), global));
  EXPECT_GT(peer_parts_read_in_place(), read_before) << "the default did not read in place";
}

// A failure while combining in place (injected on one rank) sends the whole group back to
// messages, which move and combine the terms again: the values are one process's. On a mesh of
// its own, since its group then stays on messages.
TEST(Arena, AFailedCombineInPlaceFallsBackToMessages) {
  REQUIRE_ARENA();
  if (world_size() == 1) GTEST_SKIP() << "one rank reads from no peer";
  const DeviceMesh mesh = DeviceMesh::create({world_size()});
  if (kernel_forbids_peer_memory(mesh.comm(0))) GTEST_SKIP() << "this machine forbids cross-memory attach";
  const UseTransport memory(UseTransport::kMemory);
  const at::Tensor global = iota({4 * world_size() + 1, 96, 24}, at::kDouble);
  const Placements pending{Partial()};
  const at::Tensor terms = from_local(partial_term(global, mesh, pending), mesh, pending);
  if (mesh.rank() == 0) fail_next_peer_copies(1);
  const int64_t combined_before = peer_reductions_in_place();
  const at::Tensor result = redistribute(terms, {Shard(0)});
  EXPECT_TRUE(at::allclose(to_local(result), reference_piece(global, mesh.shape(), {Shard(0)}, {}, mesh.coordinate()), 0, 1e-12));
  EXPECT_EQ(peer_memory_of(mesh.comm(0)), nullptr) << "the group stayed on peer memory after a failed combine";
  if (mesh.rank() == 0) EXPECT_EQ(peer_reductions_in_place(), combined_before) << "the failed combine was counted";
}

// Run with SHARDTENSOR_ARENA_BYTES of a few MiB: tensors that no longer fit come from the
// allocator the arena replaced, with a warning, and move through cross-memory attach.
TEST(Arena, AFullArenaFallsBackWithOneProcessValues) {
  REQUIRE_ARENA();
  if (own_arena().capacity > (uint64_t{8} << 20))
    GTEST_SKIP() << "the arena holds " << own_arena().capacity << " bytes; ctest's dist_arena_full_n3 runs this test with 4 MiB";
  const DeviceMesh& mesh = test_meshes().front();
  Comm& comm = mesh.comm(0);
  if (comm.size() > 1 && kernel_forbids_peer_memory(comm)) GTEST_SKIP() << "this machine forbids cross-memory attach";
  const UseTransport memory(UseTransport::kMemory);
  std::vector<at::Tensor> filling;
  const uint64_t fallbacks = arena_statistics().fallbacks;
  while (arena_statistics().fallbacks == fallbacks) filling.push_back(at::empty({1 << 18}, at::kFloat));
  expect_every_transition_matches_one_process(mesh, 2 * comm.size() + 1);
}
