// Scaled dot-product attention, forward + backward, with Q, K and V split over the sequence:
// ring attention (K/V blocks passed around the ranks) against gather-then-attend (K and V
// redistributed to Replicate, then local attention of this rank's rows), and against one
// process. Also the peak memory each rank adds during a step (VmHWM after resetting it through
// /proc/self/clear_refs), next to the gathered K/V it would hold otherwise, for the whole step
// and for the forward alone without autograd (what the attention itself holds).
// With --causal: is_causal, and the ring on zigzag chunks (load-balanced, ZigzagShard) beside
// the ring on contiguous shards, whose last rank computes 2n - 1 times the first's share.
// Run: shardrun -n 4 build-torch2/bench/attention_bench [--causal] (and -n 2); results in
// bench/RESULTS.md. Not causal: --seq 4096,16384 picks the sequence lengths, --steps N the timed
// steps at each (default 9, 2 above S = 8192), --json FILE makes rank 0 also write min / median
// / max of each timing to FILE (for bench/regenerate.py).
// On libtorch 1.13, which has no SDPA, it prints why it skips and exits 0.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "bench_report.h"
#include "comm/comm.h"
#include "shardtensor/shardtensor.h"

using namespace shardtensor;

namespace {

auto sdpa_op() {  // c10::optional on libtorch 1.13, std::optional on 2.x
  return c10::Dispatcher::singleton().findSchema({"aten::scaled_dot_product_attention", ""});
}

bool is_causal = false;  // --causal

at::Tensor sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  torch::jit::Stack stack{q, k, v, c10::IValue(), 0.0, is_causal, c10::IValue(), false};
  sdpa_op()->callBoxed(&stack);
  return stack.back().toTensor();
}

// kB from /proc/self/status ("VmHWM", "VmRSS").
int64_t status_kb(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  return -1;
}

// Starts a peak-memory window: the kernel's high-water mark is reset to the current RSS. Blocks
// of 64 KiB and more are mapped and unmapped one by one (main() fixes glibc's threshold), so the
// resident size follows the live tensors instead of what glibc kept from earlier steps.
int64_t reset_peak() {
  std::ofstream("/proc/self/clear_refs") << "5";
  return status_kb("VmRSS");
}

struct Timing {
  double ms = 0;
  double peak_mib = 0;  // above the RSS at the start of the window
  bench_report::Stats stats;  // of the timed steps, ms
};

Timing measure(const std::function<void()>& step, const std::function<void()>& sync, int timed) {
  step();  // warm-up
  std::vector<double> ms;
  const int64_t base = reset_peak();
  for (int i = 0; i < timed; ++i) {
    sync();
    const auto t0 = std::chrono::steady_clock::now();
    step();
    sync();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  const bench_report::Stats stats = bench_report::stats_of(ms);
  return {stats.median, (status_kb("VmHWM") - base) / 1024.0, stats};
}

}  // namespace

// The causal comparison: contiguous shards against zigzag chunks, both rings, and gather-then-attend.
void causal_section(const DeviceMesh& mesh, int64_t b, int64_t h, int64_t d) {
  const int64_t ranks = mesh.size(0), rank = mesh.coordinate()[0];
  const auto barrier = [&] { mesh.comm(0).barrier(); };
  for (int64_t s : {4096, 16384}) {
    const int timed = s > 8192 ? 2 : 9;
    at::manual_seed(0);
    const at::Tensor q = at::randn({b, h, s, d}), k = at::randn({b, h, s, d}), v = at::randn({b, h, s, d}),
                     g = at::randn({b, h, s, d});
    Timing single;
    if (rank == 0) {
      const at::Tensor pq = q.clone().requires_grad_(), pk = k.clone().requires_grad_(), pv = v.clone().requires_grad_();
      single = measure([&] { sdpa(pq, pk, pv).backward(g); }, [] {}, timed);
    }
    barrier();
    const auto split = [&](const at::Tensor& t) { return distribute_tensor(t, mesh, {Shard(2)}); };
    const at::Tensor sq = split(q).requires_grad_(), sk = split(k).requires_grad_(), sv = split(v).requires_grad_(), sg = split(g);
    const at::Tensor zq = zigzag_shard(split(q), 0, 2).requires_grad_(), zk = zigzag_shard(split(k), 0, 2).requires_grad_(),
                     zv = zigzag_shard(split(v), 0, 2).requires_grad_(), zg = zigzag_shard(sg, 0, 2);
    const Timing contiguous = measure([&] { sdpa(sq, sk, sv).backward(sg); }, barrier, timed);
    const Timing zigzag = measure([&] { sdpa(zq, zk, zv).backward(zg); }, barrier, timed);
    const Timing gather = measure(
        [&] { sdpa(sq, redistribute(sk, mesh, {Replicate()}), redistribute(sv, mesh, {Replicate()})).backward(sg); }, barrier,
        timed);
    if (rank == 0)
      std::printf("  causal S=%lld: one process %.0f ms | ring, contiguous shards %.0f ms | ring, zigzag chunks %.0f ms | "
                  "gather-then-attend %.0f ms | zigzag/contiguous %.2f | zigzag/gather %.2f | zigzag/one process %.2f\n",
                  static_cast<long long>(s), single.ms, contiguous.ms, zigzag.ms, gather.ms, zigzag.ms / contiguous.ms,
                  zigzag.ms / gather.ms, zigzag.ms / single.ms);
  }
}

int main(int argc, char** argv) {
  mallopt(M_MMAP_THRESHOLD, 64 * 1024);
  is_causal = argc > 1 && std::string(argv[1]) == "--causal";
  if (!sdpa_op()) {
    std::printf("attention_bench: skipped: aten::scaled_dot_product_attention does not exist in this libtorch (torch 2.0+)\n");
    return 0;
  }
  const DeviceMesh mesh = DeviceMesh::create({world_size()});
  const int64_t ranks = mesh.size(0), rank = mesh.coordinate()[0];
  const int64_t b = 1, h = 2, d = 32;
  const auto barrier = [&] { mesh.comm(0).barrier(); };
  std::vector<int64_t> seqs;
  {
    std::stringstream list(bench_report::option(argc, argv, "--seq").empty() ? "4096,16384" : bench_report::option(argc, argv, "--seq"));
    for (std::string item; std::getline(list, item, ',');) seqs.push_back(std::stoll(item));
  }
  const int steps = bench_report::int_option(argc, argv, "--steps", 0);  // 0: the default rule
  const std::string json_path = bench_report::option(argc, argv, "--json");
  std::vector<bench_report::Object> json_rows;
  if (is_causal) {
    if (rank == 0)
      std::printf("causal SDPA fwd+bwd, [B, H, S, D] = [%lld, %lld, S, %lld] float32, Q/K/V split over S on %lld ranks\n",
                  static_cast<long long>(b), static_cast<long long>(h), static_cast<long long>(d), static_cast<long long>(ranks));
    causal_section(mesh, b, h, d);
    return 0;
  }
  if (rank == 0)
    std::printf("SDPA fwd+bwd, [B, H, S, D] = [%lld, %lld, S, %lld] float32, Q/K/V split over S on %lld ranks\n",
                static_cast<long long>(b), static_cast<long long>(h), static_cast<long long>(d), static_cast<long long>(ranks));
  for (int64_t s : seqs) {
    const int timed = steps > 0 ? steps : s > 8192 ? 2 : 9;  // S = 4096 steps are short: more of them steady the median
    at::manual_seed(0);
    const at::Tensor q = at::randn({b, h, s, d}), k = at::randn({b, h, s, d}), v = at::randn({b, h, s, d}),
                     g = at::randn({b, h, s, d});
    Timing single;
    if (rank == 0) {  // the other ranks wait in the barrier below
      const at::Tensor pq = q.clone().requires_grad_(), pk = k.clone().requires_grad_(), pv = v.clone().requires_grad_();
      single = measure([&] { sdpa(pq, pk, pv).backward(g); }, [] {}, timed);
    }
    barrier();
    const at::Tensor sq = distribute_tensor(q, mesh, {Shard(2)}).requires_grad_();
    const at::Tensor sk = distribute_tensor(k, mesh, {Shard(2)}).requires_grad_();
    const at::Tensor sv = distribute_tensor(v, mesh, {Shard(2)}).requires_grad_();
    const at::Tensor sg = distribute_tensor(g, mesh, {Shard(2)});
    const Timing ring = measure([&] { sdpa(sq, sk, sv).backward(sg); }, barrier, timed);
    const Timing gather = measure(
        [&] { sdpa(sq, redistribute(sk, mesh, {Replicate()}), redistribute(sv, mesh, {Replicate()})).backward(sg); }, barrier,
        timed);
    // Forward alone, without autograd: nothing is saved for a backward, so the peak is what the
    // attention itself holds (the K/V blocks in flight or the gathered K/V, the output and its
    // float32 accumulator), the figure the memory bar is about.
    const auto forward_only = [&](const std::function<at::Tensor()>& keys, const std::function<at::Tensor()>& values) {
      return [&, keys, values] {
        at::NoGradGuard no_grad;
        sdpa(sq, keys(), values());
      };
    };
    const Timing ring_fwd = measure(forward_only([&] { return sk; }, [&] { return sv; }), barrier, timed);
    const Timing gather_fwd = measure(forward_only([&] { return redistribute(sk, mesh, {Replicate()}); },
                                                   [&] { return redistribute(sv, mesh, {Replicate()}); }),
                                      barrier, timed);
    const double kv_mib = 2.0 * b * h * s * d * 4 / (1 << 20);
    const double out_mib = 2.0 * b * h * s * d * 4 / ranks / (1 << 20);  // this rank's output and its accumulator
    if (rank == 0)
      std::printf("  S=%lld: one process %.0f ms | ring %.0f ms (%.2fx one process) | gather-then-attend %.0f ms | ring/gather %.2f\n"
                  "         peak extra MiB on rank 0, fwd+bwd: ring %.1f, gather %.1f, one process %.1f\n"
                  "         peak extra MiB on rank 0, forward only: ring %.1f, gather %.1f; gathered K/V %.1f MiB; "
                  "bar 1/N of it + two blocks = %.1f MiB, plus the output and its accumulator %.1f MiB\n",
                  static_cast<long long>(s), single.ms, ring.ms, single.ms / ring.ms, gather.ms, ring.ms / gather.ms,
                  ring.peak_mib, gather.peak_mib, single.peak_mib, ring_fwd.peak_mib, gather_fwd.peak_mib, kv_mib,
                  3 * kv_mib / ranks, out_mib);
    json_rows.push_back(bench_report::Object()
                            .add("seq", s)
                            .add("steps", timed)
                            .add("one_process_ms", single.stats)
                            .add("ring_ms", ring.stats)
                            .add("gather_ms", gather.stats)
                            .add("ring_peak_mib", ring.peak_mib)
                            .add("gather_peak_mib", gather.peak_mib)
                            .add("one_process_peak_mib", single.peak_mib)
                            .add("ring_forward_peak_mib", ring_fwd.peak_mib)
                            .add("gather_forward_peak_mib", gather_fwd.peak_mib)
                            .add("gathered_kv_mib", kv_mib));
  }
  if (rank == 0)
    bench_report::write(json_path, bench_report::Object()
                                       .add("bench", "attention_bench")
                                       .add("world", ranks)
                                       .add("shape", "[" + std::to_string(b) + ", " + std::to_string(h) + ", S, " + std::to_string(d) + "]")
                                       .add("rows", json_rows));
  return 0;
}
