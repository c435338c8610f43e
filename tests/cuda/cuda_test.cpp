// CUDA local tensors and NCCL groups. A "cuda" mesh keeps each rank's pieces on
// cuda:LOCAL_RANK, whatever the current device, and moves them with NCCL; every op family,
// redistribute and autograd must give the single-device (CPU) answer on them.
//
// Without a GPU (every CI machine), or with fewer GPUs than ranks (NCCL needs one GPU per
// rank), each GPU test skips and prints why ("cuda_tests: skipped: ..."); ./dev.sh test lists
// those lines after ctest. What a machine without a GPU can check, it checks: a "cuda" mesh
// raises on every rank, naming the fix, instead of hanging or running on the CPU.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/cuda.h>

#include <algorithm>
#include <iostream>

#include "dist/dist_fixture.h"

using namespace shardtensor;
using namespace shardtensor::testing;

namespace {

// Empty when this process can run the GPU tests; else the reason.
std::string why_no_gpu_test() {
  if (!torch::cuda::is_available()) return "no CUDA device is visible (torch::cuda::is_available() is false)";
  if (!built_with_nccl()) return "shardtensor was built without NCCL (libtorch is not a CUDA build)";
  const int64_t gpus = static_cast<int64_t>(torch::cuda::device_count());
  if (world_size() > gpus)
    return std::to_string(world_size()) + " ranks but " + std::to_string(gpus) + " GPU(s): NCCL needs one GPU per rank";
  return "";
}

#define SKIP_UNLESS_GPUS()                                                        \
  do {                                                                            \
    const std::string reason = why_no_gpu_test();                                 \
    if (!reason.empty()) {                                                        \
      if (world_rank() == 0) std::cout << "cuda_tests: skipped: " << reason << std::endl; \
      GTEST_SKIP() << reason;                                                     \
    }                                                                             \
  } while (0)

const DeviceMesh& cuda_mesh() {
  static const DeviceMesh mesh = DeviceMesh::create({world_size()}, {"x"}, MeshOptions{"cuda"});
  return mesh;
}

// Same values on every rank, built on the CPU: the oracle.
at::Tensor same_randn(std::vector<int64_t> shape) {
  static uint64_t draws = 0;
  at::manual_seed(500 + draws++);
  return at::randn(shape, at::kDouble);
}

// Uneven row sizes for `n` rows on this world (an empty shard on 4 ranks).
std::vector<int64_t> uneven(int64_t n) {
  if (world_size() == 4) return {n - 5, 0, 3, 2};
  if (world_size() == 3) return {1, n - 3, 2};
  if (world_size() == 2) return {n - 3, 3};
  return {n};
}

void expect_matches_cpu(const at::Tensor& sharded, const at::Tensor& reference, const std::string& what) {
  const at::Tensor whole = full_tensor(sharded);
  ASSERT_TRUE(whole.is_cuda()) << what;
  EXPECT_TRUE(at::allclose(whole.cpu(), reference, 1e-9, 1e-9)) << what;
}

}  // namespace

TEST(CudaMesh, WithoutAGpuACudaMeshRaisesOnEveryRankNamingTheFix) {
  if (torch::cuda::is_available()) {
    if (world_rank() == 0) std::cout << "cuda_tests: skipped: a GPU is visible, so a cuda mesh is valid here" << std::endl;
    GTEST_SKIP() << "a GPU is visible";
  }
  EXPECT_ERROR_CONTAINS(DeviceMesh::create({world_size()}, {}, MeshOptions{"cuda"}), "sees no CUDA device",
                        "use device_type \"cpu\"");
}

TEST(CudaMesh, LocalPiecesLiveOnTheLocalRankDeviceNotTheCurrentOne) {
  SKIP_UNLESS_GPUS();
  const int64_t gpus = static_cast<int64_t>(torch::cuda::device_count());
  const c10::Device expected(c10::kCUDA, static_cast<c10::DeviceIndex>(std::atoi(std::getenv("LOCAL_RANK") ? std::getenv("LOCAL_RANK") : "0") % gpus));
  EXPECT_EQ(cuda_mesh().device(), expected);
  const at::Tensor global = same_randn({10, 4});
  const at::Tensor t = distribute_tensor(global.to(expected), cuda_mesh(), {Shard(0)}, ShardSizes{{0, uneven(10)}});
  EXPECT_EQ(to_local(t).device(), expected);
  EXPECT_EQ(t.device(), expected);
  expect_matches_cpu(t, global, "distribute_tensor");
  EXPECT_ERROR_CONTAINS(from_local(at::zeros({2, 4}, at::kDouble), cuda_mesh(), {Shard(0)}), "from_local", "live on");
}

TEST(CudaMesh, RedistributeBetweenLayoutsMatchesOneDevice) {
  SKIP_UNLESS_GPUS();
  const c10::Device device = cuda_mesh().device();
  const at::Tensor global = same_randn({10, 6});
  const at::Tensor rows = distribute_tensor(global.to(device), cuda_mesh(), {Shard(0)}, ShardSizes{{0, uneven(10)}});
  expect_matches_cpu(redistribute(rows, {Shard(1)}), global, "S(0) -> S(1)");
  expect_matches_cpu(redistribute(rows, {Replicate()}), global, "S(0) -> R");
  expect_matches_cpu(redistribute(rows, {Shard(0)}, ShardSizes{{0, chunk_sizes(10, world_size())}}), global, "rebalance");
  const at::Tensor partial = from_local(global.to(device) / static_cast<double>(world_size()), cuda_mesh(), {Partial()});
  expect_matches_cpu(redistribute(partial, {Replicate()}), global, "P(sum) -> R");
  expect_matches_cpu(redistribute(partial, {Shard(0)}), global, "P(sum) -> S(0)");
}

TEST(CudaMesh, EveryOpFamilyMatchesOneDeviceValuesAndGradients) {
  SKIP_UNLESS_GPUS();
  const c10::Device device = cuda_mesh().device();
  const at::Tensor x_ref = same_randn({10, 8}).requires_grad_(true);
  const at::Tensor w_ref = same_randn({8, 5}).requires_grad_(true);
  const at::Tensor field_ref = same_randn({2, 3, 12, 9}).requires_grad_(true);
  const at::Tensor kernel_ref = same_randn({4, 3, 3, 3}).requires_grad_(true);

  auto program = [](const at::Tensor& x, const at::Tensor& w, const at::Tensor& field, const at::Tensor& kernel) {
    at::Tensor h = at::relu(at::mm(x, w)) + 0.5 * at::mm(x, w);                       // matmul, pointwise
    h = at::softmax(h, 1) + at::layer_norm(h, {5});                                    // softmax, layer norm
    at::Tensor v = h.view({10, 5, 1}).transpose(0, 1).sum(2);                          // views, reduction
    at::Tensor c = at::conv2d(field, kernel, {}, 1, 1);                                // halo convolution
    c = at::max_pool2d(c, {2, 2}) + at::upsample_nearest2d(at::avg_pool2d(c, {2, 2}), {}, std::vector<double>{1.0, 1.0});
    return std::make_pair(v.sum() + v.amax(), c.pow(2).mean());                        // amax, mean
  };

  auto [v_ref, c_ref] = program(x_ref, w_ref, field_ref, kernel_ref);
  (v_ref + c_ref).backward();

  const at::Tensor x = distribute_tensor(x_ref.detach().to(device), cuda_mesh(), {Shard(0)}, ShardSizes{{0, uneven(10)}}).requires_grad_(true);
  const at::Tensor w = distribute_tensor(w_ref.detach().to(device), cuda_mesh(), {Replicate()}).requires_grad_(true);
  const at::Tensor field = distribute_tensor(field_ref.detach().to(device), cuda_mesh(), {Shard(2)}).requires_grad_(true);
  const at::Tensor kernel = distribute_tensor(kernel_ref.detach().to(device), cuda_mesh(), {Replicate()}).requires_grad_(true);
  auto [v, c] = program(x, w, field, kernel);
  (v + c).backward();

  expect_matches_cpu(v, v_ref.detach(), "matmul/pointwise/softmax/layer norm/views/reductions");
  expect_matches_cpu(c, c_ref.detach(), "convolution/pooling/upsampling");
  expect_matches_cpu(x.grad(), x_ref.grad(), "gradient of x");
  expect_matches_cpu(w.grad(), w_ref.grad(), "gradient of w");
  expect_matches_cpu(field.grad(), field_ref.grad(), "gradient of the field");
  expect_matches_cpu(kernel.grad(), kernel_ref.grad(), "gradient of the kernel");
}

namespace {

std::vector<c10::IValue> call_by_name(const char* name, torch::jit::Stack stack) {
  c10::Dispatcher::singleton().findSchemaOrThrow(name, "").callBoxed(&stack);
  return stack;
}

void expect_near_cpu(const at::Tensor& sharded, const at::Tensor& reference, double tolerance, const std::string& what) {
  const at::Tensor whole = full_tensor(sharded);
  ASSERT_TRUE(whole.is_cuda()) << what;
  const double difference = (whole.cpu().to(at::kDouble) - reference).abs().max().item<double>();
  EXPECT_LE(difference, tolerance) << what;
}

}  // namespace

// Scaled dot-product attention on sequence shards (uneven, one empty from 4 ranks; keys longer
// than the query for the memory-efficient operator, as long for flash, whose causal mask is
// bottom-right otherwise) through the CUDA operators themselves: flash-attention for bfloat16,
// the memory-efficient one for float32, each called by name, then
// F.scaled_dot_product_attention whatever it picks. Values and the three gradients against the CPU operator in double on one
// process, from the same rounded inputs; no all-gather. tests/dist/attention_operators_test.cpp
// checks the same kernels on CPU through stand-ins; this is the check of the real operators.
TEST(CudaMesh, AttentionOnSequenceShardsMatchesOneDevice) {
  SKIP_UNLESS_GPUS();
  if (!c10::Dispatcher::singleton().findSchema({"aten::_scaled_dot_product_flash_attention", ""}))
    GTEST_SKIP() << "no SDPA operators in this libtorch (they come with torch 2.0)";
  const c10::Device device = cuda_mesh().device();
  const std::vector<int64_t> q_sizes = uneven(21);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16})
    for (bool is_causal : {false, true}) {
      const int64_t keys_length = dtype == at::kFloat ? 24 : 21;
      std::vector<int64_t> kv_sizes = uneven(keys_length);
      std::reverse(kv_sizes.begin(), kv_sizes.end());  // split unlike the query
      SCOPED_TRACE(std::string(dtype == at::kFloat ? "float32, efficient" : "bfloat16, flash") + (is_causal ? ", causal" : ""));
      const double tolerance = dtype == at::kFloat ? 1e-4 : 3e-2;
      auto rounded = [&](std::vector<int64_t> shape) { return same_randn(shape).to(dtype).to(at::kDouble); };
      const at::Tensor q = rounded({2, 4, 21, 64}), k = rounded({2, 4, keys_length, 64}), v = rounded({2, 4, keys_length, 64}), grad = rounded({2, 4, 21, 64});
      const at::Tensor rq = q.clone().requires_grad_(), rk = k.clone().requires_grad_(), rv = v.clone().requires_grad_();
      const auto expected = call_by_name("aten::_scaled_dot_product_flash_attention_for_cpu", {rq, rk, rv, 0.0, is_causal, c10::IValue(), c10::IValue()});
      (expected[0].toTensor() * grad).sum().backward();

      auto shard = [&](const at::Tensor& t, const std::vector<int64_t>& sizes) {
        return distribute_tensor(t.to(device, dtype), cuda_mesh(), {Shard(2)}, ShardSizes{{2, sizes}}).requires_grad_();
      };
      const at::Tensor sq = shard(q, q_sizes), sk = shard(k, kv_sizes), sv = shard(v, kv_sizes);
      const at::Tensor sgrad = distribute_tensor(grad.to(device, dtype), cuda_mesh(), {Replicate()});
      CommDebugMode comms;
      const std::vector<c10::IValue> r =
          dtype == at::kFloat
              ? call_by_name("aten::_scaled_dot_product_efficient_attention", {sq, sk, sv, c10::IValue(), true, 0.0, is_causal, c10::IValue()})
              : call_by_name("aten::_scaled_dot_product_flash_attention", {sq, sk, sv, 0.0, is_causal, false, c10::IValue()});
      (r[0].toTensor() * sgrad).sum().backward();
      expect_near_cpu(r[0].toTensor(), expected[0].toTensor().detach(), tolerance, "output");
      expect_near_cpu(r[1].toTensor(), expected[1].toTensor(), dtype == at::kFloat ? 1e-4 : 1e-2, "log-sum-exp");
      expect_near_cpu(sq.grad(), rq.grad(), tolerance, "query gradient");
      expect_near_cpu(sk.grad(), rk.grad(), tolerance, "key gradient");
      expect_near_cpu(sv.grad(), rv.grad(), tolerance, "value gradient");

      const auto composite = call_by_name("aten::scaled_dot_product_attention",
                                          {sq, sk, sv, c10::IValue(), 0.0, is_causal, c10::IValue(), false});
      expect_near_cpu(composite[0].toTensor(), expected[0].toTensor().detach(), tolerance, "F.scaled_dot_product_attention");
      EXPECT_EQ(comms.count("all_gather"), 0) << comms.table();
    }
}

// cuDNN's operator (what F.scaled_dot_product_attention picked for float32 on an H100)
// on sequence shards: the ring through the real cuDNN kernels, against the CPU operator in
// double. It skips where this cuDNN refuses the shapes on one device already.
TEST(CudaMesh, CudnnAttentionOnSequenceShardsMatchesOneDevice) {
  SKIP_UNLESS_GPUS();
  if (!c10::Dispatcher::singleton().findSchema({"aten::_scaled_dot_product_cudnn_attention", ""}))
    GTEST_SKIP() << "no cuDNN SDPA operator in this libtorch";
  const c10::Device device = cuda_mesh().device();
  const at::ScalarType dtype = at::kBFloat16;
  auto rounded = [&](std::vector<int64_t> shape) { return same_randn(shape).to(dtype).to(at::kDouble); };
  const at::Tensor q = rounded({2, 4, 21, 64}), k = rounded({2, 4, 21, 64}), v = rounded({2, 4, 21, 64}), grad = rounded({2, 4, 21, 64});
  try {
    call_by_name("aten::_scaled_dot_product_cudnn_attention",
                 {q.to(device, dtype), k.to(device, dtype), v.to(device, dtype), c10::IValue(), true, 0.0, true, false, c10::IValue()});
  } catch (const c10::Error& e) {
    GTEST_SKIP() << "cuDNN attention does not run these shapes on this machine: " << e.what_without_backtrace();
  }
  std::vector<int64_t> kv_sizes = uneven(21);
  std::reverse(kv_sizes.begin(), kv_sizes.end());
  for (bool is_causal : {false, true}) {
    SCOPED_TRACE(is_causal ? "causal" : "full");
    const at::Tensor rq = q.clone().requires_grad_(), rk = k.clone().requires_grad_(), rv = v.clone().requires_grad_();
    const auto expected = call_by_name("aten::_scaled_dot_product_flash_attention_for_cpu", {rq, rk, rv, 0.0, is_causal, c10::IValue(), c10::IValue()});
    (expected[0].toTensor() * grad).sum().backward();
    auto shard = [&](const at::Tensor& t, const std::vector<int64_t>& sizes) {
      return distribute_tensor(t.to(device, dtype), cuda_mesh(), {Shard(2)}, ShardSizes{{2, sizes}}).requires_grad_();
    };
    const at::Tensor sq = shard(q, uneven(21)), sk = shard(k, kv_sizes), sv = shard(v, kv_sizes);
    CommDebugMode comms;
    const auto r = call_by_name("aten::_scaled_dot_product_cudnn_attention", {sq, sk, sv, c10::IValue(), true, 0.0, is_causal, false, c10::IValue()});
    (r[0].toTensor() * distribute_tensor(grad.to(device, dtype), cuda_mesh(), {Replicate()})).sum().backward();
    expect_near_cpu(r[0].toTensor(), expected[0].toTensor().detach(), 3e-2, "output");
    expect_near_cpu(r[1].toTensor().squeeze(-1), expected[1].toTensor(), 1e-2, "log-sum-exp");
    expect_near_cpu(sq.grad(), rq.grad(), 3e-2, "query gradient");
    expect_near_cpu(sk.grad(), rk.grad(), 3e-2, "key gradient");
    expect_near_cpu(sv.grad(), rv.grad(), 3e-2, "value gradient");
    EXPECT_EQ(comms.count("all_gather"), 0) << comms.table();
  }
}
