// What the attention kernels share (kernels/attention.cpp: forward, attention_backward.cpp):
// one block call of the operator, placed by global positions, and the ring's batches, lowered
// from the plan. Defined in kernels/attention_blocks.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>

#include <functional>
#include <memory>
#include <vector>

#include "domain/kernel_moves.h"
#include "kernels/stack.h"
#include "rules/attention.h"

namespace c10 {
class OperatorHandle;
}

namespace shardtensor {

// Merges and gradient sums run in this precision: float32, float64 for double inputs.
at::ScalarType accumulation_type(at::ScalarType t);
// The operator's log-sum-exp dtype (float32 below float64).
at::ScalarType lse_type(at::ScalarType t);

inline bool empty(const at::Tensor& t) { return t.numel() == 0; }

// One call of the operator on a block: where its visible rows and keys sit inside the local
// query rows and the key block, and the mask to pass (undefined: none).
struct BlockCall {
  VisibleBlock visible;
  int64_t row_offset = 0, key_offset = 0;
  at::Tensor mask;
  bool is_causal = false;  // the operator's own causal mask fits (first row meets first key, no user mask)
};

// Local rows `rows` against keys `keys` (global positions; pieces of each, see Pieces in
// rules/attention.h): one call per pair of pieces that sees anything, offsets counted in local
// order. `user` is the caller's mask over the local rows and every key (the rule keeps it
// whole along the keys); under an offset diagonal, or with a user mask, the causal part is
// added to the mask as -inf. `square_causal_only`: see AttentionPlan::square_causal_only.
std::vector<BlockCall> block_calls(const Pieces& rows, const Pieces& keys, bool is_causal, const c10::optional<at::Tensor>& user,
                                   const at::Tensor& query, bool square_causal_only);

// The calls of ring step `step` on this rank: its rows `rows` against block `held_index`, where
// that block reaches this rank at this step and neither side is empty; none otherwise.
std::vector<BlockCall> step_calls(const AttentionPlan& plan, int64_t step, int64_t held_index, const at::Tensor& held_keys,
                                  const Pieces& rows, const c10::optional<at::Tensor>& user, const at::Tensor& query);

inline at::Tensor rows_of(const at::Tensor& t, const BlockCall& c) { return t.narrow(2, c.row_offset, c.visible.rows.size()); }
inline at::Tensor keys_of(const at::Tensor& t, const BlockCall& c) { return t.narrow(2, c.key_offset, c.visible.keys.size()); }
inline c10::IValue optional_tensor(const at::Tensor& t) { return t.defined() ? c10::IValue(t) : c10::IValue(); }

// The caller's mask (attn_mask; attn_bias for the efficient and cuDNN operators), where there is one.
c10::optional<at::Tensor> caller_mask(const OpArguments& args);

// One call of the operator on a block, whichever of the SDPA operators it is
// (kernels/attention_operators.cpp). `args` are the operator's own arguments (the dropout
// probability, the scale and the forward's other outputs are read from them by name); the
// tensors are the block's.
struct BlockForward {
  at::Tensor out, lse;               // lse [B, H, rows]: without the efficient operator's padding
  std::vector<c10::IValue> others;   // the operator's returns after those two
};
BlockForward forward_block(const AttentionPlan& plan, const c10::OperatorHandle& op, const OpArguments& args,
                           const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const BlockCall& c);
// (grad_query, grad_key, grad_value) of the block.
std::vector<at::Tensor> backward_block(const AttentionPlan& plan, const c10::OperatorHandle& op, const OpArguments& args,
                                       const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key,
                                       const at::Tensor& value, const at::Tensor& out, const at::Tensor& lse, const BlockCall& c);
// Leaves the forward's results on `stack` as the operator would: `out` and `lse` (merged, in
// the accumulation type), then the operator's other outputs, taken from `first` (the `others`
// of this rank's first block call) or, where this rank called nothing, empty stand-ins that no
// backward reads (with dropout 0 the operators read none of them).
void push_forward_results(const AttentionPlan& plan, torch::jit::Stack* stack, const at::Tensor& out, const at::Tensor& lse,
                          const std::vector<c10::IValue>& first, const at::Tensor& query, const at::Tensor& key);
void push_backward_results(const AttentionPlan& plan, torch::jit::Stack* stack, const at::Tensor& grad_query,
                           const at::Tensor& grad_key, const at::Tensor& grad_value, const at::Tensor& query, const at::Tensor& key,
                           const at::Tensor& value);

// A block of keys as it travels: its owner's coordinate and its tensors (key, value).
struct KeyBlock {
  int64_t index = 0;
  std::vector<at::Tensor> parts;
};

// Whether a batch follows ring step `step`: some block moves on after it (each passing phase
// runs one batch per such step; every rank decides alike, from the plan).
bool passes_after(const AttentionPlan& plan, int64_t step);

// The batches of the plan's ring step of `phase` as the rank at coordinate `me` along the ring
// runs them (Note [Ring schedule] in rules/attention.cpp; the backward's phases are described
// in attention_backward.cpp): which blocks it sends to which group rank, and which it receives.
// Every send is some rank's receive, in the same batch.
std::vector<RingBatch> ring_batches(const AttentionPlan& plan, RingPhase phase, int64_t me);

// Ring step `step`'s pass of the keys and values, which is batch `batch` of the plan's Pass:
// the block held here goes on to the next rank where it moves on, the previous rank's arrives
// where it comes, and `compute` (this step's blocks) runs while they travel. `like` are this
// rank's own key and value. After it `held` is the block of the next step (only its index
// where none arrived: no rank needs that block here or further on).
void pass_keys(const AttentionPlan& plan, const KernelMoves& moves, int64_t batch, const std::vector<at::Tensor>& like, KeyBlock* held,
               const std::function<void()>& compute);

// Split keys (AttentionPlan::keys_split): turns this rank's block result (`out` and `lse` in
// the accumulation type, -inf where its rows saw no key) into its share of the merged output,
// and `lse` into the merged log-sum-exp, after one all-gather of the per-row statistics.
void merge_over_key_shards(const AttentionPlan& plan, const KernelMoves& moves, at::Tensor* out, at::Tensor* lse);

// The backward pass's kernel (kernels/attention_backward.cpp).
LocalKernel attention_backward(const AttentionPlan& plan, const KernelMoves& moves);

}  // namespace shardtensor
