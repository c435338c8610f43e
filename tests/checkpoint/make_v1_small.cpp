// Writes the committed test checkpoint (see v1_small_fixture.h) into DIR, at 2 ranks:
//   shardrun -n 2 build/tests/make_v1_small tests/checkpoint/data/v1_small
// Only for a deliberate format change; checkpoint_v1_test.cpp checks that today's save writes
// the committed bytes.
#include <iostream>

#include "checkpoint/v1_small_fixture.h"

using namespace shardtensor;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: shardrun -n 2 make_v1_small DIR\n";
    return 2;
  }
  try {
    if (world_size() != testing::v1_small::kWorldSize) {
      std::cerr << "make_v1_small: run it at " << testing::v1_small::kWorldSize << " ranks, not " << world_size() << "\n";
      return 2;
    }
    const DeviceMesh mesh = DeviceMesh::create({testing::v1_small::kWorldSize});
    checkpoint::save(testing::v1_small::state(mesh), argv[1], testing::v1_small::save_options());
    return 0;
  } catch (const c10::Error& e) {
    std::cerr << e.what_without_backtrace() << std::endl;
    return 1;
  }
}
