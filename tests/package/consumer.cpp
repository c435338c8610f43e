// Uses the installed headers and library: a spec on a mesh without communicators.
#include <shardtensor/shardtensor.h>

#include <iostream>

int main() {
  using namespace shardtensor;
  ShardTensorSpec spec(DeviceMesh::without_comms({4}, 3), {Shard(0)}, {10, 6}, c10::kFloat, {{0, {1, 4, 2, 3}}});
  std::cout << spec << " local " << spec.local_shape()[0] << " rows" << std::endl;
  return spec.local_shape()[0] == 3 ? 0 : 1;
}
