// The backward of AttentionPlan (rules/attention.h); kernels/attention.cpp has the forward and
// the block helpers both use.
//
// Each ring step passes a block's keys and values on before the block is computed (so the
// transfer overlaps the compute), then its key and value gradient accumulators after (they
// need this rank's share first), in the same message batch. A block stops on the last rank
// that needs it (Note [Ring schedule]); its accumulators wait there and go home to its owner in
// one batch at the end.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <map>
#include <memory>

#include "comm/comm.h"
#include "kernels/attention_blocks.h"
#include "kernels/stack.h"

namespace shardtensor {
namespace {

// After the ring: sends the gradient accumulators still parked on this rank to their owners,
// and receives this rank's own unless they came home during the ring (`mine` holds them then).
// `parked` maps a block to its (key, value) gradients.
std::vector<at::Tensor> return_gradients(const AttentionPlan& plan, int64_t me, const std::map<int64_t, std::vector<at::Tensor>>& parked,
                                         const std::vector<at::Tensor>& like, std::vector<at::Tensor> mine) {
  const int64_t n = plan.ring_size();
  auto returns_after_ring = [&](int64_t block) { return plan.gradient_holder(block) != block && !plan.returns_during_ring(block); };
  bool any = false;
  for (int64_t b = 0; b < n; ++b) any = any || returns_after_ring(b);
  if (!any) return mine.empty() ? parked.at(me) : mine;
  Comm& comm = plan.mesh.comm(plan.seq_mesh_dim);
  auto messages = comm.start_messages("ring_return");
  for (const auto& [block, grads] : parked)
    if (block != me)
      for (const at::Tensor& g : grads) messages->send(block, g);
  if (plan.gradient_holder(me) == me) {
    mine = parked.at(me);
  } else if (returns_after_ring(me)) {
    for (const at::Tensor& l : like) {  // this rank's own key and value gradients' shapes
      mine.push_back(at::empty(l.sizes(), l.options()));
      messages->receive(plan.gradient_holder(me), mine.back());
    }
  }
  messages->wait();
  return mine;
}

}  // namespace

// _scaled_dot_product_flash_attention_for_cpu_backward(grad_out, query, key, value, out,
// logsumexp, dropout_p, is_causal, *, attn_mask, scale) -> (grad_query, grad_key, grad_value)
LocalKernel attention_backward(const AttentionPlan& plan) {
  return [plan](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const std::vector<c10::IValue> args = pop_arguments(op, stack);
    const at::Tensor grad_out = args[0].toTensor(), query = args[1].toTensor(), key = args[2].toTensor(),
                     value = args[3].toTensor(), out = args[4].toTensor(), lse = args[5].toTensor();
    const c10::optional<at::Tensor> user_mask = args[8].toOptional<at::Tensor>();
    const int64_t n = plan.ring_size(), me = plan.seq_mesh_dim >= 0 ? plan.mesh.coordinate()[plan.seq_mesh_dim] : 0;
    const Pieces& rows = plan.query_rows_at(me);

    if ((!plan.ring || n == 1) && !empty(query) && !empty(key) && rows.size() == 1 && plan.local_keys(me).size() == 1) {
      const Range keys = plan.local_keys(me)[0];
      const std::vector<BlockCall> calls = block_calls(rows, {keys}, plan.is_causal, user_mask, query);
      // The whole local block, placed where the operator's own call places it (a causal diagonal
      // from the first row and key; the mask's columns these keys): the operator itself, on its
      // own arguments.
      const bool same_mask = calls.size() == 1 && (!plan.is_causal || (calls[0].is_causal && rows[0].begin == 0)) &&
                             (!plan.keys_split || !user_mask || !user_mask->defined());
      if (same_mask && calls[0].visible.rows == rows[0] && calls[0].visible.keys == keys) {
        for (const c10::IValue& a : args) stack->push_back(a);
        op.callBoxed(stack);
        return;
      }
    }

    const at::ScalarType acc = accumulation_type(query.scalar_type());
    at::Tensor grad_query;  // the first block over every row gives it, else zeros: never both at once
    KeyBlock held{me, {key.contiguous(), value.contiguous(), at::zeros(key.sizes(), key.options().dtype(acc)),
                       at::zeros(value.sizes(), value.options().dtype(acc))}};
    KeyBlock next;
    std::map<int64_t, std::vector<at::Tensor>> parked;
    std::vector<at::Tensor> mine;  // this rank's own key and value gradients, where they come home during the ring
    // Shapes and dtypes of this rank's own key and value gradients (one element, expanded).
    const std::vector<at::Tensor> gradient_like = {at::empty({}, key.options().dtype(acc)).expand(key.sizes()),
                                                   at::empty({}, value.options().dtype(acc)).expand(value.sizes())};
    auto bytes_of = [](const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); };
    for (int64_t step = 0; step < n; ++step) {
      // Gradients that are final after this step go home in its batch: the held block's, if it
      // stops here, and this rank's own, from wherever its block stopped.
      DirectBytes home;
      const bool held_goes_home = plan.ring && plan.present(held.index, step) && plan.last_step(held.index) == step &&
                                  plan.returns_during_ring(held.index);
      if (held_goes_home) home.to = held.index, home.bytes_to = bytes_of(held.parts[2]) + bytes_of(held.parts[3]);
      if (plan.ring && plan.last_step(me) == step && plan.returns_during_ring(me))
        home.from = plan.gradient_holder(me), home.bytes_from = bytes_of(gradient_like[0]) + bytes_of(gradient_like[1]);
      const auto messages = start_pass(plan, step, held, /*parts_now=*/2, &next, home);
      if (home.from >= 0)
        for (const at::Tensor& l : gradient_like) {
          mine.push_back(at::empty(l.sizes(), l.options()));
          messages->receive(home.from, mine.back());
        }
      const std::vector<BlockCall> calls = step_calls(plan, step, held.index, held.parts[0], rows, user_mask, query);
      for (const BlockCall& c : calls) {
        const std::vector<at::Tensor> r =
            call(op, {rows_of(grad_out, c), rows_of(query, c), keys_of(held.parts[0], c), keys_of(held.parts[1], c), rows_of(out, c),
                      lse.narrow(2, c.row_offset, c.visible.rows.size()), args[6], c.is_causal, optional_tensor(c.mask), args[9]});
        if (!grad_query.defined() && c.row_offset == 0 && c.visible.rows.size() == query.size(2)) {
          grad_query = r[0].to(acc);
        } else {
          if (!grad_query.defined()) grad_query = at::zeros(query.sizes(), query.options().dtype(acc));
          rows_of(grad_query, c).add_(r[0]);
        }
        keys_of(held.parts[2], c).add_(r[1]);
        keys_of(held.parts[3], c).add_(r[2]);
      }
      const bool moves_on = messages && plan.sends(held.index, step);
      if (moves_on) {  // the gradients follow their keys, in the same batch
        messages->send((me + 1) % n, held.parts[2]);
        messages->send((me + 1) % n, held.parts[3]);
      } else if (held_goes_home) {
        messages->send(held.index, held.parts[2]);
        messages->send(held.index, held.parts[3]);
      } else if (plan.present(held.index, step)) {
        parked[held.index] = {held.parts[2], held.parts[3]};
      }
      if (messages) finish_pass(messages.get(), &held, &next);
    }
    const std::vector<at::Tensor> grads = plan.ring ? return_gradients(plan, me, parked, gradient_like, std::move(mine)) : parked.at(me);
    if (!grad_query.defined()) grad_query = at::zeros(query.sizes(), query.options().dtype(acc));  // no row saw a key
    stack->push_back(grad_query.to(query.scalar_type()));
    stack->push_back(grads[0].to(key.scalar_type()));
    stack->push_back(grads[1].to(value.scalar_type()));
  };
}

}  // namespace shardtensor
