// The backward of AttentionPlan (rules/attention.h); kernels/attention.cpp has the forward and
// the block helpers both use.
//
// Each ring step is two message batches. The first passes the held block's keys and values on
// before the block is computed, so the transfer overlaps the compute (as in the forward). The
// second, after the compute, passes the block's key and value gradient accumulators on behind
// it (they need this rank's share first) and receives those of the block that just arrived.
// One batch for both would hold the next block's accumulators during the compute as well: in
// two, the blocks in flight during a compute are the block itself, its accumulators, the next
// block's keys and values and the operator's block gradients (8 blocks' worth, not 10), beside
// what any layout holds: this rank's own key and value gradients once they are final here (the
// operator's outputs) and the query gradient with the operator's share of it (query-sized). A
// block stops on the last rank that needs it (Note [Ring schedule]); its accumulators go home
// to its owner from there, in that step's gradient batch where there is one, else in one batch
// after the ring.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <map>
#include <memory>

#include "kernels/attention_blocks.h"
#include "kernels/stack.h"

namespace shardtensor {
namespace {

using Gradients = std::vector<at::Tensor>;  // a block's key and value gradients (accumulated)

// Zeroed accumulators for block `block`: views of one buffer, so that a ring batch sends them on
// as they lie (redistribute/lowered_step.h: views_of_one_buffer). `like` is this rank's own key
// and value gradients, whose length along the sequence (dim 2) is replaced by the block's.
Gradients block_gradients(const AttentionPlan& plan, int64_t block, const Gradients& like) {
  std::vector<std::vector<int64_t>> shapes;
  for (const at::Tensor& l : like) {
    shapes.push_back(l.sizes().vec());
    shapes.back()[2] = length(plan.local_keys(block));
  }
  return views_of_one_buffer(shapes, like.at(0).options(), /*zeroed=*/true);
}

// The ring's gradient state on one rank: the accumulators of the block it holds, those parked
// here until the ring ends, and its own, where they came home during the ring.
struct RingGradients {
  Gradients like;  // this rank's own key and value gradients' shapes and dtypes
  int64_t held_index = 0;
  Gradients held;  // empty until the block's first contribution here or on the way
  std::map<int64_t, Gradients> parked;
  Gradients mine;

  // The held block's accumulators, zeros where nothing was added to them yet.
  Gradients& accumulators(const AttentionPlan& plan) {
    if (held.empty()) held = block_gradients(plan, held_index, like);
    return held;
  }
};

// Step `step`'s gradient batch, batch `batch` of the plan's GradientPass (every rank runs one
// where the keys' batch ran): block `state->held_index`'s accumulators move on behind it, go
// home where they are final, or stay parked here; those of block `next_index` (held from the
// next step on) come from the previous rank where the block came with the keys' batch, and this
// rank's own come home where the plan sends them now (ring_batches lowered which).
void pass_gradients(const AttentionPlan& plan, const KernelMoves& moves, int64_t batch, int64_t step, int64_t next_index,
                    RingGradients* state) {
  const int64_t me = plan.mesh.coordinate()[plan.seq_mesh_dim], block = state->held_index;
  const bool here = plan.present(block, step);
  if (here) state->accumulators(plan);
  const RingBatch& lowered = moves.ring_batch(RingPhase::GradientPass, batch);
  std::vector<Gradients> sent;
  for (const RingTransfer& t : lowered.sends) {
    TORCH_INTERNAL_ASSERT(here && t.block == block, "the ring's gradient pass sends block ", t.block, " but holds block ", block);
    sent.push_back(state->held);
  }
  std::vector<Gradients> received = moves.run_ring(RingPhase::GradientPass, batch, sent, state->like);
  if (here && lowered.sends.empty()) state->parked[block] = std::move(state->held);
  state->held.clear();
  for (size_t i = 0; i < received.size(); ++i) {
    const int64_t arrived = lowered.receives[i].block;
    TORCH_INTERNAL_ASSERT(arrived == me || arrived == next_index);
    (arrived == me ? state->mine : state->held) = std::move(received[i]);
  }
  state->held_index = next_index;
}

// After the ring: sends the gradient accumulators still parked on this rank to their owners,
// and receives this rank's own unless they came home during the ring (`mine` holds them then).
Gradients return_gradients(const AttentionPlan& plan, const KernelMoves& moves, int64_t me, RingGradients state) {
  if (!moves.declares_ring(RingPhase::Return)) return state.mine.empty() ? state.parked.at(me) : state.mine;
  const RingBatch& lowered = moves.ring_batch(RingPhase::Return, 0);
  std::vector<Gradients> sent;
  for (const RingTransfer& t : lowered.sends) sent.push_back(state.parked.at(t.block));
  TORCH_INTERNAL_ASSERT(sent.size() == state.parked.size() - state.parked.count(me), "the ring returns ", sent.size(),
                        " blocks' gradients but holds ", state.parked.size());
  if (plan.gradient_holder(me) == me) state.mine = state.parked.at(me);
  std::vector<Gradients> received = moves.run_ring(RingPhase::Return, 0, sent, state.like);
  if (!received.empty()) state.mine = std::move(received[0]);
  return state.mine;
}

}  // namespace

// The backward of any SDPA operator (AttentionOperator; attention_operators.cpp calls each).
// Every one takes (grad_out, query, key, value, out, logsumexp), by these names but for the
// efficient operator's first, which its schema calls grad_out_.
LocalKernel attention_backward(const AttentionPlan& plan, const KernelMoves& moves) {
  return [plan, moves](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    OpArguments args(op, stack);
    const at::Tensor grad_out = args.tensor(plan.op == AttentionOperator::CudaEfficient ? "grad_out_" : "grad_out"),
                     query = args.tensor("query"), key = args.tensor("key"), value = args.tensor("value"),
                     out = args.tensor("out"), lse = args.tensor("logsumexp");
    const c10::optional<at::Tensor> user_mask = caller_mask(args);
    const int64_t n = plan.ring_size(), me = plan.seq_mesh_dim >= 0 ? plan.mesh.coordinate()[plan.seq_mesh_dim] : 0;
    const Pieces& rows = plan.query_rows_at(me);

    // The efficient operator's log-sum-exp needs its padding back: it takes the general path.
    if ((!plan.ring || n == 1) && plan.op != AttentionOperator::CudaEfficient && !empty(query) && !empty(key) && rows.size() == 1 &&
        plan.local_keys(me).size() == 1) {
      const Range keys = plan.local_keys(me)[0];
      const std::vector<BlockCall> calls = block_calls(rows, {keys}, plan.is_causal, user_mask, query, plan.square_causal_only());
      // The whole local block, placed where the operator's own call places it (a causal diagonal
      // from the first row and key; the mask's columns these keys): the operator itself, on its
      // own arguments.
      const bool same_mask = calls.size() == 1 && (!plan.is_causal || (calls[0].is_causal && rows[0].begin == 0)) &&
                             (!plan.keys_split || !user_mask || !user_mask->defined());
      if (same_mask && calls[0].visible.rows == rows[0] && calls[0].visible.keys == keys) {
        std::move(args).call(op, stack);
        return;
      }
    }

    const at::ScalarType acc = accumulation_type(query.scalar_type());
    at::Tensor grad_query;  // the first block over every row gives it, else zeros: never both at once
    KeyBlock held{me, {key.contiguous(), value.contiguous()}};
    // The keys' and values' shapes and dtypes (one element, expanded): not their contiguous
    // copies, which go as soon as the first pass has sent them on.
    const std::vector<at::Tensor> keys_values{at::empty({}, key.options()).expand(key.sizes()), at::empty({}, value.options()).expand(value.sizes())};
    RingGradients grads;
    grads.held_index = me;
    // Shapes and dtypes of this rank's own key and value gradients (one element, expanded).
    grads.like = {at::empty({}, key.options().dtype(acc)).expand(key.sizes()), at::empty({}, value.options().dtype(acc)).expand(value.sizes())};
    for (int64_t step = 0, batch = 0; step < n; ++step) {
      // This step's blocks, computed while the next block travels.
      const auto compute = [&] {
        const std::vector<BlockCall> calls = step_calls(plan, step, held.index, held.parts[0], rows, user_mask, query);
        for (const BlockCall& c : calls) {
          const std::vector<at::Tensor> r =
              backward_block(plan, op, args, rows_of(grad_out, c), rows_of(query, c), keys_of(held.parts[0], c), keys_of(held.parts[1], c),
                             rows_of(out, c), lse.narrow(2, c.row_offset, c.visible.rows.size()), c);
          if (!grad_query.defined() && c.row_offset == 0 && c.visible.rows.size() == query.size(2)) {
            grad_query = r[0].to(acc);
          } else {
            if (!grad_query.defined()) grad_query = at::zeros(query.sizes(), query.options().dtype(acc));
            rows_of(grad_query, c).add_(r[0]);
          }
          if (grads.held.empty() && calls.size() == 1 && c.key_offset == 0 && c.visible.keys.size() == held.parts[0].size(2)) {
            // The first contribution, over every key: the operator's own (contiguous: it travels).
            grads.held = {r[1].to(acc).contiguous(), r[2].to(acc).contiguous()};
          } else {
            Gradients& sums = grads.accumulators(plan);
            keys_of(sums[0], c).add_(r[1]);
            keys_of(sums[1], c).add_(r[2]);
          }
        }
      };
      if (!passes_after(plan, step)) {  // no block moves any more: this one's gradients stay here
        compute();
        if (plan.present(held.index, step)) grads.parked[held.index] = std::move(grads.accumulators(plan));
        continue;
      }
      // The keys and values just computed are not kept through the gradients' batch: the pass
      // replaces them with the next block's, and frees what it packed to send.
      pass_keys(plan, moves, batch, keys_values, &held, compute);
      pass_gradients(plan, moves, batch, step, held.index, &grads);
      ++batch;
    }
    const Gradients key_value_grads =
        plan.ring ? return_gradients(plan, moves, me, std::move(grads)) : std::move(grads.parked.at(me));
    if (!grad_query.defined()) grad_query = at::zeros(query.sizes(), query.options().dtype(acc));  // no row saw a key
    push_backward_results(plan, stack, grad_query, key_value_grads[0], key_value_grads[1], query, key, value);
  };
}

}  // namespace shardtensor
