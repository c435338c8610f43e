// Attention on ShardTensors: the kernels of AttentionPlan (rules/attention.h; the rule file
// says how each layout is handled).
//
// One engine serves every layout: this rank's query rows attend to a sequence of key blocks,
// each placed by its global positions. Local attention is one block (the local keys); the
// ring is n blocks, each rank's keys and values passed to the next rank along the mesh dim
// (Note [Ring schedule] in rules/attention.cpp), the next block's messages in flight while the
// current one is computed. Blocks merge by log-sum-exp in float32 (float64 for double inputs).
//
// Whole query rows against keys split over the ranks (no ring) is one block per rank, merged
// the same way across ranks: Note [Merging split keys] in attention_blocks.cpp.
//
// The backward calls the operator's own backward once per block with the final output and
// log-sum-exp, which gives each block's exact share of the gradients (the softmax weights of a
// block are exp(scores - lse), lse being the global one). Key and value gradients follow their
// blocks round the ring, one batch behind the keys, and go home to the blocks' owners
// (kernels/attention_backward.cpp).
//
// The operator itself divides by zero on empty sequences (torch 2.15 raises SIGFPE), so it is
// never called on an empty block: empty shards compute nothing and return zeros.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <limits>

#include "kernels/attention_blocks.h"
#include "kernels/stack.h"

namespace shardtensor {
namespace {

// The forward of any SDPA operator (AttentionOperator; attention_operators.cpp calls each).
LocalKernel attention_forward(const AttentionPlan& plan, const KernelMoves& moves) {
  return [plan, moves](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const OpArguments args(op, stack);
    const at::Tensor query = args.tensor("query"), key = args.tensor("key"), value = args.tensor("value");
    const c10::optional<at::Tensor> user_mask = caller_mask(args);
    const int64_t n = plan.ring_size(), me = plan.seq_mesh_dim >= 0 ? plan.mesh.coordinate()[plan.seq_mesh_dim] : 0;
    const Pieces& rows = plan.query_rows_at(me);
    std::vector<int64_t> out_shape = query.sizes().vec(), lse_shape(out_shape.begin(), out_shape.end() - 1);
    out_shape[3] = value.size(3);

    const at::ScalarType acc = accumulation_type(query.scalar_type());
    at::Tensor out, lse;  // merged so far: nothing yet
    std::vector<c10::IValue> first_others;  // of this rank's first block call: the operator's other outputs
    // As they are: the first ring batch packs them into one run (redistribute/executor_ring.cpp),
    // and with nothing to pass the operator reads them in place.
    KeyBlock held{me, {key, value}};
    for (int64_t step = 0, batch = 0; step < n; ++step) {
      // This step's blocks, computed while the next block travels.
      const auto compute = [&] {
        const std::vector<BlockCall> calls = step_calls(plan, step, held.index, held.parts[0], rows, user_mask, query);
        for (const BlockCall& c : calls) {
          BlockForward r = forward_block(plan, op, args, rows_of(query, c), keys_of(held.parts[0], c), keys_of(held.parts[1], c), c);
          if (first_others.empty()) first_others = std::move(r.others);
          const bool whole = rows.size() == 1 && c.visible.rows == rows[0];
          if (!out.defined() && whole && n == 1 && calls.size() == 1) {  // one block over every row: the operator's own result (split keys merge it after)
            out = r.out;
            lse = r.lse;
          } else {
            if (!out.defined()) {
              out = at::zeros(out_shape, query.options().dtype(acc));
              lse = at::full(lse_shape, -std::numeric_limits<double>::infinity(), query.options().dtype(acc));
            }
            at::Tensor o = rows_of(out, c), l = lse.narrow(2, c.row_offset, c.visible.rows.size());
            const at::Tensor block_lse = r.lse.to(acc), merged = at::logaddexp(l, block_lse);
            at::Tensor term = r.out.to(acc);  // the operator's fresh output, weighted in place: no output-sized temporary
            term.mul_((block_lse - merged).exp().unsqueeze(-1));
            o.mul_((l - merged).exp().unsqueeze(-1)).add_(term);
            l.copy_(merged);
          }
        }
      };
      if (passes_after(plan, step))
        pass_keys(plan, moves, batch++, {key, value}, &held, compute);
      else
        compute();
    }
    if (!out.defined()) {  // no rows here, or none of them saw a key
      out = at::zeros(out_shape, query.options().dtype(acc));
      lse = at::full(lse_shape, -std::numeric_limits<double>::infinity(), query.options().dtype(acc));
    }
    if (plan.keys_split) merge_over_key_shards(plan, moves, &out, &lse);
    push_forward_results(plan, stack, out, lse, first_others, query, key);
  };
}

}  // namespace

LocalKernel AttentionPlan::lower(const KernelMoves& moves) const { return pass == Pass::Forward ? attention_forward(*this, moves) : attention_backward(*this, moves); }

}  // namespace shardtensor
