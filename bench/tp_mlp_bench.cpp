// A tensor-parallel MLP step (Megatron layout: W1 split by output rows, W2 by input columns,
// one all-reduce of the output) on ShardTensors, next to the same step written by hand on
// local tensors with one raw all-reduce, in the same run. Step = forward, MSE loss,
// backward, SGD update. Run: shardrun -n 4 build/bench/tp_mlp_bench (results in
// bench/RESULTS.md). The two steps alternate; medians over 60 steps each after 5 warm-up
// (--steps N: N timed steps each; --json FILE: rank 0 also writes min / median / max per size
// to FILE, for bench/regenerate.py).
#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "bench_report.h"
#include "comm/comm.h"
#include "shardtensor/shardtensor.h"

using namespace shardtensor;

namespace {

int steps = 60;  // --steps N

// Runs the two steps alternately (so that machine noise hits both alike) and returns their
// times in ms.
std::pair<bench_report::Stats, bench_report::Stats> interleaved_times(const std::function<void()>& a, const std::function<void()>& b,
                                              const std::function<void()>& sync) {
  std::vector<double> ta, tb;
  auto time = [&](const std::function<void()>& step) {
    sync();
    const auto t0 = std::chrono::steady_clock::now();
    step();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  for (int i = 0; i < steps + 5; ++i) {
    const double x = time(a), y = time(b);
    if (i >= 5) {
      ta.push_back(x);
      tb.push_back(y);
    }
  }
  return {bench_report::stats_of(ta), bench_report::stats_of(tb)};
}

}  // namespace

int main(int argc, char** argv) {
  steps = bench_report::int_option(argc, argv, "--steps", steps);
  const std::string json_path = bench_report::option(argc, argv, "--json");
  const DeviceMesh mesh = DeviceMesh::create({world_size()});
  Comm& comm = mesh.comm(0);
  const auto sync = [&] { comm.barrier(); };
  const double lr = 1e-3;
  if (mesh.rank() == 0) std::printf("%-18s %10s %10s %8s\n", "batch x dim x hidden", "by hand ms", "sharded ms", "ratio");
  std::vector<bench_report::Object> results;
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
    const auto [hand, sharded_stats] = interleaved_times(by_hand, sharded, sync);
    const double hand_ms = hand.median, sharded_ms = sharded_stats.median;
    CommDebugMode comms;
    sharded();
    results.push_back(bench_report::Object()
                       .add("size", std::to_string(batch) + "x" + std::to_string(dim) + "x" + std::to_string(hidden))
                       .add("by_hand_ms", hand)
                       .add("sharded_ms", sharded_stats)
                       .add("collectives", comms.total()));
    if (mesh.rank() == 0)
      std::printf("%4lld x %4lld x %5lld %10.3f %10.3f %7.2fx   (%lld collectives per sharded step)\n", static_cast<long long>(batch),
                  static_cast<long long>(dim), static_cast<long long>(hidden), hand_ms, sharded_ms, sharded_ms / hand_ms,
                  static_cast<long long>(comms.total()));
  }
  if (mesh.rank() == 0)
    bench_report::write(json_path,
                        bench_report::Object().add("bench", "tp_mlp_bench").add("world", mesh.size(0)).add("steps", steps).add("sizes", results));
  return 0;
}
