// What each SDPA operator takes and returns (AttentionOperator in rules/attention.h), so that
// the forward and backward kernels (attention.cpp, attention_backward.cpp) call any of them
// on a block alike. Arguments are read by their schema names, not positions.
//
// The CUDA operators are reached here only on a CUDA build with sequence-sharded inputs; the
// tests check this file on CPU through stand-ins registered for them (tests/dist/
// attention_operators_test.cpp), which refuse what the real ones would get wrong: a causal
// mask on a block that is not square, a log-sum-exp without its padding.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "kernels/attention_blocks.h"

namespace shardtensor {
namespace {

// The efficient operator's log-sum-exp has a multiple of this many rows.
constexpr int64_t kEfficientLseRows = 32;
// ... and reads its bias with rows this many elements apart (or a multiple of it).
constexpr int64_t kEfficientBiasAlignment = 16;

int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

torch::jit::Stack call(const c10::OperatorHandle& op, torch::jit::Stack stack) {
  op.callBoxed(&stack);
  return stack;
}

// The efficient operator's bias for one block: the block's mask, [B, H, rows, keys], in a buffer
// whose rows are aligned as the operator requires (a narrowed view of the caller's mask is not).
at::Tensor efficient_bias(const at::Tensor& mask, const at::Tensor& query, const at::Tensor& key) {
  if (!mask.defined()) return mask;
  const int64_t rows = query.size(2), keys = key.size(2);
  at::Tensor bias = at::empty({query.size(0), query.size(1), rows, round_up(keys, kEfficientBiasAlignment)}, query.options());
  bias = bias.narrow(3, 0, keys);
  bias.copy_(mask.expand({query.size(0), query.size(1), rows, keys}));
  return bias;
}

// The efficient operator's log-sum-exp layout: `lse` [B, H, rows] padded to its row multiple.
at::Tensor padded_lse(const at::Tensor& lse) {
  const int64_t rows = lse.size(2);
  at::Tensor padded = at::zeros({lse.size(0), lse.size(1), round_up(rows, kEfficientLseRows)}, lse.options());
  padded.narrow(2, 0, rows).copy_(lse);
  return padded;
}

}  // namespace

c10::optional<at::Tensor> caller_mask(const OpArguments& args) {
  for (const char* name : {"attn_mask", "attn_bias"}) {  // one operator has either, or neither
    if (args.has(name) && args.value(name).isTensor() && args.tensor(name).defined()) return args.tensor(name);
  }
  return c10::nullopt;
}

BlockForward forward_block(const AttentionPlan& plan, const c10::OperatorHandle& op, const OpArguments& args,
                           const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const BlockCall& c) {
  const c10::IValue& dropout = args.value("dropout_p");
  const c10::IValue& scale = args.value("scale");
  torch::jit::Stack returns;
  switch (plan.op) {
    case AttentionOperator::CpuFlash:
      // (query, key, value, dropout_p, is_causal, *, attn_mask, scale) -> (output, logsumexp)
      returns = call(op, {query, key, value, dropout, c.is_causal, optional_tensor(c.mask), scale});
      break;
    case AttentionOperator::CudaFlash:
      // (query, key, value, dropout_p, is_causal, return_debug_mask, *, scale) -> (output,
      // logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, rng_state, unused, debug_attn_mask)
      TORCH_INTERNAL_ASSERT(!c.mask.defined(), "flash attention takes no mask; the kernel made one");
      returns = call(op, {query, key, value, dropout, c.is_causal, false, scale});
      break;
    case AttentionOperator::CudaEfficient:
      // (query, key, value, attn_bias, compute_log_sumexp, dropout_p, is_causal, *, scale) ->
      // (output, log_sumexp, philox_seed, philox_offset); the merge needs the log-sum-exp always
      returns = call(op, {query, key, value, optional_tensor(efficient_bias(c.mask, query, key)), true, dropout, c.is_causal, scale});
      break;
    case AttentionOperator::CudaCudnn:
      // (query, key, value, attn_bias, compute_log_sumexp, dropout_p, is_causal, return_debug_mask,
      // *, scale) -> (output, logsumexp [B, H, rows, 1], cum_seq_q, cum_seq_k, max_q, max_k,
      // philox_seed, philox_offset, debug_attn_mask). The bias as the efficient one's (dense,
      // rows aligned): the form the composite hands cuDNN.
      returns = call(op, {query, key, value, optional_tensor(efficient_bias(c.mask, query, key)), true, dropout, c.is_causal, false, scale});
      break;
  }
  BlockForward block;
  block.out = returns[0].toTensor();
  block.lse = returns[1].toTensor().narrow(2, 0, query.size(2));
  if (plan.op == AttentionOperator::CudaCudnn) block.lse = block.lse.squeeze(-1);  // the kernels merge [B, H, rows]
  block.others.assign(returns.begin() + 2, returns.end());  // not the output block: the merge has it
  return block;
}

std::vector<at::Tensor> backward_block(const AttentionPlan& plan, const c10::OperatorHandle& op, const OpArguments& args,
                                       const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key,
                                       const at::Tensor& value, const at::Tensor& out, const at::Tensor& lse, const BlockCall& c) {
  const c10::IValue& dropout = args.value("dropout_p");
  const c10::IValue& scale = args.value("scale");
  torch::jit::Stack returns;
  switch (plan.op) {
    case AttentionOperator::CpuFlash:
      // (grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask, scale)
      returns = call(op, {grad_out, query, key, value, out, lse, dropout, c.is_causal, optional_tensor(c.mask), scale});
      break;
    case AttentionOperator::CudaFlash:
      // (grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
      // dropout_p, is_causal, philox_seed, philox_offset, *, scale): the block's own lengths
      TORCH_INTERNAL_ASSERT(!c.mask.defined(), "flash attention takes no mask; the kernel made one");
      returns = call(op, {grad_out, query, key, value, out, lse, args.value("cum_seq_q"), args.value("cum_seq_k"),
                          query.size(2), key.size(2), dropout, c.is_causal, args.value("philox_seed"),
                          args.value("philox_offset"), scale});
      break;
    case AttentionOperator::CudaEfficient: {
      // (grad_out_, query, key, value, attn_bias, out, logsumexp, philox_seed, philox_offset,
      // dropout_p, grad_input_mask, is_causal, *, scale) -> (grad_query, grad_key, grad_value, grad_bias)
      c10::List<bool> wanted({true, true, true, false});
      returns = call(op, {grad_out, query, key, value, efficient_bias(c.mask, query, key), out, padded_lse(lse),
                          args.value("philox_seed"), args.value("philox_offset"), dropout, wanted, c.is_causal, scale});
      break;
    }
    case AttentionOperator::CudaCudnn:
      // (grad_out, query, key, value, out, logsumexp, philox_seed, philox_offset, attn_bias,
      // cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, *, scale): `lse` is the
      // operator's own [B, H, rows, 1], narrowed to the block's rows; the block's own lengths
      returns = call(op, {grad_out, query, key, value, out, lse.contiguous(), args.value("philox_seed"),
                          args.value("philox_offset"), efficient_bias(c.mask, query, key), args.value("cum_seq_q"),
                          args.value("cum_seq_k"), query.size(2), key.size(2), dropout, c.is_causal, scale});
      break;
  }
  return {returns[0].toTensor(), returns[1].toTensor(), returns[2].toTensor()};
}

void push_forward_results(const AttentionPlan& plan, torch::jit::Stack* stack, const at::Tensor& out, const at::Tensor& lse,
                          const std::vector<c10::IValue>& first, const at::Tensor& query, const at::Tensor& key) {
  stack->push_back(out.to(query.scalar_type()));
  const at::Tensor typed_lse = lse.to(lse_type(query.scalar_type()));
  stack->push_back(plan.op == AttentionOperator::CudaCudnn ? typed_lse.unsqueeze(-1) : typed_lse);
  const at::TensorOptions index = query.options().dtype(at::kLong);
  auto first_or = [&](size_t i, const at::Tensor& stand_in) { return first.empty() ? c10::IValue(stand_in) : first[i]; };
  switch (plan.op) {
    case AttentionOperator::CpuFlash:
      break;
    case AttentionOperator::CudaFlash:  // the same seven after these two: flash's and cuDNN's
    case AttentionOperator::CudaCudnn:
      stack->push_back(first_or(0, at::Tensor()));  // cum_seq_q, cum_seq_k: undefined unless nested
      stack->push_back(first_or(1, at::Tensor()));
      stack->push_back(query.size(2));  // max_q, max_k: this rank's lengths (the backward uses each block's)
      stack->push_back(key.size(2));
      // flash: rng_state, unused; cuDNN: philox_seed, philox_offset. Then debug_attn_mask.
      stack->push_back(first_or(4, at::empty({0}, index)));
      stack->push_back(first_or(5, at::empty({0}, index)));
      stack->push_back(first_or(6, plan.op == AttentionOperator::CudaFlash ? at::empty({0}, query.options()) : at::Tensor()));
      break;
    case AttentionOperator::CudaEfficient:
      stack->push_back(first_or(0, at::empty({0}, index)));  // philox_seed, philox_offset
      stack->push_back(first_or(1, at::empty({0}, index)));
      break;
  }
}

void push_backward_results(const AttentionPlan& plan, torch::jit::Stack* stack, const at::Tensor& grad_query,
                           const at::Tensor& grad_key, const at::Tensor& grad_value, const at::Tensor& query, const at::Tensor& key,
                           const at::Tensor& value) {
  stack->push_back(grad_query.to(query.scalar_type()));
  stack->push_back(grad_key.to(key.scalar_type()));
  stack->push_back(grad_value.to(value.scalar_type()));
  if (plan.op == AttentionOperator::CudaEfficient) stack->push_back(at::Tensor());  // grad_bias: not asked for (the rule refuses it)
}

}  // namespace shardtensor
