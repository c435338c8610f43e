// See attention_blocks.h.
#include "kernels/attention_blocks.h"


#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <limits>

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
void merge_over_key_shards(const AttentionPlan& plan, const DeclaredGather& gather, at::Tensor* out, at::Tensor* lse) {
  const int64_t n = static_cast<int64_t>(plan.key_rows.size());
  const at::Tensor mine = lse->contiguous();
  if (n == 1 || mine.numel() == 0) return;  // every rank of the group holds the same row count
  const at::Tensor all = gather.run(mine);  // the plan's one declared gather (rules/attention.cpp)
  const at::Tensor merged = at::logsumexp(all, 0);
  const at::Tensor weight = at::where(at::isneginf(merged), at::zeros({}, mine.options()), (mine - merged).exp());
  *out = *out * weight.unsqueeze(-1);
  *lse = merged;
}

std::unique_ptr<MessageBatch> ring_batch(const AttentionPlan& plan, const char* counted_as, const std::vector<at::Tensor>& like) {
  // The widest block's bytes: the layout's, the same on every rank, as the transport's choice must be.
  int64_t row_bytes = 0, widest_rows = 0;
  for (const at::Tensor& t : like) {
    int64_t row = static_cast<int64_t>(t.element_size());  // every dim but the sequence's: a rank without keys counts alike
    for (int64_t d = 0; d < t.dim(); ++d)
      if (d != 2) row *= t.size(d);
    row_bytes += row;
  }
  for (const Pieces& rows : plan.key_rows) widest_rows = std::max(widest_rows, length(rows));
  return std::make_unique<MessageBatch>(plan.mesh, plan.seq_mesh_dim, counted_as, row_bytes * widest_rows, like.at(0).options());
}

std::unique_ptr<MessageBatch> start_pass(const AttentionPlan& plan, int64_t step, const KeyBlock& held, KeyBlock* next) {
  const int64_t n = plan.ring_size();
  if (step + 1 >= n || !plan.any_send(step)) return nullptr;
  const int64_t me = plan.mesh.coordinate()[plan.seq_mesh_dim];
  auto batch = ring_batch(plan, counted_as(RingPhase::Pass), held.parts);
  const int64_t to = (me + 1) % n, from = (me - 1 + n) % n;
  next->index = ((me - step - 1) % n + n) % n;
  next->parts.clear();
  if (plan.sends(held.index, step))
    for (const at::Tensor& part : held.parts) batch->send(to, part);
  if (plan.sends(next->index, step)) {
    std::vector<std::vector<int64_t>> shapes;
    for (const at::Tensor& like : held.parts) {
      shapes.push_back(like.sizes().vec());
      shapes.back()[2] = length(plan.key_rows[next->index]);
    }
    next->parts = batch->receive(from, shapes);
  }
  return batch;
}

void finish_pass(KeyBlock* held, KeyBlock* next) {
  if (next->parts.empty()) {
    held->index = next->index;
  } else {
    std::swap(*held, *next);
  }
}

}  // namespace shardtensor
