// A tensor-parallel MLP step (Megatron layout: W1 split by output rows, W2 by input columns,
// one all-reduce of the output) on ShardTensors, next to the same step written by hand on
// local tensors with one raw all-reduce, in the same run. Step = forward, MSE loss,
// backward, SGD update. Run: shardrun -n 4 build/bench/tp_mlp_bench (results in
// bench/RESULTS.md). The two steps alternate; medians over 60 steps each after 5 warm-up.
#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "comm/comm.h"
#include "shardtensor/shardtensor.h"

using namespace shardtensor;

namespace {

// Runs the two steps alternately (so that machine noise hits both alike) and returns their
// median times in ms.
std::pair<double, double> interleaved_medians(const std::function<void()>& a, const std::function<void()>& b,
                                              const std::function<void()>& sync) {
  std::vector<double> ta, tb;
  auto time = [&](const std::function<void()>& step) {
    sync();
    const auto t0 = std::chrono::steady_clock::now();
    step();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  for (int i = 0; i < 65; ++i) {
    const double x = time(a), y = time(b);
    if (i >= 5) {
      ta.push_back(x);
      tb.push_back(y);
    }
  }
  for (auto* v : {&ta, &tb}) std::nth_element(v->begin(), v->begin() + v->size() / 2, v->end());
  return {ta[ta.size() / 2], tb[tb.size() / 2]};
}

}  // namespace

int main() {
  const DeviceMesh mesh = DeviceMesh::create({world_size()});
  Comm& comm = mesh.comm(0);
  const auto sync = [&] { comm.barrier(); };
  const double lr = 1e-3;
  if (mesh.rank() == 0) std::printf("%-18s %10s %10s %8s\n", "batch x dim x hidden", "by hand ms", "sharded ms", "ratio");
  for (const auto& [batch, dim, hidden] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{32, 256, 1024}, {64, 512, 2048}}) {
    at::manual_seed(0);
    const at::Tensor x = at::randn({batch, dim}), target = at::randn({batch, dim});
    const at::Tensor w1 = at::randn({hidden, dim}) * 0.02, w2 = at::randn({dim, hidden}) * 0.02;

    // By hand: this rank's rows of W1 and columns of W2, one all-reduce of the output.
    const ShardTensorSpec split(mesh, {Shard(0)}, {hidden, dim}, at::kFloat);  // where this rank's rows are
    const int64_t rows = split.local_offsets()[0], mine = split.local_shape()[0];
    at::Tensor l1 = w1.narrow(0, rows, mine).clone().requires_grad_(), l2 = w2.narrow(1, rows, mine).clone().requires_grad_();
    const auto by_hand = [&] {
      const at::Tensor partial = at::linear(at::relu(at::linear(x, l1)), l2);
      at::Tensor y = partial.detach().clone();
      comm.all_reduce(y, ReduceOp::Sum);
      y.requires_grad_();
      at::mse_loss(y, target).backward();
      partial.backward(y.grad());
      at::NoGradGuard no_grad;
      for (at::Tensor* p : {&l1, &l2}) {
        p->sub_(p->grad() * lr);
        p->mutable_grad().zero_();
      }
    };

    at::Tensor s1 = distribute_tensor(w1, mesh, {Shard(0)}).requires_grad_();
    at::Tensor s2 = distribute_tensor(w2, mesh, {Shard(1)}).requires_grad_();
    const at::Tensor sx = distribute_tensor(x, mesh, {Replicate()}), st = distribute_tensor(target, mesh, {Replicate()});
    const auto sharded = [&] {
      at::mse_loss(at::linear(at::relu(at::linear(sx, s1)), s2), st).backward();
      at::NoGradGuard no_grad;
      for (at::Tensor* p : {&s1, &s2}) {
        p->sub_(p->grad() * lr);
        p->mutable_grad().zero_();
      }
    };
    const auto [hand_ms, sharded_ms] = interleaved_medians(by_hand, sharded, sync);
    CommDebugMode comms;
    sharded();
    if (mesh.rank() == 0)
      std::printf("%4lld x %4lld x %5lld %10.3f %10.3f %7.2fx   (%lld collectives per sharded step)\n", static_cast<long long>(batch),
                  static_cast<long long>(dim), static_cast<long long>(hidden), hand_ms, sharded_ms, sharded_ms / hand_ms,
                  static_cast<long long>(comms.total()));
  }
  return 0;
}
