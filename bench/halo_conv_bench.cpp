// conv2d forward + backward with the field split over H across the ranks (uneven shards),
// next to the same convolution on one process, and the bytes each rank sent per step next
// to the halo it needs. Run: shardrun -n 4 build/bench/halo_conv_bench (results in
// bench/RESULTS.md). Medians over 15 steps after 3 warm-up steps.
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "comm/comm.h"
#include "shardtensor/shardtensor.h"

using namespace shardtensor;

namespace {

double median_ms(const std::function<void()>& step, const std::function<void()>& sync) {
  std::vector<double> ms;
  for (int i = 0; i < 18; ++i) {
    sync();
    const auto t0 = std::chrono::steady_clock::now();
    step();
    sync();
    if (i >= 3) ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main() {
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

  double single_ms = 0;
  if (rank == 0) {  // the other ranks wait in the barrier below
    const at::Tensor px = x.clone().requires_grad_(), pw = weight.clone().requires_grad_();
    single_ms = median_ms([&] { at::conv2d(px, pw, {}, 1, 1).backward(grad); }, [] {});
  }
  barrier();

  const at::Tensor sx = distribute_tensor(x, mesh, {Shard(2)}, ShardSizes{{2, sizes}}).requires_grad_();
  const at::Tensor sw = distribute_tensor(weight, mesh, {Replicate()}).requires_grad_();
  const at::Tensor sg = distribute_tensor(grad, mesh, {Shard(2)}, ShardSizes{{2, sizes}});
  const auto step = [&] { at::conv2d(sx, sw, {}, 1, 1).backward(sg); };
  const double sharded_ms = median_ms(step, barrier);
  CommDebugMode comms;
  step();
  const int64_t halo_rows = (rank > 0) + (rank < ranks - 1);  // one row to each neighbour
  const int64_t halo_bytes = 3 * halo_rows * n * c * w * 4;    // forward gather, backward gather + scatter
  if (rank == 0) {
    std::printf("conv2d %lldx%lldx%lldx%lld, kernel %lld, fwd+bwd, H split %lld ways (rows", static_cast<long long>(n),
                static_cast<long long>(c), static_cast<long long>(h), static_cast<long long>(w), static_cast<long long>(k),
                static_cast<long long>(ranks));
    for (int64_t s : sizes) std::printf(" %lld", static_cast<long long>(s));
    std::printf(")\n  one process: %.1f ms   sharded: %.1f ms   speed-up %.2fx\n", single_ms, sharded_ms, single_ms / sharded_ms);
    std::printf("  rank 0 sent %lld bytes per step in %lld collectives (%s); its halo is %lld bytes\n",
                static_cast<long long>(comms.bytes()), static_cast<long long>(comms.total()),
                comms.count("all_gather") ? "includes all-gathers!" : "all-to-all only", static_cast<long long>(halo_bytes));
  }
  return comms.bytes() == halo_bytes ? 0 : 1;
}
