// An error raised on one rank only must not leave the others waiting forever: they raise once
// the mesh's collective timeout passes. Kept in its own binary because the timed-out group is
// left unusable.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <chrono>
#include <functional>

#include "comm/comm.h"
#include "redistribute/transports/peer_memory/peer_memory.h"
#include "dist/dist_fixture.h"
#include "redistribute/transports/peer_memory/copies.h"
#include "redistribute/executor.h"
#include "redistribute/lowered_step.h"

using namespace shardtensor;
using namespace shardtensor::testing;

namespace {

// A mesh over every rank whose collectives give up after 3 s: the one rank 0 "fails" on.
DeviceMesh mesh_with_a_short_timeout() {
  MeshOptions short_timeout;
  short_timeout.timeout = std::chrono::seconds(3);
  return DeviceMesh::create({world_size()}, {}, short_timeout);
}

// Runs `survivor` on every rank but 0, which "failed" before the call and never joins it; the
// call checks its own error and must be back within 30 s. Then every rank meets on `healthy`
// (a mesh of the default timeout), so that rank 0 stays alive until the others have seen theirs.
void on_survivors_within_30s(const DeviceMesh& healthy, const std::function<void()>& survivor) {
  const auto start = std::chrono::steady_clock::now();
  if (world_rank() != 0) {
    survivor();
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30.0);
  }
  healthy.comm(0).barrier();
}

// aten::scaled_dot_product_attention comes with torch 2.0: reached through the dispatcher by
// name so that this file compiles on libtorch 1.13 too, where the ring tests skip.
auto sdpa_op() { return c10::Dispatcher::singleton().findSchema({"aten::scaled_dot_product_attention", ""}); }

#define SKIP_WITHOUT_SDPA() \
  if (!sdpa_op())           \
  GTEST_SKIP() << "aten::scaled_dot_product_attention does not exist in this libtorch (it comes with torch 2.0)"

// q = k = v for a ring over `mesh`: [1, 2, 4 * world, 4], split along the sequence.
at::Tensor sequence_sharded_query(const DeviceMesh& mesh) {
  return distribute_tensor(at::randn({1, 2, 4 * world_size(), 4}), mesh, {Shard(2)});
}

// F.scaled_dot_product_attention(q, q, q, is_causal=), through the dispatcher.
at::Tensor self_attention(const at::Tensor& q, bool is_causal) {
  torch::jit::Stack stack{q, q, q, c10::IValue(), 0.0, is_causal, c10::IValue(), /*enable_gqa=*/false};
  sdpa_op()->callBoxed(&stack);
  return stack.back().toTensor();
}

}  // namespace

TEST(Failure, RanksWaitingForARankThatFailedRaiseAfterTheTimeout) {
  if (world_size() == 1) GTEST_SKIP() << "needs a rank that fails and one that waits";
  DeviceMesh healthy = DeviceMesh::create({world_size()});
  DeviceMesh mesh = mesh_with_a_short_timeout();
  on_survivors_within_30s(healthy, [&] {  // rank 0 never joins the all-gather of local shapes
    EXPECT_ERROR_CONTAINS(from_local(at::zeros({2}), mesh, {Shard(0)}, ShardSizing::infer()), "failed or timed out",
                          "all_gather");
  });
}

// zigzag_shard's exchange: a rank that never joins makes every other rank raise within the
// timeout, before any byte of the exchange is taken as received.
TEST(Failure, ZigzagExchangeWhoseMemberFailedRaisesAfterTheTimeout) {
  if (world_size() == 1) GTEST_SKIP() << "needs a rank that fails and one that waits";
  DeviceMesh healthy = DeviceMesh::create({world_size()});
  DeviceMesh mesh = mesh_with_a_short_timeout();
  const at::Tensor x = distribute_tensor(at::randn({1, 2, 4 * world_size(), 4}), mesh, {Shard(2)});
  on_survivors_within_30s(healthy, [&] { EXPECT_ERROR_CONTAINS(zigzag_shard(x, 0, 2), "timed out"); });
}

TEST(Failure, RanksWaitingInAPeerMemoryExchangeRaiseAfterTheTimeout) {
  if (world_size() == 1) GTEST_SKIP() << "needs a rank that fails and one that waits";
  if (!peer_memory_enabled()) GTEST_SKIP() << "SHARDTENSOR_PEER_MEMORY=0: peer memory switched off";
  DeviceMesh healthy = DeviceMesh::create({world_size()});
  DeviceMesh mesh = mesh_with_a_short_timeout();
  if (kernel_forbids_peer_memory(mesh.comm(0))) GTEST_SKIP() << "this machine's kernel forbids reading another rank's memory";
  TransportOptions every_size;
  every_size.peer_copy_bytes = 0;  // this small tensor goes through peer memory too
  const TransportOptionsScope scope(every_size);
  at::Tensor x = distribute_tensor(at::arange(60, at::kFloat).view({12, 5}), mesh, {Shard(0)});
  redistribute(x, {Shard(1)});  // every rank: the group probes and copies through memory
  ASSERT_NE(peer_memory_of(mesh.comm(0)), nullptr) << why_no_peer_memory(mesh.comm(0));
  on_survivors_within_30s(healthy, [&] {  // rank 0 never posts its addresses
    EXPECT_ERROR_CONTAINS(redistribute(x, {Shard(1)}), "timed out", "waiting for group rank 0");
  });
}

// Ring attention checks only its two neighbours' records each step: a rank that never joins
// still makes every other rank raise, each once its own neighbour has given up, well within a
// few timeouts, and none returns an output.
TEST(Failure, RanksInARingWhoseMemberFailedRaiseAfterTheTimeout) {
  if (world_size() == 1) GTEST_SKIP() << "needs a rank that fails and one that waits";
  SKIP_WITHOUT_SDPA();
  DeviceMesh healthy = DeviceMesh::create({world_size()});
  DeviceMesh mesh = mesh_with_a_short_timeout();
  const at::Tensor q = sequence_sharded_query(mesh);
  on_survivors_within_30s(healthy, [&] {  // rank 0 never joins the ring
    EXPECT_ERROR_CONTAINS(self_attention(q, /*is_causal=*/false), "timed out");
  });
}

// The ring's backward under a causal mask, where gradients also go straight home during the
// ring (from 3 ranks): every rank ran the forward; rank 0 then never joins the backward, and
// every other rank raises within the timeout instead of waiting for its gradients.
TEST(Failure, CausalRingBackwardWhoseMemberFailedRaisesAfterTheTimeout) {
  if (world_size() == 1) GTEST_SKIP() << "needs a rank that fails and one that waits";
  SKIP_WITHOUT_SDPA();
  DeviceMesh healthy = DeviceMesh::create({world_size()});
  DeviceMesh mesh = mesh_with_a_short_timeout();
  const at::Tensor q = sequence_sharded_query(mesh).requires_grad_();
  const at::Tensor loss = self_attention(q, /*is_causal=*/true).sum();  // every rank: the forward
  on_survivors_within_30s(healthy, [&] { EXPECT_ERROR_CONTAINS(loss.backward(), "timed out"); });
}

// Ring batches through peer memory (redistribute/executor_ring.cpp), as attention's ring runs
// them: `batch` lowered for this rank, of 1-d blocks (`rows` long) of `dtype`. Returns what
// arrived, block by block.
namespace {
std::vector<std::vector<at::Tensor>> run_ring(const DeviceMesh& mesh, const RingBatch& batch, const std::vector<std::vector<at::Tensor>>& sent,
                                              at::ScalarType dtype, int64_t widest_rows) {
  const LoweredStep step(RingStep{RingPhase::Pass, 0, 0, 1}, {batch}, widest_rows);
  return run_ring_batch(step, 0, sent, {at::empty({1}, dtype)}, mesh);
}

// Each rank passes a block to the next. Returns what this rank received from the previous one,
// `receive_elements` long.
at::Tensor pass_round_the_ring(const DeviceMesh& mesh, int64_t send_elements, int64_t receive_elements) {
  const int64_t n = mesh.size(0), me = mesh.comm(0).rank(), to = (me + 1) % n, from = (me + n - 1) % n;
  const at::Tensor block = at::full({send_elements}, static_cast<double>(me), at::kDouble);
  const RingBatch batch{{{to, me, send_elements}}, {{from, from, receive_elements}}};
  return run_ring(mesh, batch, {{block}}, at::kDouble, 8).at(0).at(0);
}

bool peer_memory_usable(DeviceMesh& mesh) {
  return peer_memory_enabled() && !kernel_forbids_peer_memory(mesh.comm(0)) && peer_memory_of(mesh.comm(0)) != nullptr;
}
}  // namespace

TEST(Failure, RingBatchesThroughPeerMemoryDeliverAndGoBackToGlooWhenACopyFails) {
  if (world_size() == 1) GTEST_SKIP() << "needs two ranks";
  DeviceMesh mesh = DeviceMesh::create({world_size()});
  if (!peer_memory_usable(mesh)) GTEST_SKIP() << "peer memory unavailable here: " << why_no_peer_memory(mesh.comm(0));
  Comm& comm = mesh.comm(0);
  const double previous = static_cast<double>((comm.rank() + comm.size() - 1) % comm.size());
  EXPECT_TRUE(at::equal(pass_round_the_ring(mesh, 5, 5), at::full({5}, previous, at::kDouble)));
  ASSERT_NE(peer_memory_of(comm), nullptr) << "the batch left peer memory";
  // Rank 0's copy fails: every rank learns it, the batch still arrives (as Gloo messages), and
  // the group stays on messages.
  if (world_rank() == 0) fail_next_peer_copies(1);
  EXPECT_TRUE(at::equal(pass_round_the_ring(mesh, 7, 7), at::full({7}, previous, at::kDouble)));
  EXPECT_EQ(peer_memory_of(comm), nullptr);
  EXPECT_TRUE(at::equal(pass_round_the_ring(mesh, 3, 3), at::full({3}, previous, at::kDouble)));
}

// A rank beside the one that raised learns of it in one of two ways, whichever the schedule
// gives: it finds that rank's mailbox closed ("gave up"), or it reads that rank's offers for the
// exchange after the rank withdrew them on raising, and finds none of the part it expects
// ("offers no part ... `part`"). Both are errors naming the exchange before any byte lands; a
// test that asserted one of them failed when the ranks were slowed (CI, ctest -j).
namespace {
void expect_the_failed_rank_named(const std::function<void()>& exchange, const std::string& part) {
  try {
    exchange();
    ADD_FAILURE() << "expected an error beside the rank that raised";
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    const bool gave_up = message.find("gave up") != std::string::npos;
    const bool withdrew = message.find("offers no part") != std::string::npos && message.find(part) != std::string::npos;
    EXPECT_TRUE(gave_up || withdrew) << "message names neither the rank that gave up nor the part it withdrew: " << message;
  }
}
}  // namespace

TEST(Failure, RingBatchThroughPeerMemoryWithOtherSizesRaisesOnEveryRank) {
  if (world_size() == 1) GTEST_SKIP() << "needs two ranks";
  DeviceMesh healthy = DeviceMesh::create({world_size()});
  DeviceMesh mesh = mesh_with_a_short_timeout();
  if (!peer_memory_usable(mesh)) GTEST_SKIP() << "peer memory unavailable here: " << why_no_peer_memory(mesh.comm(0));
  // Rank 1 expects 8 elements from rank 0, which sends 4: rank 1 raises naming the part it found
  // no offer of, before any byte lands; the others raise since it gave up the exchange.
  const bool wrong = world_rank() == 1;
  const auto start = std::chrono::steady_clock::now();
  if (wrong) {
    EXPECT_ERROR_CONTAINS(pass_round_the_ring(mesh, 4, 8), "offers no part offsets [0] shape [8]");
  } else {
    expect_the_failed_rank_named([&] { pass_round_the_ring(mesh, 4, 4); }, "shape [4]");
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30.0);
  healthy.comm(0).barrier();
}

TEST(Failure, RingBatchThroughPeerMemoryWithAnUnreceivedMessageRaisesOnEveryRank) {
  if (world_size() == 1) GTEST_SKIP() << "needs two ranks";
  DeviceMesh healthy = DeviceMesh::create({world_size()});
  DeviceMesh mesh = mesh_with_a_short_timeout();
  if (!peer_memory_usable(mesh)) GTEST_SKIP() << "peer memory unavailable here: " << why_no_peer_memory(mesh.comm(0));
  // Rank 0 sends rank 1 a second message that rank 1 never receives: rank 1 raises instead of
  // dropping it (what rank 0 sends it is one part, longer than the one rank 1 expects), and the
  // others raise since it gave up the exchange.
  Comm& comm = mesh.comm(0);
  const int64_t n = comm.size(), me = comm.rank();
  const auto start = std::chrono::steady_clock::now();
  const auto batch = [&] {
    const int64_t to = (me + 1) % n, from = (me + n - 1) % n;
    RingBatch lowered{{{to, me, 4}}, {{from, from, 4}}};
    std::vector<std::vector<at::Tensor>> sent{{at::ones({4})}};
    if (me == 0) {
      lowered.sends.push_back({1, n, 2});
      sent.push_back({at::ones({2})});
    }
    run_ring(mesh, lowered, sent, at::kFloat, 6);
  };
  if (me == 1) {
    EXPECT_ERROR_CONTAINS(batch(), "offers no part offsets [0] shape [4]");
  } else {
    expect_the_failed_rank_named(batch, "shape [4]");
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30.0);
  healthy.comm(0).barrier();
}
