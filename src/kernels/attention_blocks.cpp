// See attention_blocks.h.
#include "kernels/attention_blocks.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <set>

namespace shardtensor {
namespace {

at::Tensor minus_infinity_where_not(const at::Tensor& visible, const at::Tensor& query) {
  return at::where(visible, at::zeros({}, query.options()), at::full({}, -std::numeric_limits<double>::infinity(), query.options()));
}

at::Tensor block_mask(const VisibleBlock& v, int64_t row_offset, const c10::optional<at::Tensor>& user,
                      const at::Tensor& query) {
  at::Tensor mask;
  if (user && user->defined()) {
    mask = *user;
    if (mask.dim() >= 2 && mask.size(-2) != 1) mask = mask.narrow(-2, row_offset, v.rows.size());
    // The mask's columns are every key's (it never travels with a block): global positions.
    if (mask.dim() >= 1 && mask.size(-1) != 1) mask = mask.narrow(-1, v.keys.begin, v.keys.size());
    if (mask.scalar_type() == at::kBool) mask = minus_infinity_where_not(mask, query);
  }
  if (v.offset_mask || (v.top_left && mask.defined())) {
    const at::TensorOptions positions = query.options().dtype(at::kLong);
    const at::Tensor rows = at::arange(v.rows.begin, v.rows.end, positions).unsqueeze(1);
    const at::Tensor keys = at::arange(v.keys.begin, v.keys.end, positions).unsqueeze(0);
    const at::Tensor causal = minus_infinity_where_not(keys <= rows, query);
    mask = mask.defined() ? mask + causal : causal;
  }
  return mask;
}

BlockCall make_call(const VisibleBlock& v, int64_t row_offset, int64_t key_offset, const c10::optional<at::Tensor>& user,
                    const at::Tensor& query) {
  BlockCall c;
  c.visible = v;
  c.row_offset = row_offset;
  c.key_offset = key_offset;
  c.mask = block_mask(v, row_offset, user, query);
  c.is_causal = v.top_left && !c.mask.defined();
  return c;
}

// Appends the call(s) for visible block `v`: one, or where the operator's causal mask must be
// square (AttentionPlan::square_causal_only) and the rows outnumber the keys, the square on the
// diagonal and below it the rows that see every key, without mask.
void add_calls(std::vector<BlockCall>* calls, const VisibleBlock& v, int64_t row_offset, int64_t key_offset,
               const c10::optional<at::Tensor>& user, const at::Tensor& query, bool square_causal_only) {
  BlockCall c = make_call(v, row_offset, key_offset, user, query);
  if (!c.is_causal || !square_causal_only || v.rows.size() == v.keys.size()) {
    calls->push_back(std::move(c));
    return;
  }
  const Range square = {v.rows.begin, v.rows.begin + v.keys.size()}, below = {square.end, v.rows.end};
  calls->push_back(make_call(visible_block(square, v.keys, true), row_offset, key_offset, user, query));
  calls->push_back(make_call(visible_block(below, v.keys, false), row_offset + square.size(), key_offset, user, query));
}

}  // namespace

at::ScalarType accumulation_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }
at::ScalarType lse_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

std::vector<BlockCall> block_calls(const Pieces& rows, const Pieces& keys, bool is_causal, const c10::optional<at::Tensor>& user,
                                   const at::Tensor& query, bool square_causal_only) {
  std::vector<BlockCall> calls;
  const std::vector<int64_t> row_starts = local_starts(rows), key_starts = local_starts(keys);
  for (size_t i = 0; i < rows.size(); ++i)
    for (size_t j = 0; j < keys.size(); ++j) {
      const VisibleBlock v = visible_block(rows[i], keys[j], is_causal);
      if (!v.any) continue;
      const int64_t row_offset = row_starts[i] + v.rows.begin - rows[i].begin, key_offset = key_starts[j] + v.keys.begin - keys[j].begin;
      if (v.offset_mask && !(user && user->defined())) {
        // A diagonal that starts after the first key: the keys before the first row are seen by
        // every row (no mask), the rest start on the diagonal (the operator's own causal mask).
        // Two calls instead of a [rows, keys] mask, which would be O(S^2 / N) memory.
        const Range before = {v.keys.begin, v.rows.begin}, after = {v.rows.begin, v.keys.end};
        add_calls(&calls, visible_block(v.rows, before, false), row_offset, key_offset, user, query, square_causal_only);
        add_calls(&calls, visible_block(v.rows, after, true), row_offset, key_offset + before.size(), user, query, square_causal_only);
      } else {
        add_calls(&calls, v, row_offset, key_offset, user, query, square_causal_only);
      }
    }
  return calls;
}

std::vector<BlockCall> step_calls(const AttentionPlan& plan, int64_t step, int64_t held_index, const at::Tensor& held_keys,
                                  const Pieces& rows, const c10::optional<at::Tensor>& user, const at::Tensor& query) {
  if (!plan.present(held_index, step) || empty(query) || empty(held_keys)) return {};
  return block_calls(rows, plan.local_keys(held_index), plan.is_causal, user, query, plan.square_causal_only());
}

// Note [Merging split keys]
// Rank r attended with every row to its own keys only: out_r and lse_r, the softmax over its
// keys. The merged log-sum-exp is lse = log sum_r exp(lse_r), from one all-gather of the
// per-row statistics ([B, H, Sq] each, small beside K and V), and the merged output is
// sum_r exp(lse_r - lse) * out_r. Each rank keeps its term: the output is Partial(sum), so no
// output-sized collective runs unless a reader needs the value (a following linear keeps it
// pending). Rows that no key reaches on any rank get weight 0, not exp(-inf - -inf).
void merge_over_key_shards(const AttentionPlan& plan, const KernelMoves& moves, at::Tensor* out, at::Tensor* lse) {
  const int64_t n = static_cast<int64_t>(plan.key_rows.size());
  const at::Tensor mine = lse->contiguous();
  if (n == 1 || mine.numel() == 0) return;  // every rank of the group holds the same row count
  const at::Tensor all = moves.gather_statistics(mine);  // the plan's one declared gather (rules/attention.cpp)
  const at::Tensor merged = at::logsumexp(all, 0);
  const at::Tensor weight = at::where(at::isneginf(merged), at::zeros({}, mine.options()), (mine - merged).exp());
  *out = *out * weight.unsqueeze(-1);
  *lse = merged;
}

bool passes_after(const AttentionPlan& plan, int64_t step) { return step + 1 < plan.ring_size() && plan.any_send(step); }

std::vector<RingBatch> ring_batches(const AttentionPlan& plan, RingPhase phase, int64_t me) {
  const int64_t n = plan.ring_size(), to = (me + 1) % n, from = (me - 1 + n) % n;
  const auto block_at = [&](int64_t step) { return ((me - step) % n + n) % n; };  // the block here at `step`
  const auto transfer = [&](int64_t peer, int64_t block) { return RingTransfer{peer, block, length(plan.local_keys(block))}; };
  // Backward: the held block's accumulators go on behind it, or home where they are final there.
  const auto gradients_leave = [&](int64_t block, int64_t step) {
    const bool moves_on = plan.present(block, step) && plan.sends(block, step);
    const bool goes_home = plan.present(block, step) && plan.last_step(block) == step && plan.returns_during_ring(block);
    return moves_on ? std::optional<int64_t>(to) : goes_home ? std::optional<int64_t>(block) : std::nullopt;
  };
  std::vector<RingBatch> batches;
  if (phase == RingPhase::Return) {
    // The blocks whose accumulators stay on this rank until the ring ends (attention_backward.cpp
    // parks them), and this rank's own, where they come home only then.
    std::set<int64_t> parked;
    for (int64_t step = 0; step < n; ++step) {
      const int64_t block = block_at(step);
      if (plan.present(block, step) && (!passes_after(plan, step) || !gradients_leave(block, step))) parked.insert(block);
    }
    RingBatch b;
    for (int64_t block : parked)
      if (block != me) b.sends.push_back(transfer(block, block));
    if (plan.gradient_holder(me) != me && !plan.returns_during_ring(me)) b.receives.push_back(transfer(plan.gradient_holder(me), me));
    return {b};
  }
  for (int64_t step = 0; step < n; ++step) {
    if (!passes_after(plan, step)) continue;
    const int64_t held = block_at(step), next = block_at(step + 1);
    RingBatch b;
    if (phase == RingPhase::Pass) {
      if (plan.sends(held, step)) b.sends.push_back(transfer(to, held));
    } else if (const std::optional<int64_t> peer = gradients_leave(held, step)) {
      b.sends.push_back(transfer(*peer, held));
    }
    if (plan.sends(next, step)) b.receives.push_back(transfer(from, next));
    if (phase == RingPhase::GradientPass && plan.last_step(me) == step && plan.returns_during_ring(me))
      b.receives.push_back(transfer(plan.gradient_holder(me), me));  // this rank's own come home
    batches.push_back(std::move(b));
  }
  return batches;
}

MoveLowering AttentionPlan::move_lowering() const {
  MoveLowering how{mesh};
  for (const Pieces& rows : key_rows) how.widest_ring_rows = std::max(how.widest_ring_rows, length(rows));
  how.ring_batches = [this](RingPhase phase) { return ring_batches(*this, phase, mesh.coordinate()[seq_mesh_dim]); };
  return how;
}

void pass_keys(const AttentionPlan& plan, const KernelMoves& moves, int64_t batch, const std::vector<at::Tensor>& like, KeyBlock* held,
               const std::function<void()>& compute) {
  const RingBatch& lowered = moves.ring_batch(RingPhase::Pass, batch);
  std::vector<std::vector<at::Tensor>> sent;
  for (const RingTransfer& t : lowered.sends) {
    TORCH_INTERNAL_ASSERT(t.block == held->index, "the ring's pass sends block ", t.block, " but holds block ", held->index);
    sent.push_back(held->parts);
  }
  std::vector<std::vector<at::Tensor>> received = moves.run_ring(RingPhase::Pass, batch, sent, like, compute);
  const int64_t n = plan.ring_size();
  held->index = (held->index - 1 + n) % n;
  if (received.empty()) return;
  TORCH_INTERNAL_ASSERT(received.size() == 1 && lowered.receives[0].block == held->index);
  held->parts = std::move(received[0]);
}

}  // namespace shardtensor
