// Scaled dot-product attention on ShardTensors, against one process: ring attention on
// sequence shards (uneven, an empty shard, Q and K split differently, causal or not, grouped
// query heads, with a mask), whole rows against split keys (merged by log-sum-exp), the local
// layouts (batch, heads, rows against whole keys) and the layout that gathers, values and the
// three input gradients, with the messages each one makes.
//
// SDPA exists from torch 2.0; on libtorch 1.13 every test here skips, saying so. The operator is
// reached through the dispatcher by name so that this file compiles on both lines.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/optim/adam.h>
#include <torch/version.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <optional>
#include <string>

#include "dist/attention_checks.h"
#include "dist/dist_fixture.h"
#include "dist/sweep_case.h"

using namespace shardtensor;
using namespace shardtensor::testing;

namespace {

auto sdpa_op() {  // c10::optional on libtorch 1.13, std::optional on 2.x
  return c10::Dispatcher::singleton().findSchema({"aten::scaled_dot_product_attention", ""});
}

#define SKIP_WITHOUT_SDPA()                                                                                        \
  if (!sdpa_op())                                                                                                  \
  GTEST_SKIP() << "aten::scaled_dot_product_attention does not exist in libtorch " << TORCH_VERSION_MAJOR << "." \
               << TORCH_VERSION_MINOR << " (it comes with torch 2.0)"

// F.scaled_dot_product_attention(q, k, v, attn_mask, is_causal=, enable_gqa=), through the dispatcher.
at::Tensor sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool is_causal,
                const at::Tensor& mask = at::Tensor()) {
  torch::jit::Stack stack{q, k, v, mask.defined() ? c10::IValue(mask) : c10::IValue(), 0.0, is_causal, c10::IValue(),
                          /*enable_gqa=*/k.size(1) != q.size(1)};
  sdpa_op()->callBoxed(&stack);
  return stack.back().toTensor();
}

// Uneven sequence sizes with one empty shard where there are two ranks or more.
std::vector<int64_t> with_an_empty_shard(int64_t n) {
  if (n == 1) return {9};
  std::vector<int64_t> sizes;
  for (int64_t r = 0; r < n; ++r) sizes.push_back(r == n / 2 ? 0 : 5 + 3 * r);
  return sizes;
}

struct AttentionCase {
  int64_t batch = 2, heads = 4, kv_heads = 4, dim = 8;
  std::vector<int64_t> q_sizes, kv_sizes;  // sequence splits (global lengths may differ)
  Placements q_placements = {Shard(2)}, kv_placements = {Shard(2)};
  bool is_causal = false;
  bool with_mask = false;
  Placements mask_placements = {Replicate()};  // of the [Sq, Sk] mask: Shard(0) rows, Shard(1) keys
};

struct Result {
  at::Tensor out, q, k, v;  // the output and the sharded leaves, gradients filled
};

// Runs `c` sharded and on one process; checks values and the three gradients.
Result run_and_compare(const AttentionCase& c, uint64_t seed) {
  const int64_t sq = total(c.q_sizes), sk = total(c.kv_sizes);
  const at::Tensor q = draw({c.batch, c.heads, sq, c.dim}, seed), k = draw({c.batch, c.kv_heads, sk, c.dim}, seed + 1),
                   v = draw({c.batch, c.kv_heads, sk, c.dim}, seed + 2), grad = draw({c.batch, c.heads, sq, c.dim}, seed + 3);
  const at::Tensor mask = c.with_mask ? draw({sq, sk}, seed + 4) : at::Tensor();
  const at::Tensor rq = q.clone().requires_grad_(), rk = k.clone().requires_grad_(), rv = v.clone().requires_grad_();
  const at::Tensor expected = sdpa(rq, rk, rv, c.is_causal, mask);
  (expected * grad).sum().backward();

  auto shard = [&](const at::Tensor& t, const Placements& ps, const std::vector<int64_t>& sizes) {
    const bool seq = !ps.empty() && ps[0].is_shard(2);
    return seq ? distribute_tensor(t, mesh_1d(), ps, ShardSizes{{2, sizes}}) : distribute_tensor(t, mesh_1d(), ps);
  };
  Result r;
  r.q = shard(q, c.q_placements, c.q_sizes).requires_grad_();
  r.k = shard(k, c.kv_placements, c.kv_sizes).requires_grad_();
  r.v = shard(v, c.kv_placements, c.kv_sizes).requires_grad_();
  const at::Tensor smask = c.with_mask ? distribute_tensor(mask, mesh_1d(), c.mask_placements) : at::Tensor();
  r.out = sdpa(r.q, r.k, r.v, c.is_causal, smask);
  expect_close(r.out, expected.detach(), "output");
  (r.out * distribute_tensor(grad, mesh_1d(), {Replicate()})).sum().backward();
  expect_close(r.q.grad(), rq.grad(), "query gradient");
  expect_close(r.k.grad(), rk.grad(), "key gradient");
  expect_close(r.v.grad(), rv.grad(), "value gradient");
  return r;
}

class AttentionRing : public ::testing::TestWithParam<std::tuple<bool, int64_t>> {};

}  // namespace

// Q, K and V split on the sequence, each shard of its own size, one empty; K and V split
// unlike Q (and, in the second case, longer): the ring matches one process, and the
// gradients come back split like their inputs.
TEST_P(AttentionRing, UnevenSequenceShardsMatchOneProcess) {
  SKIP_WITHOUT_SDPA();
  const auto [is_causal, kv_heads] = GetParam();
  const int64_t n = mesh_1d().size(0);
  AttentionCase c;
  c.is_causal = is_causal;
  c.kv_heads = kv_heads;
  c.q_sizes = with_an_empty_shard(n);
  c.kv_sizes = std::vector<int64_t>(c.q_sizes.rbegin(), c.q_sizes.rend());
  Result r = run_and_compare(c, 10);
  EXPECT_EQ(spec(r.out).placements(), (Placements{Shard(2)}));
  EXPECT_EQ(spec(r.out).sharding_of(2)->sizes, c.q_sizes);
  EXPECT_EQ(spec(r.k.grad()).placements(), (Placements{Shard(2)}));
  EXPECT_EQ(spec(r.k.grad()).sharding_of(2)->sizes, c.kv_sizes);

  c.kv_sizes.back() += 3;  // Sq != Sk: the causal diagonal starts at the top left
  run_and_compare(c, 20);
}

INSTANTIATE_TEST_SUITE_P(Attention, AttentionRing,
                         ::testing::Combine(::testing::Bool(), ::testing::Values<int64_t>(4, 2)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "Causal" : "Full") +
                                  (std::get<1>(info.param) == 4 ? "MultiHead" : "GroupedQuery");
                         });

// A ring on a mesh that leaves global rank 0 out: its members match one process. The rank
// outside has no place in the ring and lowers none of it; it works out the global shapes on the
// meta device, where the CPU operator has no kernel, so it gets that error, naming the mesh
// (the members do not wait for it).
TEST(Attention, RingOnAMeshThatLeavesARankOutRunsOnItsMembers) {
  SKIP_WITHOUT_SDPA();
  if (world_size() < 3) GTEST_SKIP() << "needs a ring of two members and a rank outside it";
  std::vector<int64_t> members;
  for (int64_t r = 1; r < world_size(); ++r) members.push_back(r);
  static const DeviceMesh mesh = DeviceMesh::from_ranks({static_cast<int64_t>(members.size())}, members);
  const at::Tensor q = draw({1, 2, 7, 4}, 31), k = draw({1, 2, 7, 4}, 32), v = draw({1, 2, 7, 4}, 33);
  const at::Tensor sq = distribute_tensor(q, mesh, {Shard(2)}).requires_grad_(), sk = distribute_tensor(k, mesh, {Shard(2)}).requires_grad_(),
                   sv = distribute_tensor(v, mesh, {Shard(2)}).requires_grad_();
  if (mesh.includes_this_rank()) {
    const at::Tensor rq = q.clone().requires_grad_(), rk = k.clone().requires_grad_(), rv = v.clone().requires_grad_();
    const at::Tensor expected = sdpa(rq, rk, rv, /*is_causal=*/true);
    expected.pow(2).sum().backward();
    const at::Tensor out = sdpa(sq, sk, sv, /*is_causal=*/true);
    out.pow(2).sum().backward();
    expect_close(out, expected.detach(), "output");
    for (const auto& [sharded, reference, what] : {std::tuple{sq, rq, "query"}, std::tuple{sk, rk, "key"}, std::tuple{sv, rv, "value"}})
      expect_close(sharded.grad(), reference.grad(), std::string(what) + " gradient");
  } else {
    EXPECT_ERROR_CONTAINS(sdpa(sq, sk, sv, /*is_causal=*/true), "on global rank 0, which is outside mesh(");
  }
  mesh_1d().comm(0).barrier();  // global rank 0 holds the world's store, which the members' groups still use
}

// Forward: one message batch per step, n - 1 of them, in which each rank sends its current K
// and V block to the next; no all-gather. Backward: the same n - 1 steps (K, V and their
// gradients), then one batch returning the gradients to their owners.
TEST(Attention, RingPassesEachBlockAroundOnceWithoutGathering) {
  SKIP_WITHOUT_SDPA();
  const int64_t n = mesh_1d().size(0), b = 1, h = 2, d = 4;
  std::vector<int64_t> sizes;
  for (int64_t r = 0; r < n; ++r) sizes.push_back(2 + r);  // uneven, none empty: every block goes all the way round
  const int64_t s = total(sizes), me = mesh_1d().coordinate()[0];
  auto seq = [&](uint64_t seed) {
    return distribute_tensor(draw({b, h, s, d}, seed), mesh_1d(), {Shard(2)}, ShardSizes{{2, sizes}}).requires_grad_();
  };
  const at::Tensor q = seq(1), k = seq(2), v = seq(3);
  at::Tensor out;
  {
    CommDebugMode comms;
    out = sdpa(q, k, v, /*is_causal=*/false);
    EXPECT_EQ(comms.count("ring_send_recv"), n - 1) << comms.table();
    EXPECT_EQ(comms.count("all_gather"), 0) << comms.table();
    EXPECT_EQ(comms.total(), n - 1) << comms.table();
    // Rank r sends the blocks it holds at steps 0..n-2: every block but that of rank r + 1.
    const int64_t sent_rows = n > 1 ? s - sizes[(me + 1) % n] : 0;
    EXPECT_EQ(comms.bytes(), 2 * b * h * sent_rows * d * 4) << comms.table();
  }
  {
    CommDebugMode comms;
    out.sum().backward();
    EXPECT_EQ(comms.count("ring_send_recv"), n - 1) << comms.table();
    EXPECT_EQ(comms.count("ring_gradients"), n - 1) << comms.table();  // each block's accumulators one batch behind it
    EXPECT_EQ(comms.count("ring_return"), n > 1 ? 1 : 0) << comms.table();
    EXPECT_EQ(comms.count("all_gather"), 0) << comms.table();
  }
}

// A TransportOptionsScope covers every movement on its thread, the ring's message batches too:
// under Messages the ring never touches peer memory, and outside it (auto) it does.
TEST(Attention, TransportScopeKeepsTheRingOffPeerMemory) {
  SKIP_WITHOUT_SDPA();
  const int64_t n = mesh_1d().size(0);
  if (n == 1) GTEST_SKIP() << "a one-rank ring moves nothing";
  if (!peer_memory_enabled()) GTEST_SKIP() << "SHARDTENSOR_PEER_MEMORY=0: peer memory switched off";
  if (const char* forced = std::getenv("SHARDTENSOR_TRANSPORT"); forced && *forced && std::string(forced) != "auto")
    GTEST_SKIP() << "SHARDTENSOR_TRANSPORT=" << forced << " keeps the ring off peer memory outside the scope too";
  Comm& comm = mesh_1d().comm(0);
  if (kernel_forbids_peer_memory(comm)) GTEST_SKIP() << "this machine's kernel forbids reading another rank's memory";
  auto seq = [&](uint64_t seed) { return distribute_tensor(draw({1, 2, 3 * n + 1, 4}, seed), mesh_1d(), {Shard(2)}); };
  const at::Tensor q = seq(1), k = seq(2), v = seq(3);
  const at::Tensor by_memory = sdpa(q, k, v, /*is_causal=*/false);  // the group probes peer memory here
  ASSERT_NE(peer_memory_of(comm), nullptr) << why_no_peer_memory(comm);
  const uint64_t before = peer_memory_of(comm)->exchanges_started();
  at::Tensor by_messages;
  {
    TransportOptionsScope messages(TransportOptions{TransportPreference::Messages});
    by_messages = sdpa(q, k, v, /*is_causal=*/false);
  }
  EXPECT_EQ(peer_memory_of(comm)->exchanges_started(), before) << "the ring went through peer memory under a Messages scope";
  EXPECT_TRUE(at::equal(to_local(by_messages), to_local(by_memory)));
  sdpa(q, k, v, /*is_causal=*/false);
  EXPECT_GT(peer_memory_of(comm)->exchanges_started(), before) << "outside the scope the ring uses peer memory";
}

// Even splits under is_causal: block b is needed by ranks b..n-1 only, so rank r < n-1 passes
// on the blocks 0..r and the last rank sends nothing.
TEST(Attention, CausalRingMovesNoBlockAboveTheDiagonal) {
  SKIP_WITHOUT_SDPA();
  const int64_t n = mesh_1d().size(0), b = 1, h = 2, rows = 3, d = 4;
  auto seq = [&](uint64_t seed) { return distribute_tensor(draw({b, h, n * rows, d}, seed), mesh_1d(), {Shard(2)}); };
  const int64_t me = mesh_1d().coordinate()[0];
  const at::Tensor q = seq(1), k = seq(2), v = seq(3);
  CommDebugMode comms;
  sdpa(q, k, v, /*is_causal=*/true);
  EXPECT_EQ(comms.count("ring_send_recv"), n - 1) << comms.table();
  const int64_t blocks_sent = me < n - 1 ? me + 1 : 0;
  EXPECT_EQ(comms.bytes(), blocks_sent * 2 * b * h * rows * d * 4) << comms.table();
}

// Batch or heads split: local attention, nothing moves, forward or backward.
TEST(Attention, BatchOrHeadShardsAttendLocally) {
  SKIP_WITHOUT_SDPA();
  const int64_t n = mesh_1d().size(0);
  for (int64_t dim : {0, 1}) {
    for (bool is_causal : {false, true}) {
      AttentionCase c;
      c.batch = dim == 0 ? n + 1 : 2;  // uneven, empty shards at 4 ranks
      c.heads = dim == 1 ? 2 * n : 4;
      c.kv_heads = dim == 1 ? n : 2;   // grouped: each shard holds whole groups
      c.q_sizes = c.kv_sizes = {7};
      c.q_placements = c.kv_placements = {Shard(dim)};
      c.is_causal = is_causal;
      CommDebugMode comms;
      const Result r = run_and_compare(c, 30 + dim);
      EXPECT_EQ(comms.counts_by_operator().count("aten::_scaled_dot_product_flash_attention_for_cpu"), 0u) << comms.table();
      EXPECT_EQ(comms.counts_by_operator().count("aten::_scaled_dot_product_flash_attention_for_cpu_backward"), 0u)
          << comms.table();
      EXPECT_EQ(spec(r.out).placements(), (Placements{Shard(dim)}));
      EXPECT_EQ(spec(r.k.grad()).placements(), (Placements{Shard(dim)}));
    }
  }
}

// Rows split, keys and values whole: local attention at the rows' global offsets (causal
// included); the key and value gradients are each rank's share, Partial(sum).
TEST(Attention, RowShardsAgainstWholeKeysGiveSummedKeyGradients) {
  SKIP_WITHOUT_SDPA();
  const int64_t n = mesh_1d().size(0);
  for (bool is_causal : {false, true}) {
    AttentionCase c;
    c.q_sizes = with_an_empty_shard(n);
    c.kv_sizes = {total(c.q_sizes) + 2};
    c.kv_placements = {Replicate()};
    c.is_causal = is_causal;
    at::Tensor out;
    at::Tensor q = distribute_tensor(draw({2, 4, total(c.q_sizes), 8}, 1), mesh_1d(), {Shard(2)}, ShardSizes{{2, c.q_sizes}});
    const at::Tensor k = distribute_tensor(draw({2, 4, c.kv_sizes[0], 8}, 2), mesh_1d(), {Replicate()}).requires_grad_();
    {
      CommDebugMode comms;
      out = sdpa(q, k, k, is_causal);
      EXPECT_EQ(comms.total(), 0) << comms.table();
    }
    out.sum().backward();
    EXPECT_EQ(spec(k.grad()).placements(), (Placements{Partial(ReduceOp::Sum)}));
    run_and_compare(c, 40);
  }
}

// The layout the rule does not split on, the head dim D, is gathered: still one process's values.
TEST(Attention, GatheredLayoutsStayCorrect) {
  SKIP_WITHOUT_SDPA();
  AttentionCase by_dim;
  by_dim.q_sizes = by_dim.kv_sizes = {6};
  by_dim.q_placements = by_dim.kv_placements = {Shard(3)};
  run_and_compare(by_dim, 50);
}

// A mask next to sequence-split Q, K and V: the ring runs, the mask split by rows like the
// query and whole along the keys, each block reading its keys' columns. A replicated mask is
// cut locally, so the forward moves K/V blocks only; a mask split along the keys is
// redistributed to rows first. Grouped heads, an empty shard, Sq != Sk (torch refuses a mask
// together with is_causal).
TEST(Attention, RingWithAMaskMatchesOneProcess) {
  SKIP_WITHOUT_SDPA();
  const int64_t n = mesh_1d().size(0);
  uint64_t seed = 60;
  for (const Placements& mask_placements : {Placements{Replicate()}, Placements{Shard(1)}, Placements{Shard(0)}}) {
    AttentionCase c;
    c.q_sizes = with_an_empty_shard(n);
    c.kv_sizes = std::vector<int64_t>(c.q_sizes.rbegin(), c.q_sizes.rend());
    c.kv_sizes.front() += 2;
    c.kv_heads = 2;
    c.with_mask = true;
    c.mask_placements = mask_placements;
    run_and_compare(c, seed++);
  }
  const int64_t s = 4 * n;
  auto seq = [&](uint64_t seed) { return distribute_tensor(draw({1, 2, s, 4}, seed), mesh_1d(), {Shard(2)}); };
  const at::Tensor q = seq(1), k = seq(2), v = seq(3), mask = distribute_tensor(draw({s, s}, 4), mesh_1d(), {Replicate()});
  CommDebugMode comms;
  const at::Tensor out = sdpa(q, k, v, /*is_causal=*/false, mask);
  EXPECT_EQ(comms.count("ring_send_recv"), n - 1) << comms.table();
  EXPECT_EQ(comms.total(), n - 1) << comms.table();
  EXPECT_EQ(spec(out).placements(), (Placements{Shard(2)}));
}

// Whole query rows (replicated) against K and V split on the sequence: each rank attends to its
// own keys, and one all-gather of the per-row log-sum-exp merges the blocks. The output is
// Partial(sum), K and V never move, and their gradients keep their shards; the query's
// gradient is Partial(sum). Uneven keys with an empty shard, causal or not, grouped heads, a mask
// (without is_causal, which torch refuses beside a mask).
TEST(Attention, WholeRowsAgainstSplitKeysMergeByOneGatherOfStatistics) {
  SKIP_WITHOUT_SDPA();
  const int64_t n = mesh_1d().size(0);
  for (bool is_causal : {false, true}) {
    for (bool with_mask : {false, true}) {
      if (with_mask && is_causal) continue;
      AttentionCase c;
      c.kv_sizes = with_an_empty_shard(n);
      c.q_sizes = {total(c.kv_sizes) - 1};
      c.q_placements = {Replicate()};
      c.kv_heads = with_mask ? 4 : 2;
      c.is_causal = is_causal;
      c.with_mask = with_mask;
      const Result r = run_and_compare(c, 70 + 2 * is_causal + with_mask);
      EXPECT_EQ(spec(r.k.grad()).placements(), (Placements{Shard(2)}));
      EXPECT_EQ(spec(r.k.grad()).sharding_of(2)->sizes, c.kv_sizes);
    }
  }
  std::vector<int64_t> sizes = with_an_empty_shard(n);
  const int64_t sk = total(sizes), sq = 5, b = 1, h = 2, d = 4;
  const at::Tensor q = distribute_tensor(draw({b, h, sq, d}, 1), mesh_1d(), {Replicate()}).requires_grad_();
  auto keys = [&](uint64_t seed) {
    return distribute_tensor(draw({b, h, sk, d}, seed), mesh_1d(), {Shard(2)}, ShardSizes{{2, sizes}}).requires_grad_();
  };
  const at::Tensor k = keys(2), v = keys(3);
  at::Tensor out;
  {
    CommDebugMode comms;
    out = sdpa(q, k, v, /*is_causal=*/false);
    EXPECT_EQ(comms.count("all_gather"), n > 1 ? 1 : 0) << comms.table();
    EXPECT_EQ(comms.total(), n > 1 ? 1 : 0) << comms.table();
    EXPECT_EQ(comms.bytes(), n > 1 ? b * h * sq * 4 : 0) << comms.table();  // the statistics only
  }
  EXPECT_EQ(spec(out).placements(), (Placements{Partial(ReduceOp::Sum)}));
  {
    CommDebugMode comms;
    out.sum().backward();
    // The backward reads the merged output: one all-reduce of it; K and V still stay put.
    EXPECT_EQ(comms.count("all_gather"), 0) << comms.table();
    EXPECT_EQ(comms.count("all_to_all"), 0) << comms.table();
    EXPECT_LE(comms.total(), 1) << comms.table();
  }
  EXPECT_EQ(spec(k.grad()).placements(), (Placements{Shard(2)}));
}

// Zigzag chunks (load-balanced causal attention): Q, K and V sharded in order, moved to zigzag
// chunks (ZigzagShard, which attention reads), attended and moved back equal one process,
// values and the three gradients. The zigzag output is the sequence in order too: its
// full_tensor is one process's. Keys and values left in order are put in the query's order.
// Lengths: a multiple of 2n, an uneven one, and fewer positions than chunks (empty chunks, so
// empty shards); grouped heads in the uneven case.
TEST(Attention, ZigzagCausalRingMatchesOneProcess) {
  SKIP_WITHOUT_SDPA();
  const int64_t n = mesh_1d().size(0);
  const int64_t b = 1, h = 4, d = 8;
  uint64_t seed = 80;
  for (const auto& [s, kv_heads] : std::vector<std::pair<int64_t, int64_t>>{{6 * n, 4}, {6 * n + 2 * n - 1, 2}, {n, 4}}) {
    const at::Tensor q = draw({b, h, s, d}, seed), k = draw({b, kv_heads, s, d}, seed + 1), v = draw({b, kv_heads, s, d}, seed + 2),
                     grad = draw({b, h, s, d}, seed + 3);
    seed += 4;
    const at::Tensor rq = q.clone().requires_grad_(), rk = k.clone().requires_grad_(), rv = v.clone().requires_grad_();
    const at::Tensor expected = sdpa(rq, rk, rv, /*is_causal=*/true);
    (expected * grad).sum().backward();

    auto leaf = [&](const at::Tensor& t) { return distribute_tensor(t, mesh_1d(), {Shard(2)}).requires_grad_(); };
    const at::Tensor sq = leaf(q), sk = leaf(k), sv = leaf(v);
    const std::string where = "S = " + std::to_string(s) + ", " + std::to_string(kv_heads) + " key heads";
    const at::Tensor zq = zigzag_shard(sq, 0, 2), zk = zigzag_shard(sk, 0, 2), zv = zigzag_shard(sv, 0, 2);
    EXPECT_EQ(spec(zq).placements(), (Placements{ZigzagShard(2)})) << where;
    EXPECT_EQ(spec(zq).sharding_of(2)->sizes, zigzag_shard_sizes(s, n)) << where;
    const at::Tensor zout = sdpa(zq, zk, zv, /*is_causal=*/true);
    EXPECT_EQ(spec(zout).placements(), (Placements{ZigzagShard(2)})) << where;
    expect_close(zout, expected.detach(), "zigzag output, " + where);  // its full_tensor is in order
    const at::Tensor out = zigzag_unshard(zout, 0, 2);
    EXPECT_EQ(spec(out).sharding_of(2)->sizes, chunk_sizes(s, n)) << where;
    expect_close(out, expected.detach(), "output, " + where);
    (out * distribute_tensor(grad, mesh_1d(), {Shard(2)})).sum().backward();
    expect_close(sq.grad(), rq.grad(), "query gradient, " + where);
    expect_close(sk.grad(), rk.grad(), "key gradient, " + where);
    expect_close(sv.grad(), rv.grad(), "value gradient, " + where);

    for (const at::Tensor& t : {sq, sk, sv}) t.mutable_grad().reset();
    const at::Tensor mixed = sdpa(zigzag_shard(sq, 0, 2), sk, sv, /*is_causal=*/true);  // keys in order
    EXPECT_EQ(spec(mixed).placements(), (Placements{ZigzagShard(2)})) << where;
    expect_close(mixed, expected.detach(), "output with keys in order, " + where);
    (mixed * distribute_tensor(grad, mesh_1d(), {ZigzagShard(2)})).sum().backward();
    expect_close(sq.grad(), rq.grad(), "query gradient with keys in order, " + where);
    expect_close(sk.grad(), rk.grad(), "key gradient with keys in order, " + where);
  }
}

// On a 2-D mesh: the batch split by mesh dim 0, the sequence as zigzag chunks along mesh dim 1,
// values and gradients against one process.
TEST(Attention, ZigzagAlongTheSecondMeshDimBesideABatchSplit) {
  SKIP_WITHOUT_SDPA();
  const DeviceMesh* mesh = nullptr;
  for (const DeviceMesh& m : test_meshes())
    if (m.ndim() == 2) mesh = &m;
  if (!mesh) GTEST_SKIP() << "no 2-D test mesh at world size " << world_size();
  const int64_t n = mesh->size(1), s = 3 * n + 1;
  const at::Tensor q = draw({2, 2, s, 4}, 120), k = draw({2, 2, s, 4}, 121), v = draw({2, 2, s, 4}, 122),
                   grad = draw({2, 2, s, 4}, 123);
  const at::Tensor rq = q.clone().requires_grad_(), rk = k.clone().requires_grad_(), rv = v.clone().requires_grad_();
  const at::Tensor expected = sdpa(rq, rk, rv, /*is_causal=*/true);
  (expected * grad).sum().backward();
  const Placements layout{Shard(0), Shard(2)};
  const at::Tensor sq = distribute_tensor(q, *mesh, layout).requires_grad_(), sk = distribute_tensor(k, *mesh, layout).requires_grad_(),
                   sv = distribute_tensor(v, *mesh, layout).requires_grad_();
  const at::Tensor out = zigzag_unshard(sdpa(zigzag_shard(sq, 1, 2), zigzag_shard(sk, 1, 2), zigzag_shard(sv, 1, 2), true), 1, 2);
  EXPECT_EQ(spec(out).placements(), layout);
  expect_close(out, expected.detach(), "output");
  (out * distribute_tensor(grad, *mesh, layout)).sum().backward();
  expect_close(sq.grad(), rq.grad(), "query gradient");
  expect_close(sk.grad(), rk.grad(), "key gradient");
  expect_close(sv.grad(), rv.grad(), "value gradient");
}

// zigzag_shard cuts a replicated sequence locally (no message), moves a sharded one in one
// exchange, and zigzag_unshard undoes it exactly, for any split the source had.
TEST(Attention, ZigzagLayoutMovesOnceAndUndoes) {
  SKIP_WITHOUT_SDPA();
  const int64_t n = mesh_1d().size(0), s = 5 * n + 1;
  const at::Tensor x = draw({2, 3, s, 4}, 90);
  {
    const at::Tensor replicated = distribute_tensor(x, mesh_1d(), {Replicate()});
    CommDebugMode comms;
    const at::Tensor z = zigzag_shard(replicated, 0, 2);
    EXPECT_EQ(comms.total(), 0) << comms.table();
    const int64_t me = mesh_1d().coordinate()[0];
    const std::vector<int64_t> chunks = zigzag_chunk_lengths(s, n);
    int64_t early = 0, late = 0;
    for (int64_t c = 0; c < me; ++c) early += chunks[c];
    for (int64_t c = 0; c < 2 * n - 1 - me; ++c) late += chunks[c];
    const at::Tensor mine = at::cat({x.narrow(2, early, chunks[me]), x.narrow(2, late, chunks[2 * n - 1 - me])}, 2);
    EXPECT_TRUE(at::equal(to_local(z), mine));
  }
  const std::vector<int64_t> sizes = with_an_empty_shard(n);  // uneven source, one shard empty
  const at::Tensor y = draw({2, 3, total(sizes), 4}, 92);
  const at::Tensor z = [&] {
    const at::Tensor src = distribute_tensor(y, mesh_1d(), {Shard(2)}, ShardSizes{{2, sizes}});
    CommDebugMode comms;
    at::Tensor out = zigzag_shard(src, 0, 2);
    EXPECT_EQ(comms.count("all_to_all"), n > 1 ? 1 : 0) << comms.table();
    EXPECT_EQ(comms.total(), n > 1 ? 1 : 0) << comms.table();
    return out;
  }();
  EXPECT_EQ(spec(z).sharding_of(2)->sizes, zigzag_shard_sizes(total(sizes), n));
  EXPECT_TRUE(at::equal(full_tensor(z), y));
  {
    CommDebugMode comms;
    const at::Tensor back = zigzag_unshard(z, 0, 2);
    EXPECT_EQ(comms.total(), n > 1 ? 1 : 0) << comms.table();
    EXPECT_TRUE(at::equal(full_tensor(back), y));
  }
}

// bfloat16, the stated tolerance: the ring merges its blocks in float32, so against a float64
// oracle its error (values and the three gradients) stays within twice one process's own
// bfloat16 error, plus 1e-3 absolute; on these inputs both are about 1e-2 in the values.
// Uneven shards with an empty one, causal, grouped heads.
TEST(Attention, BFloat16RingStaysWithinOneProcessRounding) {
  SKIP_WITHOUT_SDPA();
  const int64_t n = mesh_1d().size(0);
  const std::vector<int64_t> sizes = with_an_empty_shard(n);
  const int64_t s = total(sizes);
  const at::Tensor q = draw({1, 4, s, 16}, 95).to(at::kDouble), k = draw({1, 2, s, 16}, 96).to(at::kDouble),
                   v = draw({1, 2, s, 16}, 97).to(at::kDouble), grad = draw({1, 4, s, 16}, 98).to(at::kDouble);
  // Values and the three gradients of one computation on inputs made by `make` from q, k, v.
  auto run = [&](const std::function<at::Tensor(const at::Tensor&)>& make, const std::function<at::Tensor(const at::Tensor&)>& whole) {
    const at::Tensor a = make(q).requires_grad_(), b = make(k).requires_grad_(), c = make(v).requires_grad_();
    const at::Tensor out = sdpa(a, b, c, /*is_causal=*/true);
    (out * make(grad)).sum().backward();
    return std::vector<at::Tensor>{whole(out).to(at::kDouble), whole(a.grad()).to(at::kDouble), whole(b.grad()).to(at::kDouble),
                                   whole(c.grad()).to(at::kDouble)};
  };
  const auto plain = [](const at::Tensor& t) { return t; };
  const std::vector<at::Tensor> oracle = run([](const at::Tensor& t) { return t.clone(); }, plain);
  const std::vector<at::Tensor> one = run([](const at::Tensor& t) { return t.to(at::kBFloat16); }, plain);
  const std::vector<at::Tensor> ring = run(
      [&](const at::Tensor& t) { return distribute_tensor(t.to(at::kBFloat16), mesh_1d(), {Shard(2)}, ShardSizes{{2, sizes}}); },
      [](const at::Tensor& t) { return full_tensor(t); });
  const char* what[] = {"output", "query gradient", "key gradient", "value gradient"};
  for (size_t i = 0; i < oracle.size(); ++i) {
    const double one_error = (one[i] - oracle[i]).abs().max().item<double>(), ring_error = (ring[i] - oracle[i]).abs().max().item<double>();
    EXPECT_LE(ring_error, 2 * one_error + 1e-3) << what[i] << ": one process " << one_error << ", ring " << ring_error;
    EXPECT_GT(one_error, 0.0) << what[i] << ": bfloat16 rounding went missing";
    if (mesh_1d().coordinate()[0] == 0)
      std::printf("bfloat16 %s, max error against float64: one process %.3g, ring %.3g\n", what[i], one_error, ring_error);
  }
}

namespace {

// Counts the bytes the CPU allocator hands out and takes back on this thread while alive, through
// libtorch's memory-profiling hook (the thread-local PROFILER_STATE debug info): `peak` is the
// most that was live at once above what was live when it started.
class AllocationMeter : public c10::MemoryReportingInfoBase {
 public:
#if TORCH_VERSION_MAJOR >= 2
  using Total = size_t;
#else
  using Total = int64_t;
#endif
  void reportMemoryUsage(void*, int64_t alloc_size, Total, Total, c10::Device device) override {
    if (device.type() != c10::DeviceType::CPU) return;
    live_ += alloc_size;
    peak_ = std::max(peak_, live_);
  }
  bool memoryProfilingEnabled() const override { return true; }
  int64_t peak() const { return peak_; }

 private:
  int64_t live_ = 0, peak_ = 0;
};

// The most bytes live at once above the start, on this thread, while `step` runs on one thread
// (the operator's scratch buffers grow with the thread count).
int64_t peak_bytes_of(const std::function<void()>& step) {
  const auto meter = std::make_shared<AllocationMeter>();
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  {
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, meter);
    step();
  }
  at::set_num_threads(threads);
  return meter->peak();
}

}  // namespace

// A long sequence's forward stays within a memory budget that the gathered K/V alone would
// exceed (from 3 ranks on): two K/V block pairs (the one attended to, received in the previous
// step, and the one arriving), this rank's float32 output accumulator and the operator's block
// output, plus 1.5 MiB for the operator's own buffers and the statistics. Each rank holds 1/N of
// K and V (8 MiB gathered) before the call; a quarter as many query rows as keys keeps the
// outputs small beside the blocks, as in a long-context prefill.
TEST(Attention, LongSequenceRingStaysInABudgetTheGatheredKeysExceed) {
  SKIP_WITHOUT_SDPA();
  const int64_t n = mesh_1d().size(0), me = mesh_1d().coordinate()[0];
  const int64_t b = 1, h = 2, sk = 8192, sq = sk / 4, d = 64, float_bytes = 4;
  const std::vector<int64_t> key_sizes = chunk_sizes(sk, n), row_sizes = chunk_sizes(sq, n);
  const int64_t longest = *std::max_element(key_sizes.begin(), key_sizes.end());
  const int64_t gathered_kv = 2 * b * h * sk * d * float_bytes;
  const int64_t blocks_in_flight = n > 1 ? 2 * (2 * b * h * longest * d * float_bytes) : 0;
  const int64_t outputs = 2 * b * h * row_sizes[me] * d * float_bytes;
  const int64_t budget = blocks_in_flight + outputs + 3 * (1 << 19);
  if (n >= 3) ASSERT_GT(gathered_kv, budget) << "the sizes no longer make the point";
  const at::Tensor q = distribute_tensor(draw({b, h, sq, d}, 1), mesh_1d(), {Shard(2)}),
                   k = distribute_tensor(draw({b, h, sk, d}, 2), mesh_1d(), {Shard(2)}),
                   v = distribute_tensor(draw({b, h, sk, d}, 3), mesh_1d(), {Shard(2)});
  sdpa(q, k, v, /*is_causal=*/false);  // warm: the propagation and its plan are cached
  const int64_t peak = peak_bytes_of([&] {
    at::NoGradGuard no_grad;
    sdpa(q, k, v, /*is_causal=*/false);
  });
  EXPECT_GT(peak, 0) << "the allocation hook reported nothing";
  EXPECT_LE(peak, budget) << "peak " << peak << " bytes; gathered K/V " << gathered_kv;
  if (me == 0)
    std::printf("ring forward, Sk = %lld on %lld ranks: peak %.2f MiB, budget %.2f MiB, gathered K/V %.2f MiB\n",
                static_cast<long long>(sk), static_cast<long long>(n), peak / 1048576.0, budget / 1048576.0,
                gathered_kv / 1048576.0);
}

namespace {

// The projections of a one-layer (causal or not) self-attention model, x [1, S, E] -> [1, S, E]:
// q, k, v = x W^T split into heads, SDPA, heads merged, then the output projection. Plain or
// ShardTensor parameters alike.
struct LongSequenceModel {
  int64_t heads = 2, head_dim = 32;
  std::vector<at::Tensor> weights;  // W_q, W_k, W_v, W_o, each [E, E]
  bool gather_keys = false;         // gather-then-attend: keys and values replicated before SDPA
  bool is_causal = false;

  at::Tensor heads_of(const at::Tensor& x, const at::Tensor& w) const {
    return at::linear(x, w).view({x.size(0), x.size(1), heads, head_dim}).transpose(1, 2);
  }
  at::Tensor loss(const at::Tensor& x, const at::Tensor& target) const {
    at::Tensor keys = heads_of(x, weights[1]), values = heads_of(x, weights[2]);
    if (gather_keys) keys = redistribute(keys, {Replicate()}), values = redistribute(values, {Replicate()});
    const at::Tensor attended = sdpa(heads_of(x, weights[0]), keys, values, is_causal);
    const at::Tensor merged = attended.transpose(1, 2).reshape({x.size(0), x.size(1), heads * head_dim});
    return at::mse_loss(at::linear(merged, weights[3]), target);
  }
};

// One Adam step of `model` on (x, target); returns the loss as one process sees it.
double adam_step(const LongSequenceModel& model, torch::optim::Adam& adam, const at::Tensor& x, const at::Tensor& target) {
  adam.zero_grad();
  const at::Tensor loss = model.loss(x, target);
  loss.backward();
  adam.step();
  return (is_shard_tensor(loss) ? full_tensor(loss) : loss).item<double>();
}

}  // namespace

// Item 5 of the context-parallel issue: a long sequence (S = 8192, uneven shards) trained with
// Adam through the ring matches one process, causal or not, and so does gather-then-attend
// (keys and values replicated before SDPA, their gradients reduced back). The ring's training
// step (forward, backward, Adam) stays within what the same step costs on this rank's rows
// alone (measured: the model on plain tensors of that many rows) plus eight blocks, a block
// being the longest shard's keys (or values): during a block's compute the backward holds that
// block, its two gradient accumulators, the next block's keys and values (in flight) and the
// operator's block gradients; plus 1 MiB for the operator's buffers: O(S/N) per rank. Under a
// causal mask that holds on the last rank too only because each block's gradients go home as
// soon as they are final. Where the whole K/V (2N blocks) exceeds those eight blocks and the
// 1 MiB (from 8 ranks on: ctest runs this test at 8 ranks too), the limit is one the gathered
// keys and values would not fit, and gather-then-attend's step is checked to exceed it.
TEST(Attention, LongSequenceTrainingMatchesOneProcessWithinBlocksOfMemory) {
  SKIP_WITHOUT_SDPA();
  const int64_t n = mesh_1d().size(0), me = mesh_1d().coordinate()[0];
  const int64_t s = 8192, e = 64, float_bytes = 4;
  std::vector<int64_t> rows = chunk_sizes(s, n);  // uneven: 64 rows move from the last shard to the first
  if (n > 1) rows.front() += 64, rows.back() -= 64;
  const int64_t block = *std::max_element(rows.begin(), rows.end()) * e * float_bytes;

  at::manual_seed(5);
  std::vector<at::Tensor> initial;
  for (int i = 0; i < 4; ++i) initial.push_back(at::randn({e, e}) / std::sqrt(static_cast<double>(e)));
  const at::Tensor x = draw({1, s, e}, 21), target = draw({1, s, e}, 22);
  const ShardSizes sequence = {{1, rows}};
  const at::Tensor sx = distribute_tensor(x, mesh_1d(), {Shard(1)}, sequence),
                   starget = distribute_tensor(target, mesh_1d(), {Shard(1)}, sequence);

  // Two Adam steps of `model` on (x, target), the second one metered: the first warms the
  // propagation cache and creates Adam's state. Returns the two losses and the peak.
  auto train = [&](LongSequenceModel& model, bool sharded, const at::Tensor& input, const at::Tensor& wanted, int64_t* peak) {
    for (const at::Tensor& w : initial)
      model.weights.push_back((sharded ? distribute_tensor(w, mesh_1d(), {Replicate()}) : w.clone()).requires_grad_());
    torch::optim::Adam adam(model.weights, torch::optim::AdamOptions(1e-3));
    std::vector<double> losses = {adam_step(model, adam, input, wanted)};
    *peak = peak_bytes_of([&] { losses.push_back(adam_step(model, adam, input, wanted)); });
    return losses;
  };
  for (const bool is_causal : {false, true}) {
    SCOPED_TRACE(is_causal ? "causal" : "not causal");
    LongSequenceModel reference, ring, gather, alone;
    for (LongSequenceModel* m : {&reference, &ring, &gather, &alone}) m->is_causal = is_causal;
    gather.gather_keys = true;
    int64_t reference_peak = 0, ring_peak = 0, gather_peak = 0, alone_peak = 0;
    const std::vector<double> expected = train(reference, false, x, target, &reference_peak);
    const std::vector<std::pair<const char*, LongSequenceModel*>> layouts = {{"ring", &ring}, {"gather-then-attend", &gather}};
    for (const auto& [name, model] : layouts) {
      const std::vector<double> losses = train(*model, true, sx, starget, model == &ring ? &ring_peak : &gather_peak);
      for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(losses[i], expected[i], 1e-5 * std::abs(expected[i])) << name << ", step " << i;
      // Adam divides each gradient by its own magnitude, so a weight whose gradient is near zero
      // moves by up to the learning rate on float32 rounding: 1% of the learning rate absolute.
      for (size_t i = 0; i < reference.weights.size(); ++i) {
        const at::Tensor got = full_tensor(model->weights[i]).detach(), want = reference.weights[i].detach();
        EXPECT_TRUE(at::allclose(got, want, 1e-4, 1e-5)) << name << ", weight " << i << ": max difference " << (got - want).abs().max().item<double>();
      }
    }
    train(alone, false, x.narrow(1, 0, rows[me]).contiguous(), target.narrow(1, 0, rows[me]).contiguous(), &alone_peak);

    const int64_t limit = alone_peak + 8 * block + (1 << 20), gathered_kv = 2 * s * e * float_bytes;
    EXPECT_LE(ring_peak, limit) << "ring: peak " << ring_peak << " bytes; the model on " << rows[me] << " rows alone " << alone_peak
                                << "; a block " << block;
    const bool gathered_exceeds_limit = alone_peak + gathered_kv > limit;
    if (n >= 8) ASSERT_TRUE(gathered_exceeds_limit) << "the sizes no longer make the point";
    if (gathered_exceeds_limit) EXPECT_GT(gather_peak, limit) << "gather-then-attend fits the limit that its gathered K/V exceeds";
    if (me == 0 || me == n - 1)
      std::printf("training step%s, S = %lld on %lld ranks (rank %lld): ring %.2f MiB, gather-then-attend %.2f MiB, limit %.2f MiB "
                  "(%lld rows alone %.2f MiB + 8 blocks of %.2f MiB + 1 MiB%s); one process, all rows: %.2f MiB\n",
                  is_causal ? " (causal)" : "", static_cast<long long>(s), static_cast<long long>(n), static_cast<long long>(me),
                  ring_peak / 1048576.0, gather_peak / 1048576.0, limit / 1048576.0, static_cast<long long>(rows[me]),
                  alone_peak / 1048576.0, block / 1048576.0, gathered_exceeds_limit ? ", below alone + the gathered K/V" : "",
                  reference_peak / 1048576.0);
  }
}

// The operator sweep's attention cases (op_sweep_test.cpp lays every input out at random:
// sequence, batch, heads, the head dim, replicated, Partial, on 1-D and 2-D meshes).
std::vector<Case> shardtensor::testing::attention_cases() {
  if (!sdpa_op()) return {};
  std::vector<Case> cases;
  for (bool is_causal : {false, true})
    for (int64_t kv_heads : {4, 2})
      cases.push_back(on(std::string("scaled_dot_product_attention") + (is_causal ? " causal" : "") + (kv_heads == 2 ? " gqa" : ""),
                         [kv_heads] { return Tensors{normal({2, 4, 6, 4}), normal({2, kv_heads, 5, 4}), normal({2, kv_heads, 5, 4})}; },
                         [is_causal](const Tensors& x) { return sdpa(x[0], x[1], x[2], is_causal); }));
  cases.push_back(on("scaled_dot_product_attention with a mask",
                     [] { return Tensors{normal({2, 4, 6, 4}), normal({2, 4, 5, 4}), normal({2, 4, 5, 4}), normal({6, 5})}; },
                     [](const Tensors& x) { return sdpa(x[0], x[1], x[2], false, x[3]); }, /*constants=*/{3}));
  return cases;
}
