// Per-operator CPU overhead of the ShardTensor kernel on ops that need no communication,
// next to the plain ATen op in the same run: 8x8 and 64x64, propagation cache hit (warm) and
// miss (the cache dropped before every call). Run: shardrun -n 1 build/bench/dispatch_bench
// (and -n 4). Medians over 2000 calls (miss: 300); --reps N: N calls (miss: N / 6 + 1);
// --json FILE: rank 0 also writes min / median / max of each to FILE, for bench/regenerate.py.
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "bench_report.h"
#include "dispatch/propagation.h"
#include "shardtensor/shardtensor.h"

using namespace shardtensor;

namespace {

bench_report::Stats time_us(const std::function<void()>& fn, int reps, bool cold) {
  std::vector<double> us;
  for (int i = 0; i < 50; ++i) fn();
  for (int i = 0; i < reps; ++i) {
    if (cold) clear_propagation_cache();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  return bench_report::stats_of(us);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = bench_report::int_option(argc, argv, "--reps", 2000), miss_reps = reps == 2000 ? 300 : reps / 6 + 1;
  const std::string json_path = bench_report::option(argc, argv, "--json");
  std::vector<bench_report::Object> rows;
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
      const bench_report::Stats plain_us = time_us([&] { op.f(la, b); }, reps, false);
      const bench_report::Stats hit_us = time_us([&] { op.f(sa, sb); }, reps, false);
      const bench_report::Stats miss_us = time_us([&] { op.f(sa, sb); }, miss_reps, true);
      const double plain = plain_us.median, hit = hit_us.median, miss = miss_us.median;
      if (world_rank() == 0)
        std::printf("%-22s %6lld %10.2f %10.2f %10.2f %10.2f\n", op.name, static_cast<long long>(n), plain, hit, hit - plain, miss);
      rows.push_back(bench_report::Object().add("op", op.name).add("n", n).add("plain_us", plain_us).add("hit_us", hit_us).add("miss_us", miss_us));
    }
  }
  if (world_rank() == 0)
    bench_report::write(json_path, bench_report::Object()
                                       .add("bench", "dispatch_bench")
                                       .add("world", world_size())
                                       .add("reps", reps)
                                       .add("miss_reps", miss_reps)
                                       .add("rows", rows));
  return 0;
}
