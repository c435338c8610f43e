// The CUDA SDPA operators on ShardTensors, checked without a GPU: _scaled_dot_product_flash_attention,
// _scaled_dot_product_efficient_attention and _scaled_dot_product_cudnn_attention (with their
// backwards) have no CPU kernels, so this file registers CPU stand-ins for them that compute with
// the CPU operator and take and return exactly what the CUDA ones do (their extra outputs, the
// efficient one's log-sum-exp padded to 32 rows, cuDNN's [B, H, Sq, 1] as torch's meta function
// gives it). The stand-ins refuse what the real operators would silently get wrong: a causal mask
// on a block whose query is longer than its keys (flash-attention aligns that diagonal
// bottom-right), a bias whose rows are not 16-aligned, a log-sum-exp without its padding, and
// per-block lengths that are not the block's. The oracle is one process running the CPU
// operator on the whole tensors (torch's top-left causal mask).
//
// What this cannot check is the CUDA operators themselves: tests/cuda/cuda_test.cpp
// (AttentionOnSequenceShardsMatchesOneDevice) runs the real ones where a GPU is visible. On
// libtorch 1.13 the operators do not exist and every test here skips.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>
#include <torch/version.h>

#include <numeric>

#include "dist/attention_checks.h"
#include "dist/dist_fixture.h"
#include "dist/sweep_case.h"

using namespace shardtensor;
using namespace shardtensor::testing;

#if TORCH_VERSION_MAJOR >= 2

namespace {

int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

void check_square_causal(const char* op, bool is_causal, const at::Tensor& q, const at::Tensor& k) {
  TORCH_CHECK(!is_causal || q.size(2) == k.size(2), op, " stand-in: is_causal on a block of ", q.size(2), " rows and ", k.size(2),
              " keys; flash-attention on CUDA aligns a diagonal that is not square bottom-right, not top-left");
}

void check_aligned_bias(const c10::optional<at::Tensor>& bias) {
  if (!bias || !bias->defined()) return;
  TORCH_CHECK(bias->dim() == 4 && bias->stride(2) % 16 == 0, "efficient stand-in: the bias must be 4-d with rows 16-aligned; got sizes ",
              bias->sizes(), " strides ", bias->strides());
}

// (query, key, value, dropout_p, is_causal, return_debug_mask, *, scale) -> (output, logsumexp,
// cum_seq_q, cum_seq_k, max_q, max_k, rng_state, unused, debug_attn_mask)
void flash_forward(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  const std::vector<c10::IValue> a = torch::jit::pop(*stack, 7);
  const at::Tensor q = a[0].toTensor(), k = a[1].toTensor(), v = a[2].toTensor();
  check_square_causal("flash", a[4].toBool(), q, k);
  auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, a[3].toDouble(), a[4].toBool(), {}, a[6].toOptional<double>());
  torch::jit::push(*stack, out, lse, at::Tensor(), at::Tensor(), q.size(2), k.size(2), at::full({2}, 7, at::kLong),
                   at::empty({0}, at::kLong), at::empty({0}, q.options()));
}

// (grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
// is_causal, philox_seed, philox_offset, *, scale) -> (grad_query, grad_key, grad_value)
void flash_backward(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  const std::vector<c10::IValue> a = torch::jit::pop(*stack, 15);
  const at::Tensor q = a[1].toTensor(), k = a[2].toTensor();
  check_square_causal("flash backward", a[11].toBool(), q, k);
  TORCH_CHECK(a[8].toInt() == q.size(2) && a[9].toInt() == k.size(2), "flash backward stand-in: max_q, max_k = ", a[8].toInt(), ", ",
              a[9].toInt(), " for a block of ", q.size(2), " rows and ", k.size(2), " keys");
  TORCH_CHECK(a[12].toTensor().numel() == 2, "flash backward stand-in: philox_seed is not the forward's rng_state");
  auto [gq, gk, gv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(a[0].toTensor(), q, k, a[3].toTensor(), a[4].toTensor(),
                                                                             a[5].toTensor(), a[10].toDouble(), a[11].toBool(), {},
                                                                             a[14].toOptional<double>());
  torch::jit::push(*stack, gq, gk, gv);
}

// (query, key, value, attn_bias, compute_log_sumexp, dropout_p, is_causal, *, scale) ->
// (output, log_sumexp, philox_seed, philox_offset)
void efficient_forward(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  const std::vector<c10::IValue> a = torch::jit::pop(*stack, 8);
  const at::Tensor q = a[0].toTensor(), k = a[1].toTensor(), v = a[2].toTensor();
  const c10::optional<at::Tensor> bias = a[3].toOptional<at::Tensor>();
  check_square_causal("efficient", a[6].toBool(), q, k);
  check_aligned_bias(bias);
  auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, a[5].toDouble(), a[6].toBool(), bias, a[7].toOptional<double>());
  at::Tensor padded = at::full({q.size(0), q.size(1), a[4].toBool() ? round_up(q.size(2), 32) : 0}, NAN, lse.options());
  if (a[4].toBool()) padded.narrow(2, 0, q.size(2)).copy_(lse);
  torch::jit::push(*stack, out, padded, at::zeros({}, at::kLong), at::zeros({}, at::kLong));
}

// (grad_out_, query, key, value, attn_bias, out, logsumexp, philox_seed, philox_offset,
// dropout_p, grad_input_mask, is_causal, *, scale) -> (grad_query, grad_key, grad_value, grad_bias)
void efficient_backward(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  const std::vector<c10::IValue> a = torch::jit::pop(*stack, 13);
  const at::Tensor q = a[1].toTensor(), k = a[2].toTensor(), lse = a[6].toTensor();
  const at::Tensor bias = a[4].toTensor();
  check_square_causal("efficient backward", a[11].toBool(), q, k);
  check_aligned_bias(bias);
  TORCH_CHECK(lse.size(2) == round_up(q.size(2), 32), "efficient backward stand-in: a log-sum-exp of ", lse.size(2), " rows for ",
              q.size(2), " query rows (the operator's own is padded to a multiple of 32)");
  TORCH_CHECK(!a[10].toBoolList().get(3), "efficient backward stand-in: a bias gradient was asked for");
  auto [gq, gk, gv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
      a[0].toTensor(), q, k, a[3].toTensor(), a[5].toTensor(), lse.narrow(2, 0, q.size(2)), a[9].toDouble(), a[11].toBool(),
      bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt, a[12].toOptional<double>());
  torch::jit::push(*stack, gq, gk, gv, at::Tensor());
}

// (query, key, value, attn_bias, compute_log_sumexp, dropout_p, is_causal, return_debug_mask, *,
// scale) -> (output, logsumexp [B, H, Sq, 1], cum_seq_q, cum_seq_k, max_q, max_k, philox_seed,
// philox_offset, debug_attn_mask)
void cudnn_forward(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  const std::vector<c10::IValue> a = torch::jit::pop(*stack, 9);
  const at::Tensor q = a[0].toTensor(), k = a[1].toTensor(), v = a[2].toTensor();
  const c10::optional<at::Tensor> bias = a[3].toOptional<at::Tensor>();
  check_square_causal("cudnn", a[6].toBool(), q, k);
  TORCH_CHECK(a[4].toBool(), "cudnn stand-in: the merge needs the log-sum-exp, but compute_log_sumexp was false");
  auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, a[5].toDouble(), a[6].toBool(), bias, a[8].toOptional<double>());
  torch::jit::push(*stack, out, lse.unsqueeze(-1), at::Tensor(), at::Tensor(), q.size(2), k.size(2), at::full({}, 11, at::kLong),
                   at::full({}, 13, at::kLong), at::Tensor());
}

// (grad_out, query, key, value, out, logsumexp, philox_seed, philox_offset, attn_bias, cum_seq_q,
// cum_seq_k, max_q, max_k, dropout_p, is_causal, *, scale) -> (grad_query, grad_key, grad_value)
void cudnn_backward(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  const std::vector<c10::IValue> a = torch::jit::pop(*stack, 16);
  const at::Tensor q = a[1].toTensor(), k = a[2].toTensor(), lse = a[5].toTensor(), bias = a[8].toTensor();
  check_square_causal("cudnn backward", a[14].toBool(), q, k);
  TORCH_CHECK(lse.dim() == 4 && lse.size(2) == q.size(2) && lse.size(3) == 1, "cudnn backward stand-in: a log-sum-exp of sizes ",
              lse.sizes(), " for ", q.size(2), " query rows (the operator's own is [B, H, Sq, 1])");
  TORCH_CHECK(a[11].toInt() == q.size(2) && a[12].toInt() == k.size(2), "cudnn backward stand-in: max_q, max_k = ", a[11].toInt(), ", ",
              a[12].toInt(), " for a block of ", q.size(2), " rows and ", k.size(2), " keys");
  TORCH_CHECK(a[6].toTensor().item<int64_t>() == 11 && a[7].toTensor().item<int64_t>() == 13,
              "cudnn backward stand-in: philox_seed and philox_offset are not the forward's");
  auto [gq, gk, gv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
      a[0].toTensor(), q, k, a[3].toTensor(), a[4].toTensor(), lse.squeeze(-1), a[13].toDouble(), a[14].toBool(),
      bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt, a[15].toOptional<double>());
  torch::jit::push(*stack, gq, gk, gv);
}

TORCH_LIBRARY_IMPL(aten, CPU, m) {
  m.impl("_scaled_dot_product_flash_attention", torch::CppFunction::makeFromBoxedFunction<&flash_forward>());
  m.impl("_scaled_dot_product_flash_attention_backward", torch::CppFunction::makeFromBoxedFunction<&flash_backward>());
  m.impl("_scaled_dot_product_efficient_attention", torch::CppFunction::makeFromBoxedFunction<&efficient_forward>());
  m.impl("_scaled_dot_product_efficient_attention_backward", torch::CppFunction::makeFromBoxedFunction<&efficient_backward>());
  m.impl("_scaled_dot_product_cudnn_attention", torch::CppFunction::makeFromBoxedFunction<&cudnn_forward>());
  m.impl("_scaled_dot_product_cudnn_attention_backward", torch::CppFunction::makeFromBoxedFunction<&cudnn_backward>());
}

// Uneven sequence sizes, one shard empty from two ranks on; the keys' split reversed and longer.
std::vector<int64_t> row_sizes(int64_t n) {
  std::vector<int64_t> sizes;
  for (int64_t r = 0; r < n; ++r) sizes.push_back(n > 1 && r == n / 2 ? 0 : 5 + 3 * r);
  return sizes;
}

enum class Cuda { Flash, Efficient, Cudnn };

struct OperatorCase {
  Cuda op = Cuda::Flash;
  bool is_causal = false, with_bias = false;
  int64_t batch = 2, heads = 4, kv_heads = 4, dim = 8;
  std::vector<int64_t> q_sizes, kv_sizes;
  Placements placements = {Shard(2)};  // of query, key and value
};

std::vector<c10::IValue> call(const char* name, torch::jit::Stack stack) {
  c10::Dispatcher::singleton().findSchemaOrThrow(name, "").callBoxed(&stack);
  return stack;
}

// The operator's (output, unpadded log-sum-exp) on q, k, v (and the bias).
std::pair<at::Tensor, at::Tensor> forward(const OperatorCase& c, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                          const at::Tensor& bias) {
  if (c.op == Cuda::Flash) {
    const auto r = call("aten::_scaled_dot_product_flash_attention", {q, k, v, 0.0, c.is_causal, false, c10::IValue()});
    EXPECT_EQ(r.size(), 9u);
    return {r[0].toTensor(), r[1].toTensor()};
  }
  const c10::IValue optional_bias = bias.defined() ? c10::IValue(bias) : c10::IValue();
  if (c.op == Cuda::Cudnn) {
    const auto r = call("aten::_scaled_dot_product_cudnn_attention", {q, k, v, optional_bias, true, 0.0, c.is_causal, false, c10::IValue()});
    EXPECT_EQ(r.size(), 9u);
    EXPECT_EQ(r[1].toTensor().dim(), 4) << "cuDNN's log-sum-exp is [B, H, Sq, 1]";
    return {r[0].toTensor(), r[1].toTensor().squeeze(-1)};
  }
  const auto r = call("aten::_scaled_dot_product_efficient_attention", {q, k, v, optional_bias, true, 0.0, c.is_causal, c10::IValue()});
  EXPECT_EQ(r.size(), 4u);
  return {r[0].toTensor(), r[1].toTensor()};
}

// `c` sharded through the CUDA operator's stand-in, against the CPU operator on one process:
// output, log-sum-exp and the three input gradients; no all-gather either way.
void run_and_compare(const OperatorCase& c, uint64_t seed) {
  const int64_t sq = std::accumulate(c.q_sizes.begin(), c.q_sizes.end(), int64_t{0});
  const int64_t sk = std::accumulate(c.kv_sizes.begin(), c.kv_sizes.end(), int64_t{0});
  const at::Tensor q = draw({c.batch, c.heads, sq, c.dim}, seed), k = draw({c.batch, c.kv_heads, sk, c.dim}, seed + 1),
                   v = draw({c.batch, c.kv_heads, sk, c.dim}, seed + 2), grad = draw({c.batch, c.heads, sq, c.dim}, seed + 3);
  // A bias as the composite passes it: [B, H, Sq, Sk], a view of rows padded to 16 elements.
  at::Tensor bias;
  if (c.with_bias) {
    bias = at::zeros({c.batch, c.heads, sq, round_up(sk, 16)}).narrow(3, 0, sk);
    bias.copy_(draw({c.batch, c.heads, sq, sk}, seed + 4));
  }
  const at::Tensor rq = q.clone().requires_grad_(), rk = k.clone().requires_grad_(), rv = v.clone().requires_grad_();
  auto [expected, expected_lse] = at::_scaled_dot_product_flash_attention_for_cpu(
      rq, rk, rv, 0.0, c.is_causal, bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt);
  (expected * grad).sum().backward();

  const bool seq = c.placements[0].is_shard(2);
  auto shard = [&](const at::Tensor& t, const std::vector<int64_t>& sizes) {
    return seq ? distribute_tensor(t, mesh_1d(), c.placements, ShardSizes{{2, sizes}}) : distribute_tensor(t, mesh_1d(), c.placements);
  };
  const at::Tensor sq_ = shard(q, c.q_sizes).requires_grad_(), sk_ = shard(k, c.kv_sizes).requires_grad_(),
                   sv_ = shard(v, c.kv_sizes).requires_grad_();
  const at::Tensor sbias = bias.defined() ? distribute_tensor(bias, mesh_1d(), {Replicate()}) : at::Tensor();
  at::Tensor out, lse;
  {
    CommDebugMode comms;
    std::tie(out, lse) = forward(c, sq_, sk_, sv_, sbias);
    EXPECT_EQ(comms.count("all_gather"), 0) << comms.table();
  }
  expect_close(out, expected.detach(), "output");
  expect_close(lse, expected_lse, "log-sum-exp");
  const at::Tensor loss = (out * distribute_tensor(grad, mesh_1d(), {Replicate()})).sum();
  {
    CommDebugMode comms;
    loss.backward();
    EXPECT_EQ(comms.count("all_gather"), 0) << comms.table();
  }
  expect_close(sq_.grad(), rq.grad(), "query gradient");
  expect_close(sk_.grad(), rk.grad(), "key gradient");
  expect_close(sv_.grad(), rv.grad(), "value gradient");
  if (seq) {
    EXPECT_EQ(spec(out).sharding_of(2)->sizes, c.q_sizes);
    EXPECT_EQ(spec(sk_.grad()).sharding_of(2)->sizes, c.kv_sizes);
  }
}

}  // namespace

// Ring attention through flash-attention's operator: uneven shards with one empty, keys split
// unlike the query (and, without the causal mask, longer or shorter), causal or not,
// grouped-query heads. (Causal with Sq != Sk falls back: rules_test, CudaFlashRefuses...)
TEST(AttentionOperators, CudaFlashRingMatchesOneProcess) {
  const int64_t n = mesh_1d().size(0);
  for (bool is_causal : {false, true})
    for (int64_t kv_heads : {4, 2}) {
      SCOPED_TRACE(std::string(is_causal ? "causal" : "full") + ", kv_heads " + std::to_string(kv_heads));
      OperatorCase c;
      c.is_causal = is_causal;
      c.kv_heads = kv_heads;
      c.q_sizes = row_sizes(n);
      c.kv_sizes = std::vector<int64_t>(c.q_sizes.rbegin(), c.q_sizes.rend());
      run_and_compare(c, 100);  // causal: blocks whose rows outnumber their keys under the diagonal
      if (is_causal) continue;
      c.kv_sizes.back() += 3;  // Sq != Sk
      run_and_compare(c, 110);
      c.kv_sizes.back() -= 6;  // fewer keys than rows
      run_and_compare(c, 120);
    }
}

// Ring attention through the efficient and the cuDNN operators, with and without a bias, causal
// or not, grouped-query heads. (cuDNN refuses a causal mask with Sq != Sk: it falls back.)
TEST(AttentionOperators, CudaEfficientAndCudnnRingsMatchOneProcess) {
  const int64_t n = mesh_1d().size(0);
  for (Cuda op : {Cuda::Efficient, Cuda::Cudnn})
    for (bool is_causal : {false, true})
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(std::string(op == Cuda::Cudnn ? "cudnn, " : "efficient, ") + (is_causal ? "causal" : "full") + (with_bias ? ", bias" : ""));
        OperatorCase c;
        c.op = op;
        c.is_causal = is_causal;
        c.with_bias = with_bias;
        c.kv_heads = op == Cuda::Cudnn ? 2 : 4;
        c.q_sizes = row_sizes(n);
        c.kv_sizes = std::vector<int64_t>(c.q_sizes.rbegin(), c.q_sizes.rend());
        if (op == Cuda::Efficient || !is_causal) c.kv_sizes.back() += 3;
        run_and_compare(c, 200);
      }
}

// Batch shards: local attention, each operator's whole block (the efficient one restores its
// log-sum-exp's padding for the backward).
TEST(AttentionOperators, BatchShardsAttendLocallyThroughEitherOperator) {
  for (Cuda op : {Cuda::Flash, Cuda::Efficient, Cuda::Cudnn}) {
    OperatorCase c;
    c.op = op;
    c.is_causal = true;
    c.batch = 5;
    c.q_sizes = {7};
    c.kv_sizes = {7};
    c.placements = {Shard(0)};
    run_and_compare(c, 300);
  }
}

// The operator sweep's cases for the CUDA operators, run through the stand-ins: every input laid
// out at random (op_sweep_test.cpp). A causal mask needs Sq == Sk here, since the stand-ins (like
// the real operators) refuse a causal mask that is not square, and the sweep's oracle calls them.
std::vector<Case> shardtensor::testing::attention_operator_cases() {
  std::vector<Case> cases;
  for (bool is_causal : {false, true})
    for (int64_t kv_heads : {4, 2}) {
      const int64_t sk = is_causal ? 6 : 5;
      cases.push_back(on(std::string("_scaled_dot_product_flash_attention (CUDA stand-in)") + (is_causal ? " causal" : "") + (kv_heads == 2 ? " gqa" : ""),
                         [kv_heads, sk] { return Tensors{normal({2, 4, 6, 4}), normal({2, kv_heads, sk, 4}), normal({2, kv_heads, sk, 4})}; },
                         [is_causal](const Tensors& x) { return call("aten::_scaled_dot_product_flash_attention", {x[0], x[1], x[2], 0.0, is_causal}); }));
    }
  for (bool is_causal : {false, true}) {
    const int64_t sk = is_causal ? 6 : 5;
    cases.push_back(on(std::string("_scaled_dot_product_efficient_attention (CUDA stand-in)") + (is_causal ? " causal" : ""),
                       [sk] { return Tensors{normal({2, 4, 6, 4}), normal({2, 4, sk, 4}), normal({2, 4, sk, 4})}; },
                       [is_causal](const Tensors& x) {
                         return call("aten::_scaled_dot_product_efficient_attention", {x[0], x[1], x[2], c10::IValue(), true, 0.0, is_causal});
                       }));
    cases.push_back(on(std::string("_scaled_dot_product_cudnn_attention (CUDA stand-in)") + (is_causal ? " causal" : ""),
                       [sk] { return Tensors{normal({2, 4, 6, 4}), normal({2, 2, sk, 4}), normal({2, 2, sk, 4})}; },
                       [is_causal](const Tensors& x) {
                         return call("aten::_scaled_dot_product_cudnn_attention", {x[0], x[1], x[2], c10::IValue(), true, 0.0, is_causal});
                       }));
  }
  return cases;
}

#else

std::vector<Case> shardtensor::testing::attention_operator_cases() { return {}; }

TEST(AttentionOperators, NeedTorch2) {
  GTEST_SKIP() << "the SDPA operators do not exist in libtorch " << TORCH_VERSION_MAJOR << "." << TORCH_VERSION_MINOR;
}

#endif
