// The attention ring's batches, lowered for every rank in one process
// (kernels/attention_blocks.h: ring_batches): every block a rank sends is the one its peer
// expects in the same batch, each phase has the batches its plan declares, and every block's
// gradients reach their owner once. A lowering where two ranks disagree would hang or raise in
// a distributed run; here it fails naming the batch.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/attention_blocks.h"
#include "spec/sequence_order.h"

using namespace shardtensor;

namespace {

// (sender, receiver, block, rows): one block's transfer as both sides list it.
using Transfer = std::tuple<int64_t, int64_t, int64_t, int64_t>;

std::string to_string(const std::multiset<Transfer>& transfers) {
  std::ostringstream out;
  for (const auto& [from, to, block, rows] : transfers) out << " " << from << "->" << to << ":block" << block << "x" << rows;
  return out.str();
}

AttentionPlan ring_plan(const std::vector<Pieces>& pieces, bool causal) {
  AttentionPlan plan(DeviceMesh::without_comms({static_cast<int64_t>(pieces.size())}, 0));
  plan.pass = AttentionPlan::Pass::Backward;
  plan.ring = true;
  plan.is_causal = causal;
  plan.seq_mesh_dim = 0;
  plan.query_rows = plan.key_rows = pieces;
  return plan;
}

std::vector<Pieces> contiguous(const std::vector<int64_t>& sizes) {
  std::vector<Pieces> pieces;
  int64_t at = 0;
  for (int64_t s : sizes) {
    pieces.push_back({{at, at + s}});
    at += s;
  }
  return pieces;
}

void expect_ring_lowering_agrees(const AttentionPlan& plan, const std::string& what) {
  const int64_t n = plan.ring_size();
  std::map<int64_t, int64_t> homecomings;  // block -> receives of its gradients by its owner
  for (const MoveStep& move : plan.moves()) {
    const RingStep& step = std::get<RingStep>(move);
    std::vector<std::vector<RingBatch>> by_rank;
    for (int64_t r = 0; r < n; ++r) {
      by_rank.push_back(ring_batches(plan, step.phase, r));
      ASSERT_EQ(static_cast<int64_t>(by_rank.back().size()), step.batches) << what << ": " << to_string(move) << " on rank " << r;
    }
    for (int64_t k = 0; k < step.batches; ++k) {
      std::multiset<Transfer> sent, received;
      for (int64_t r = 0; r < n; ++r) {
        for (const RingTransfer& t : by_rank[r][k].sends) {
          EXPECT_EQ(t.rows, length(plan.local_keys(t.block))) << what;
          sent.insert({r, t.peer, t.block, t.rows});
        }
        for (const RingTransfer& t : by_rank[r][k].receives) {
          received.insert({t.peer, r, t.block, t.rows});
          if (step.phase != RingPhase::Pass && t.block == r) ++homecomings[r];
        }
      }
      EXPECT_EQ(to_string(sent), to_string(received)) << what << ": " << to_string(move) << " batch " << k << ", sent (left) against received";
    }
  }
  for (int64_t block = 0; block < n; ++block)
    EXPECT_EQ(homecomings[block], plan.gradient_holder(block) != block ? 1 : 0)
        << what << ": block " << block << "'s gradients, held by rank " << plan.gradient_holder(block);
}

}  // namespace

TEST(RingLowering, EveryRankSendsWhatItsPeerExpects) {
  for (bool causal : {false, true}) {
    const std::string how = causal ? "causal " : "";
    for (const std::vector<int64_t>& sizes : std::vector<std::vector<int64_t>>{
             {3, 3}, {2, 5}, {3, 3, 3}, {4, 0, 2}, {1, 2, 3, 4}, {3, 0, 0, 5}, {0, 4, 4, 4}, {5, 3, 0, 1}}) {
      std::string name = how + "sizes";
      for (int64_t s : sizes) name += " " + std::to_string(s);
      expect_ring_lowering_agrees(ring_plan(contiguous(sizes), causal), name);
    }
    for (int64_t n : {2, 3, 4})
      for (int64_t length : {4 * n, 4 * n + 3}) {
        std::vector<Pieces> zigzag;
        for (int64_t r = 0; r < n; ++r) zigzag.push_back(zigzag_positions(length, n, r));
        AttentionPlan plan = ring_plan(zigzag, causal);
        plan.zigzag = true;
        expect_ring_lowering_agrees(plan, how + "zigzag of " + std::to_string(length) + " over " + std::to_string(n));
      }
  }
}

// A causal ring of contiguous shards skips what no rank needs: block b stops on the last rank,
// so the forward's last batches carry fewer blocks, and each block's gradients go home from there.
TEST(RingLowering, CausalRingSendsOnlyBlocksBelowTheDiagonal) {
  const AttentionPlan plan = ring_plan(contiguous({3, 3, 3, 3}), /*is_causal=*/true);
  int64_t blocks = 0;
  for (int64_t r = 0; r < 4; ++r)
    for (const RingBatch& b : ring_batches(plan, RingPhase::Pass, r)) blocks += static_cast<int64_t>(b.sends.size());
  EXPECT_EQ(blocks, 3 + 2 + 1);  // block b moves 3 - b times
}
