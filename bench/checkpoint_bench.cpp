// Distributed checkpoint benchmark: save and load of 1 GiB of sharded parameters (16 tensors of
// [4096, 4096] float, 64 MiB each: S(0) with chunk sizes, S(1), S(0) with uneven sizes 3:2:1.5:1.5),
// beside one process writing the same bytes with torch::save, measured in the same run.
//
//   shardrun -n 4 --timeout 600 ./build/bench/checkpoint_bench [DIR]     (default DIR: /tmp)
//
// Times are of the slowest rank (a barrier before, the max over ranks after); GB/s is the
// aggregate (1 GiB / that time). "load resharded" loads into S(1) what was saved S(0) and vice
// versa (reads whole rows: Note [Checksum chunks] in src/checkpoint/format.h). Memory: the
// rise of each rank's peak RSS (VmHWM, reset through /proc/self/clear_refs) during the step,
// beside its local shards' bytes. Every load is checked against the values saved.
#include <ATen/ATen.h>
#if __has_include(<torch/serialize.h>)
#include <torch/serialize.h>
#define CHECKPOINT_BENCH_HAS_TORCH_SAVE 1
#endif
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>

#include "comm/comm.h"
#include "shardtensor/checkpoint.h"
#include "shardtensor/shardtensor.h"

using namespace shardtensor;
namespace ckpt = shardtensor::checkpoint;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kTensors = 16, kRows = 4096, kCols = 4096;

int64_t peak_rss_kib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6));
  return -1;
}
void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

double max_over_ranks(const DeviceMesh& mesh, double v) {
  at::Tensor t = at::tensor(std::vector<double>{v}, at::kDouble);
  mesh.mesh_comm().all_reduce(t, ReduceOp::Max);
  return t.item<double>();
}

// Seconds of the slowest rank, and the largest peak-RSS rise of any rank (MiB).
std::pair<double, double> timed(const DeviceMesh& mesh, const std::function<void()>& fn) {
  mesh.mesh_comm().barrier();
  reset_peak_rss();
  const int64_t before = peak_rss_kib();
  const auto start = Clock::now();
  fn();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const double rise_mib = static_cast<double>(peak_rss_kib() - before) / 1024.0;
  return {max_over_ranks(mesh, seconds), max_over_ranks(mesh, rise_mib)};
}

Placement placement_of(int64_t i, bool swapped) {
  const bool rows = i % 4 != 1;
  return Shard(rows != swapped ? 0 : 1);
}

ShardSizes sizes_of(int64_t i, const DeviceMesh& mesh, bool swapped) {
  const int64_t n = mesh.size();
  const int64_t dim = placement_of(i, swapped).tensor_dim;
  if (i % 4 == 3 && n == 4 && !swapped) return {{dim, {1536, 1024, 768, 768}}};
  return {{dim, chunk_sizes(dim == 0 ? kRows : kCols, n)}};
}

ckpt::StateDict make_state(const DeviceMesh& mesh, bool swapped, bool filled) {
  ckpt::StateDict state;
  for (int64_t i = 0; i < kTensors; ++i) {
    const ShardTensorSpec s(mesh, {placement_of(i, swapped)}, {kRows, kCols}, at::kFloat, sizes_of(i, mesh, swapped));
    at::Tensor local = filled ? at::arange(c10::multiply_integers(s.local_shape()), at::kFloat).reshape(s.local_shape()).add_(1000 * i)
                              : at::zeros(s.local_shape(), at::kFloat);
    char name[32];
    std::snprintf(name, sizeof(name), "layer%02lld.weight", static_cast<long long>(i));
    state[name] = from_local(local, mesh, s.placements(), ShardSizing::given(s.shard_sizes()));
  }
  return state;
}

int64_t local_bytes(const ckpt::StateDict& state) {
  int64_t b = 0;
  for (const auto& [name, t] : state) b += static_cast<int64_t>(to_local(t).nbytes());
  return b;
}

void print_row(const char* what, double seconds, double rise_mib) {
  if (world_rank() != 0) return;
  const double gib = static_cast<double>(kTensors * kRows * kCols * 4) / (1 << 30);
  std::cout << "| " << what << " | " << std::fixed << std::setprecision(3) << seconds << " | " << std::setprecision(2)
            << gib * 1.073741824 / seconds << " | " << std::setprecision(0) << rise_mib << " |" << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string root = argc > 1 ? argv[1] : "/tmp";
  const DeviceMesh mesh = DeviceMesh::create({world_size()});
  const std::string dir = root + "/checkpoint_bench_ckpt";
  const bool rank0 = mesh.rank() == 0;

  ckpt::StateDict source = make_state(mesh, /*swapped=*/false, /*filled=*/true);
  if (rank0)
    std::cout << "world " << mesh.size() << ", 1 GiB in " << kTensors << " tensors, local shards of rank 0: "
              << local_bytes(source) / (1 << 20) << " MiB\n| step | s | GB/s aggregate | peak RSS rise MiB (max rank) |\n|---|---|---|---|"
              << std::endl;

  ckpt::SaveOptions no_fsync;
  no_fsync.fsync = false;
  auto [fast_s, fast_rss] = timed(mesh, [&] { ckpt::save(source, dir, no_fsync); });
  print_row("save, fsync = false (as torch::save)", fast_s, fast_rss);
  auto [save_s, save_rss] = timed(mesh, [&] { ckpt::save(source, dir); });
  print_row("save (fsync, atomic rename)", save_s, save_rss);

  ckpt::StateDict same = make_state(mesh, /*swapped=*/false, /*filled=*/false);
  auto [load_s, load_rss] = timed(mesh, [&] { ckpt::load(same, dir); });
  print_row("load, same layout", load_s, load_rss);
  for (const auto& [name, t] : same)
    TORCH_CHECK(at::equal(to_local(t), to_local(source.at(name))), "checkpoint_bench: ", name, " loaded wrong values");

  ckpt::StateDict swapped = make_state(mesh, /*swapped=*/true, /*filled=*/false);
  auto [reshard_s, reshard_rss] = timed(mesh, [&] { ckpt::load(swapped, dir); });
  print_row("load resharded (S(0)<->S(1))", reshard_s, reshard_rss);
  same.clear();
  swapped.clear();

#ifdef CHECKPOINT_BENCH_HAS_TORCH_SAVE
  // One process writes all 1 GiB with torch::save; the other ranks wait.
  mesh.mesh_comm().barrier();
  if (rank0) {
    std::vector<at::Tensor> whole;
    for (int64_t i = 0; i < kTensors; ++i) whole.push_back(at::full({kRows, kCols}, static_cast<float>(i)));
    const std::string file = root + "/checkpoint_bench_torch_save.pt";
    reset_peak_rss();
    const int64_t before = peak_rss_kib();
    auto start = Clock::now();
    torch::save(whole, file);
    const double plain = std::chrono::duration<double>(Clock::now() - start).count();
    const double rise = static_cast<double>(peak_rss_kib() - before) / 1024.0;
    const int fd = ::open(file.c_str(), O_RDONLY);
    ::fsync(fd);
    ::close(fd);
    const double synced = std::chrono::duration<double>(Clock::now() - start).count();
    print_row("torch::save, 1 process", plain, rise);
    print_row("torch::save + fsync, 1 process", synced, rise);
    std::vector<at::Tensor> back;
    start = Clock::now();
    torch::load(back, file);
    print_row("torch::load, 1 process", std::chrono::duration<double>(Clock::now() - start).count(), 0);
    std::filesystem::remove(file);
  }
  mesh.mesh_comm().barrier();
#else
  if (rank0) std::cout << "torch::save baseline: <torch/serialize.h> not available in this build" << std::endl;
#endif
  if (rank0) std::filesystem::remove_all(dir);
  mesh.mesh_comm().barrier();
  return 0;
}
