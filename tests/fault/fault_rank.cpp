// One rank of a fault scenario; fault_test.cpp starts the ranks, injects the fault and judges.
// Built as a shared library (fault_rank_body), which the driver's forked ranks load, and as the
// program fault_rank (fault_rank_main.cpp), to run a rank by hand:
//
//   fault_rank SCENARIO VICTIM SEED REPORT_DIR
//
// Every rank runs rounds of redistributes over one world mesh (small tensors, all through peer
// memory when SHARDTENSOR_PEER_MEMORY is not 0) and checks every result against the slice of
// the single-process tensor it owns. The victim rank misbehaves as SCENARIO says:
//   none              no fault (the baseline: every rank reports "ok")
//   run               no fault of its own; the driver kills or stops it from outside
//   kill_at:POINT     SIGKILL itself at the transports' fault point POINT (fingerprint.h)
//   stop_at:POINT     SIGSTOP itself there (the driver sends SIGCONT after the timeout)
//   late_at:POINT     sleep past the timeout there, then go on (the others time out and go on)
//   skip              skip one redistribute that the others run
//   reorder_same      run two redistributes that move the same bytes in the other order
//   reorder_sizes     run two redistributes that move different bytes in the other order
//   lag_after_done    no fault: in the last round the victim sleeps after each "done" it posts,
//                     so the others finish the last exchange and exit before it reads theirs
// Each rank writes REPORT_DIR/rank<R>: "ok", "raised <seconds after its last success> <error>"
// or "wrong <what>", and exits 0 unless it found a wrong value (3).
#include <ATen/ATen.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <thread>

#include "comm/fingerprint.h"
#include "redistribute/transports/peer_memory/arena.h"
#include "redistribute/transports/peer_memory/copies.h"
#include "shardtensor/shardtensor.h"

using namespace shardtensor;

namespace {

using Clock = std::chrono::steady_clock;

std::string report_path;
void report(const std::string& line) {
  std::ofstream(report_path) << line << "\n";
}

// The single-process tensors of round `round`: distinct values per round and per tensor.
at::Tensor global_tensor(int64_t rows, int64_t cols, int64_t round, int64_t which) {
  return at::arange(rows * cols, at::kFloat).view({rows, cols}) + 1000.0 * round + 100000.0 * which;
}

// Checks `result`'s local piece against the slice of `expected` this rank owns.
void check(const at::Tensor& result, const at::Tensor& expected, const std::string& what) {
  ShardTensor st(result);
  at::Tensor slice = expected;
  const auto offsets = st.offsets();
  const auto shape = st.local_shape();
  for (size_t d = 0; d < shape.size(); ++d) slice = slice.narrow(static_cast<int64_t>(d), offsets[d], shape[d]);
  if (!at::equal(st.to_local(), slice)) {
    report("wrong " + what);
    std::cerr << "rank " << world_rank() << ": WRONG VALUES in " << what << "\n";
    std::_Exit(3);
  }
}

// The tensors of a round, by step name; "A" and "B" move the same bytes ([13, 10] and [10, 13]
// from S(0) to S(1)), "C" more of them, and "D"'s rows are long enough that through peer
// memory its holders write its parts (redistribute/transports/peer_memory/copies.h), unless they
// lie in the holders' shared arenas. "E" is a pending sum, reduced: where the arenas are on, its
// pieces are large enough to lie in them and be combined in place. Every rank distributes all
// five in the same order (distribute_tensor compares what the ranks pass, and would catch a skip
// itself), so that a skipped or reordered step is left to the transports to catch.
struct Step {
  at::Tensor global, sharded;
};
std::map<char, Step> distribute_round(const DeviceMesh& mesh, int64_t round) {
  std::map<char, Step> steps;
  for (char step : {'A', 'B', 'C', 'D'}) {
    const int64_t rows = step == 'A' ? 13 : step == 'B' ? 10 : step == 'C' ? 29 : 24;
    const int64_t cols = step == 'A' ? 10 : step == 'D' ? 3000 : 13;
    const at::Tensor global = global_tensor(rows, cols, round, step);
    steps[step] = {global, distribute_tensor(global, mesh, {Shard(0)})};
  }
  // Rank r holds (r + 1) x the tensor: integers small enough that every sum is exact in float.
  const at::Tensor terms = global_tensor(64, 1024, round, 'E' - 'A');
  const int64_t n = world_size();
  steps['E'] = {terms * static_cast<double>(n * (n + 1) / 2), from_local(terms * static_cast<double>(world_rank() + 1), mesh, {Partial()})};
  return steps;
}

void run_step(const Step& s, char step, int64_t round) {
  const std::string what = std::string("round ") + std::to_string(round) + " step " + step;
  const bool pending = step == 'E';
  check(redistribute(s.sharded, {pending ? Shard(0) : Shard(1)}), s.global, what + (pending ? " P->S(0)" : " S(0)->S(1)"));
  check(redistribute(s.sharded, {Replicate()}), s.global, what + (pending ? " P->R" : " S(0)->R"));
}

}  // namespace

extern "C" int shardtensor_fault_rank_main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: fault_rank SCENARIO VICTIM SEED REPORT_DIR\n";
    return 2;
  }
  const std::string scenario = argv[1];
  const int64_t victim = std::atoll(argv[2]);
  const int64_t seed = std::atoll(argv[3]);
  report_path = std::string(argv[4]) + "/rank" + std::getenv("RANK");
  const double timeout_s = std::atof(std::getenv("SHARDTENSOR_TIMEOUT_S"));
  auto last_success = Clock::now();
  try {
    // The Arena cases must run with the arena, not quietly as the PeerMemory ones.
    const char* arena_wanted = std::getenv("SHARDTENSOR_ARENA");
    if (arena_wanted && std::string(arena_wanted) == "1" && own_arena().base == 0) {
      report("wrong: SHARDTENSOR_ARENA=1, but no shared arena was installed");
      return 3;
    }
    DeviceMesh mesh = DeviceMesh::create({world_size()});
    std::ofstream(report_path + ".ready") << "ready\n";  // the driver times outside kills from here
    TransportOptions every_size;
    every_size.peer_copy_bytes = 0;  // small tensors go through peer memory too, where it is on
    const TransportOptionsScope scope(every_size);
    const bool is_victim = world_rank() == victim;
    const int64_t fault_round = 2 + seed % 3;
    auto colon = scenario.find(':');
    const std::string action = scenario.substr(0, colon);
    const std::string point = colon == std::string::npos ? "" : scenario.substr(colon + 1);
    for (int64_t round = 0;; ++round) {
      const bool last_round = round == 5;
      if (is_victim && last_round && scenario == "lag_after_done")
        set_fault_hook([](const char* at) {
          if (std::string(at) == "peer_memory:done") std::this_thread::sleep_for(std::chrono::milliseconds(300));
        });
      if (is_victim && round == fault_round && !point.empty()) {
        // Strike at the (seed % 2 + 1)-th time the point is reached in this round.
        auto hits = std::make_shared<int>(0);
        const int strike = static_cast<int>(seed % 2) + 1;
        set_fault_hook([=](const char* at) {
          if (point != at || ++*hits != strike) return;
          if (action == "kill_at") raise(SIGKILL);
          if (action == "stop_at") raise(SIGSTOP);
          if (action == "late_at") std::this_thread::sleep_for(std::chrono::duration<double>(timeout_s + 2));
        });
      }
      std::string steps = "ABCDE";
      if (is_victim && round == fault_round) {
        if (scenario == "skip") steps = "BCDE";
        if (scenario == "reorder_same") steps = "BACDE";
        if (scenario == "reorder_sizes") steps = "CABDE";
      }
      const std::map<char, Step> tensors = distribute_round(mesh, round);
      for (char step : steps) run_step(tensors.at(step), step, round);
      set_fault_hook(nullptr);
      last_success = Clock::now();
      if ((scenario == "none" || scenario == "lag_after_done") && last_round) break;
      if (action == "late_at" && round > fault_round + 3) break;  // the victim woke and went on: done
    }
    report("ok");
  } catch (const std::exception& e) {
    const double after = std::chrono::duration<double>(Clock::now() - last_success).count();
    std::string message = e.what();
    message = message.substr(0, message.find('\n'));
    report("raised " + std::to_string(after) + " " + message);
    std::cerr << "rank " << world_rank() << " raised after " << after << " s: " << message << "\n";
    if (scenario.rfind("late_at", 0) == 0) {
      // Timed out and going on, as a program that catches the error would: churn the heap (a
      // late peer that wrote into freed buffers would corrupt it), then try again.
      for (int i = 0; i < 200; ++i) {
        at::Tensor junk = at::full({1 << 12}, static_cast<float>(i));
        if (junk[7].item<float>() != static_cast<float>(i)) std::_Exit(4);
      }
      // Buffers the size of step D's results, which its holders write into (malloc hands back
      // the freed ones), hold a known value while the late peer wakes and writes: a write into
      // memory its owner freed shows as a changed value.
      std::vector<at::Tensor> held;
      for (int i = 0; i < 8; ++i) held.push_back(at::full({24, 3000 / world_size() + 1}, -7.0f));
      for (int i = 0; i < 8; ++i) held.push_back(at::full({24, 3000 / world_size()}, -7.0f));
      std::this_thread::sleep_for(std::chrono::duration<double>(timeout_s + 3));
      for (const at::Tensor& t : held)
        if (!t.eq(-7.0f).all().item<bool>()) {
          report("wrong: a late peer wrote into memory this rank had freed");
          std::cerr << "rank " << world_rank() << ": a late peer wrote into freed memory\n";
          std::_Exit(3);
        }
      for (int i = 0; i < 200; ++i) at::Tensor junk = at::full({1 << 12}, static_cast<float>(i));
    }
  }
  return 0;
}
