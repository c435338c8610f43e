// conv2d forward + backward with the field split over H across the ranks (uneven shards),
// next to the same convolution on one process, and the bytes each rank sent per step next
// to the halo it needs. Run: shardrun -n 4 build/bench/halo_conv_bench (results in
// bench/RESULTS.md). Medians over 15 steps after 3 warm-up steps (--steps N: N timed steps;
// --json FILE: rank 0 also writes min / median / max to FILE, for bench/regenerate.py).
#include <ATen/ATen.h>

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

int steps = 15;  // --steps N

bench_report::Stats time_ms(const std::function<void()>& step, const std::function<void()>& sync) {
  std::vector<double> ms;
  for (int i = 0; i < steps + 3; ++i) {
    sync();
    const auto t0 = std::chrono::steady_clock::now();
    step();
    sync();
    if (i >= 3) ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return bench_report::stats_of(ms);
}

}  // namespace

int main(int argc, char** argv) {
  steps = bench_report::int_option(argc, argv, "--steps", steps);
  const std::string json_path = bench_report::option(argc, argv, "--json");
  const DeviceMesh mesh = DeviceMesh::create({world_size()});
  const int64_t ranks = mesh.size(0), rank = mesh.coordinate()[0];
  const int64_t n = 2, c = 16, h = 512, w = 384, k = 3;
  std::vector<int64_t> sizes;  // alternately 10% above and below an even share
  for (int64_t r = 0, used = 0; r < ranks; ++r) {
    sizes.push_back(r + 1 < ranks ? (h / ranks) * (r % 2 ? 9 : 11) / 10 : h - used);
    used += sizes.back();
  }
  at::manual_seed(0);
  const at::Tensor x = at::randn({n, c, h, w}), weight = at::randn({c, c, k, k}) * 0.1, grad = at::randn({n, c, h, w});
  const auto barrier = [&] { mesh.comm(0).barrier(); };

  bench_report::Stats single;
  if (rank == 0) {  // the other ranks wait in the barrier below
    const at::Tensor px = x.clone().requires_grad_(), pw = weight.clone().requires_grad_();
    single = time_ms([&] { at::conv2d(px, pw, {}, 1, 1).backward(grad); }, [] {});
  }
  barrier();

  const at::Tensor sx = distribute_tensor(x, mesh, {Shard(2)}, ShardSizes{{2, sizes}}).requires_grad_();
  const at::Tensor sw = distribute_tensor(weight, mesh, {Replicate()}).requires_grad_();
  const at::Tensor sg = distribute_tensor(grad, mesh, {Shard(2)}, ShardSizes{{2, sizes}});
  const auto step = [&] { at::conv2d(sx, sw, {}, 1, 1).backward(sg); };
  const bench_report::Stats sharded = time_ms(step, barrier);
  const double single_ms = single.median, sharded_ms = sharded.median;
  CommDebugMode comms;
  step();
  const int64_t halo_rows = (rank > 0) + (rank < ranks - 1);  // one row to each neighbour
  // The forward's gather and the backward's scatter-add of the input gradient's halo rows (the
  // backward rebuilds the window from the rows the forward received).
  const int64_t halo_bytes = 2 * halo_rows * n * c * w * 4;
  if (rank == 0) {
    std::printf("conv2d %lldx%lldx%lldx%lld, kernel %lld, fwd+bwd, H split %lld ways (rows", static_cast<long long>(n),
                static_cast<long long>(c), static_cast<long long>(h), static_cast<long long>(w), static_cast<long long>(k),
                static_cast<long long>(ranks));
    for (int64_t s : sizes) std::printf(" %lld", static_cast<long long>(s));
    std::printf(")\n  one process: %.1f ms   sharded: %.1f ms   speed-up %.2fx\n", single_ms, sharded_ms, single_ms / sharded_ms);
    std::printf("  rank 0 sent %lld bytes per step in %lld collectives (%s); its halo is %lld bytes\n",
                static_cast<long long>(comms.bytes()), static_cast<long long>(comms.total()),
                comms.count("all_gather") ? "includes all-gathers!" : "all-to-all only", static_cast<long long>(halo_bytes));
    bench_report::write(json_path, bench_report::Object()
                                       .add("bench", "halo_conv_bench")
                                       .add("world", ranks)
                                       .add("steps", steps)
                                       .add("shape", std::to_string(n) + "x" + std::to_string(c) + "x" + std::to_string(h) + "x" +
                                                         std::to_string(w))
                                       .add("kernel", k)
                                       .add("rows_per_rank", sizes)
                                       .add("one_process_ms", single)
                                       .add("sharded_ms", sharded)
                                       .add("bytes_sent", static_cast<long long>(comms.bytes()))
                                       .add("collectives", static_cast<long long>(comms.total()))
                                       .add("all_gathers", static_cast<long long>(comms.count("all_gather")))
                                       .add("halo_bytes", halo_bytes));
  }
  return comms.bytes() == halo_bytes ? 0 : 1;
}
