// Per-operator CPU overhead of the ShardTensor kernel on ops that need no communication,
// next to the plain ATen op in the same run: 8x8 and 64x64, propagation cache hit (warm) and
// miss (the cache dropped before every call). Run: shardrun -n 1 build/bench/dispatch_bench
// (and -n 4). Medians over 2000 calls (miss: 300).
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "dispatch/propagation.h"
#include "shardtensor/shardtensor.h"

using namespace shardtensor;

namespace {

double median_us(const std::function<void()>& fn, int reps, bool cold) {
  std::vector<double> us;
  for (int i = 0; i < 50; ++i) fn();
  for (int i = 0; i < reps; ++i) {
    if (cold) clear_propagation_cache();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
  return us[us.size() / 2];
}

}  // namespace

int main() {
  const DeviceMesh mesh = DeviceMesh::create({world_size()});
  if (world_rank() == 0) std::printf("world size %lld\n%-22s %6s %10s %10s %10s %10s\n", static_cast<long long>(world_size()), "op",
                                          "size", "plain us", "hit us", "over us", "miss us");
  for (int64_t n : {8, 64}) {
    at::manual_seed(0);
    const at::Tensor a = at::randn({n * world_size(), n}), b = at::randn({n, n});
    const at::Tensor sa = distribute_tensor(a, mesh, {Shard(0)}), sb = distribute_tensor(b, mesh, {Replicate()});
    const at::Tensor la = to_local(sa);
    struct Op {
      const char* name;
      std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> f;
    };
    const std::vector<Op> ops = {
        {"add", [](const at::Tensor& x, const at::Tensor&) { return x + x; }},
        {"mul scalar", [](const at::Tensor& x, const at::Tensor&) { return x * 2; }},
        {"relu", [](const at::Tensor& x, const at::Tensor&) { return x.relu(); }},
        {"sum unsharded dim", [](const at::Tensor& x, const at::Tensor&) { return x.sum(1); }},
        {"mm S(0) x R", [](const at::Tensor& x, const at::Tensor& y) { return at::mm(x, y); }},
        {"view", [](const at::Tensor& x, const at::Tensor&) { return x.view({x.size(0), x.size(1) / 2, 2}); }},
        {"t", [](const at::Tensor& x, const at::Tensor&) { return x.t(); }},
    };
    for (const Op& op : ops) {
      const double plain = median_us([&] { op.f(la, b); }, 2000, false);
      const double hit = median_us([&] { op.f(sa, sb); }, 2000, false);
      const double miss = median_us([&] { op.f(sa, sb); }, 300, true);
      if (world_rank() == 0)
        std::printf("%-22s %6lld %10.2f %10.2f %10.2f %10.2f\n", op.name, static_cast<long long>(n), plain, hit, hit - plain, miss);
    }
  }
  return 0;
}
