// One operator on a ShardTensor in a loop, for an instruction profiler: the per-call cost of the
// kernel, counted rather than timed (this VM's timings drift by 2x between its fast and slow
// spells; instruction counts do not). Run:
//   shardrun -n 1 valgrind --tool=callgrind --callgrind-out-file=cg.out build-torch2/bench/op_loop view 20000
//   callgrind_annotate --tree=calling --inclusive=yes cg.out
// and divide a function's inclusive count by the calls (100 warm-up calls run first).
#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>

#include "shardtensor/shardtensor.h"

using namespace shardtensor;

int main(int argc, char** argv) {
  const std::map<std::string, std::function<at::Tensor(const at::Tensor&)>> ops = {
      {"add", [](const at::Tensor& x) { return x + x; }},
      {"relu", [](const at::Tensor& x) { return x.relu(); }},
      {"sum1", [](const at::Tensor& x) { return x.sum(1); }},
      {"view", [](const at::Tensor& x) { return x.view({x.size(0), x.size(1) / 2, 2}); }},
      {"t", [](const at::Tensor& x) { return x.t(); }},
  };
  const std::string name = argc > 1 ? argv[1] : "view";
  const int calls = argc > 2 ? std::atoi(argv[2]) : 20000;
  const auto op = ops.find(name);
  if (op == ops.end() || calls < 0) {
    std::fprintf(stderr, "usage: op_loop [add|relu|sum1|view|t] [calls]\n");
    return 2;
  }
  const DeviceMesh mesh = DeviceMesh::create({world_size()});
  const at::Tensor x = distribute_tensor(at::randn({8 * world_size(), 8}), mesh, {Shard(0)});
  for (int i = 0; i < 100; ++i) op->second(x);
  for (int i = 0; i < calls; ++i) op->second(x);
  std::printf("%s: %d calls after 100 warm-up calls\n", name.c_str(), calls);
  return 0;
}
