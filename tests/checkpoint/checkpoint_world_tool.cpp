// A rank program for the checkpoint tests that span launches (checkpoint_driver_test.cpp):
//   checkpoint_world_tool save DIR [SALT]   every tensor of the state, laid out for this world size
//   checkpoint_world_tool load DIR [SALT]   loads into this world size's layout and compares
// The saved layout (at 4 ranks: a 2x2 mesh with nested and 2-D sharding, explicit uneven
// sizes, Replicate, Partial, plain tensors and a scalar) differs from the loaded one (a flat
// mesh of 3 or 2 ranks: S(1) where S(0) was, chunk sizes where explicit ones were, explicit
// sizes with an empty shard). Every loaded element must equal the deterministic global value.
// Exit code 0 on success, 1 with a message on the first difference.
#include <ATen/ATen.h>

#include <iostream>

#include "shardtensor/checkpoint.h"
#include "shardtensor/shardtensor.h"

using namespace shardtensor;
namespace ckpt = shardtensor::checkpoint;

namespace {

at::Tensor value_of(const std::string& name, int64_t salt) {
  const std::map<std::string, std::vector<int64_t>> shapes = {
      {"a", {11, 6}}, {"b", {13, 3}}, {"c", {5, 4}}, {"d", {7}}, {"bias", {6}}, {"step", {}}};
  at::Tensor v = at::arange(1, 1 + c10::multiply_integers(shapes.at(name)), at::kFloat).reshape(shapes.at(name));
  return v * 3 + static_cast<double>(salt * 1000 + name[0]);
}

// The value at coordinate 0 minus (n - 1), 1 elsewhere: only the sum gives the value back.
at::Tensor sum_partial(const at::Tensor& v, const DeviceMesh& mesh) {
  return mesh.coordinate()[0] == 0 ? v - static_cast<double>(mesh.size(0) - 1) : at::ones_like(v);
}

ckpt::StateDict saved_state(int64_t salt) {
  const int64_t n = world_size();
  const DeviceMesh flat = DeviceMesh::create({n});
  const DeviceMesh grid = n == 4 ? DeviceMesh::create({2, 2}) : flat;
  const Placements nested = n == 4 ? Placements{Shard(0), Shard(1)} : Placements{Shard(0)};
  std::vector<int64_t> b_sizes(n, 0);  // uneven, the first rank empty when there are several
  b_sizes.back() = 13;
  if (n > 2) {
    b_sizes[1] = 4;
    b_sizes.back() = 9;
  }
  return {
      {"a", distribute_tensor(value_of("a", salt), grid, nested)},
      {"b", distribute_tensor(value_of("b", salt), flat, {Shard(0)}, ShardSizes{{0, b_sizes}})},
      {"c", distribute_tensor(value_of("c", salt), flat, {Replicate()})},
      {"d", from_local(sum_partial(value_of("d", salt), flat), flat, {Partial()}, ShardSizing::given({}))},
      {"bias", value_of("bias", salt)},
      {"step", value_of("step", salt)},
  };
}

ckpt::StateDict target_state() {
  const int64_t n = world_size();
  const DeviceMesh flat = DeviceMesh::create({n});
  std::vector<int64_t> c_sizes(n, 0);
  c_sizes.back() = 5;
  if (n > 1) {
    c_sizes[0] = 2;
    c_sizes.back() = 3;
  }
  return {
      {"a", distribute_tensor(at::zeros({11, 6}), flat, {Shard(1)})},
      {"b", distribute_tensor(at::zeros({13, 3}), flat, {Shard(0)})},
      {"c", distribute_tensor(at::zeros({5, 4}), flat, {Shard(0)}, ShardSizes{{0, c_sizes}})},
      {"d", distribute_tensor(at::zeros({7}), flat, {Replicate()})},
      {"bias", at::zeros({6})},
      {"step", at::zeros({})},
  };
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: checkpoint_world_tool save|load DIR [SALT]\n";
    return 2;
  }
  const std::string mode = argv[1], dir = argv[2];
  const int64_t salt = argc > 3 ? std::stoll(argv[3]) : 0;
  try {
    if (mode == "save") {
      ckpt::save(saved_state(salt), dir);
      return 0;
    }
    ckpt::StateDict state = target_state();
    ckpt::load(state, dir);
    for (const auto& [name, t] : state) {
      const at::Tensor got = is_shard_tensor(t) ? full_tensor(t) : t;
      if (!at::equal(got, value_of(name, salt))) {
        std::cerr << "checkpoint_world_tool: '" << name << "' loaded at world size " << world_size() << " differs from the saved value:\n"
                  << got << "\nexpected\n" << value_of(name, salt) << std::endl;
        return 1;
      }
    }
    std::cout << "loaded " << state.size() << " tensors at world size " << world_size() << ": all equal" << std::endl;
    return 0;
  } catch (const c10::Error& e) {
    std::cerr << e.what_without_backtrace() << std::endl;
    return 1;
  }
}
