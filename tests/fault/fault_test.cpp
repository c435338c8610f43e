// The fault-injection suite (issue 14): ranks of fault_rank are started here, one of them is
// killed, stopped, made late or made to run other collectives, and every rank's outcome is
// judged. With peer memory on and off, every survivor must raise within the timeout + 5 s (or
// be stopped by this driver), no rank may report a wrong value, no rank may die of a signal it
// was not sent (heap corruption shows as SIGSEGV or SIGABRT), and no process may outlive the
// case. Every case is bounded: the driver kills everything it started at its deadline.
//
// The ranks are forked from this driver, which has libtorch loaded (it links it), and each
// loads the rank's code (fault_rank_body, with the library) itself once it has its environment:
// a fresh fault_rank program spent about 0.45 s of CPU loading libtorch and its CUDA libraries,
// most of a case's CPU, and the suite starts about 430 ranks. The library is not in this
// driver, because it reads variables when it loads (SHARDTENSOR_ARENA installs the shared arena).
#include <arpa/inet.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
constexpr double kTimeoutS = 3.0;  // the ranks' collective timeout
constexpr double kSlackS = 5.0;    // the bar: every survivor raises within timeout + 5 s

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

struct Case {
  int ranks = 3;
  std::string scenario = "none";
  int victim = 1;
  int seed = 0;
  bool peer_memory = true;
  bool arena = false;  // peer memory reading the peers' shared arenas in place (SHARDTENSOR_ARENA=1)
  double kill_after_s = -1;  // the driver SIGKILLs the victim this long after every rank formed its mesh
};

struct RankOutcome {
  std::string report;  // the first line the rank wrote ("" if none)
  std::string log_tail;  // the end of what it printed
  int signal = 0;      // the signal it died of, 0 if it exited
  int exit_code = -1;
};

// Starts the ranks, applies the driver's part of the fault, waits (bounded) and collects.
std::vector<RankOutcome> run_case(const Case& c) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("shardtensor_fault_" + std::to_string(getpid()) + "_" + std::to_string(free_port()));
  std::filesystem::create_directories(dir);
  const std::string port = std::to_string(free_port());
  std::vector<pid_t> pids;
  std::fflush(nullptr);  // nothing of the driver's buffered output may reach a rank's log
  for (int r = 0; r < c.ranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      setpgid(0, 0);
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(c.ranks).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(c.ranks).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", port.c_str(), 1);
      setenv("SHARDTENSOR_TIMEOUT_S", std::to_string(kTimeoutS).c_str(), 1);
      setenv("SHARDTENSOR_PEER_MEMORY", c.peer_memory ? "1" : "0", 1);
      setenv("SHARDTENSOR_ARENA", c.arena ? "1" : "0", 1);
      setenv("OMP_NUM_THREADS", "1", 1);
      // The rank's output goes to its log, shown when a case fails.
      const std::string log = (dir / ("rank" + std::to_string(r) + ".log")).string();
      if (FILE* f = std::fopen(log.c_str(), "w")) {
        dup2(fileno(f), 1);
        dup2(fileno(f), 2);
      }
      std::string program = "fault_rank", scenario = c.scenario, victim = std::to_string(c.victim), seed = std::to_string(c.seed),
                  report_dir = dir.string();
      char* argv[] = {program.data(), scenario.data(), victim.data(), seed.data(), report_dir.data(), nullptr};
      void* body = dlopen(FAULT_RANK_BODY_PATH, RTLD_NOW | RTLD_LOCAL);
      auto rank_main = body ? reinterpret_cast<int (*)(int, char**)>(dlsym(body, "shardtensor_fault_rank_main")) : nullptr;
      if (!rank_main) {
        std::fprintf(stderr, "cannot load %s: %s\n", FAULT_RANK_BODY_PATH, dlerror());
        _exit(127);
      }
      std::exit(rank_main(5, argv));  // as the program's main returns: the library's exit handlers run
    }
    pids.push_back(pid);
  }
  std::vector<RankOutcome> outcomes(c.ranks);
  std::vector<bool> done(c.ranks, false);
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration<double>(60.0);
  std::vector<Clock::time_point> stopped_at(c.ranks);
  std::vector<bool> stopped(c.ranks, false);
  bool killed = false;
  std::optional<Clock::time_point> all_ready;
  int remaining = c.ranks;
  while (remaining > 0 && Clock::now() < deadline) {
    if (!all_ready) {
      bool ready = true;
      for (int r = 0; r < c.ranks; ++r) ready = ready && std::filesystem::exists(dir / ("rank" + std::to_string(r) + ".ready"));
      if (ready) all_ready = Clock::now();
    }
    if (c.kill_after_s >= 0 && !killed && all_ready &&
        std::chrono::duration<double>(Clock::now() - *all_ready).count() >= c.kill_after_s) {
      kill(pids[c.victim], SIGKILL);
      killed = true;
    }
    for (int r = 0; r < c.ranks; ++r) {
      if (done[r]) continue;
      int status = 0;
      const pid_t got = waitpid(pids[r], &status, WNOHANG | WUNTRACED);
      if (got == pids[r] && WIFSTOPPED(status)) {
        stopped[r] = true;
        stopped_at[r] = Clock::now();
      } else if (got == pids[r]) {
        done[r] = true;
        --remaining;
        if (WIFSIGNALED(status)) outcomes[r].signal = WTERMSIG(status);
        if (WIFEXITED(status)) outcomes[r].exit_code = WEXITSTATUS(status);
      }
      // A stopped rank is resumed once the others must have timed out.
      if (stopped[r] && Clock::now() - stopped_at[r] > std::chrono::duration<double>(kTimeoutS + 3)) {
        kill(pids[r], SIGCONT);
        stopped[r] = false;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int r = 0; r < c.ranks; ++r) {
    if (done[r]) continue;
    ADD_FAILURE() << "rank " << r << " still ran 60 s after the start of " << c.scenario << ": killed";
    kill(-pids[r], SIGKILL);
    kill(pids[r], SIGKILL);
    waitpid(pids[r], nullptr, 0);
  }
  for (int r = 0; r < c.ranks; ++r) {
    std::ifstream in(dir / ("rank" + std::to_string(r)));
    std::getline(in, outcomes[r].report);
    std::ifstream log(dir / ("rank" + std::to_string(r) + ".log"));
    const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    outcomes[r].log_tail = text.substr(text.size() > 2000 ? text.size() - 2000 : 0);
    // No process of the rank's group may outlive it (threads of Gloo, forked helpers).
    EXPECT_NE(kill(-pids[r], 0), 0) << "rank " << r << " left a process behind";
  }
  std::filesystem::remove_all(dir);
  return outcomes;
}

std::string describe(const Case& c, const std::vector<RankOutcome>& outcomes) {
  std::ostringstream os;
  os << c.scenario << " (victim " << c.victim << ", seed " << c.seed << ", peer memory " << (c.peer_memory ? "on" : "off")
     << (c.arena ? ", shared arena" : "") << ")";
  for (size_t r = 0; r < outcomes.size(); ++r)
    os << "\n  rank " << r << ": exit " << outcomes[r].exit_code << " signal " << outcomes[r].signal << " report: " << outcomes[r].report
       << "\n  rank " << r << " printed (end):\n" << outcomes[r].log_tail;
  return os.str();
}

double raised_after(const RankOutcome& o) { return std::atof(o.report.c_str() + std::string("raised ").size()); }

// The judgement every case shares: no wrong value, no unexpected death, every survivor (and
// the victim where `victim_raises`) raised in time, and, if `expected` is given, at least one
// rank with it in its message. (A rank that agrees with one side of a disagreement may see the
// other side give up first: it then reports that a peer gave up, not both operations.)
void judge(const Case& c, bool victim_raises, const std::string& expected = "") {
  const std::vector<RankOutcome> outcomes = run_case(c);
  const std::string what = describe(c, outcomes);
  if (!expected.empty()) {
    bool named = false;
    for (const RankOutcome& o : outcomes) named = named || o.report.find(expected) != std::string::npos;
    EXPECT_TRUE(named) << "no rank's error says '" << expected << "': " << what;
  }
  for (int r = 0; r < c.ranks; ++r) {
    const RankOutcome& o = outcomes[r];
    EXPECT_NE(o.report.rfind("wrong", 0), 0u) << "WRONG VALUES: " << what;
    if (r == c.victim && !victim_raises) continue;
    EXPECT_EQ(o.signal, 0) << "rank " << r << " died of signal " << o.signal << ": " << what;
    EXPECT_EQ(o.exit_code, 0) << what;
    ASSERT_EQ(o.report.rfind("raised ", 0), 0u) << "rank " << r << " did not raise: " << what;
    EXPECT_LE(raised_after(o), kTimeoutS + kSlackS) << "rank " << r << " raised too late: " << what;
    // Ours, not a backend's raw text: the transports' errors, or mesh creation's when the
    // fault lands while the ranks are still forming the mesh.
    EXPECT_TRUE(o.report.find("shardtensor: ") != std::string::npos || o.report.find("DeviceMesh: ") != std::string::npos)
        << "rank " << r << " raised an error that is not ours: " << what;
  }
}

enum class Transport { PeerMemory, Arena, Messages };

class Faults : public ::testing::TestWithParam<Transport> {
 protected:
  // A case on this test's transport.
  static Case on_transport() {
    Case c;
    c.peer_memory = GetParam() != Transport::Messages;
    c.arena = GetParam() == Transport::Arena;
    return c;
  }
  static bool peer_memory() { return GetParam() != Transport::Messages; }
  // The transports' fault points this transport reaches, from `of` (a group that reads the
  // peers' arenas in place never writes into a peer: it has no write point).
  static std::vector<std::string> reached(std::vector<std::string> of) {
    if (GetParam() == Transport::Arena) of.erase(std::remove(of.begin(), of.end(), "peer_memory:write"), of.end());
    return of;
  }
};

TEST_P(Faults, BaselineIsCorrect) {
  Case c = on_transport();
  const auto outcomes = run_case(c);
  for (const RankOutcome& o : outcomes) EXPECT_EQ(o.report, "ok") << describe(c, outcomes);
}

// Not a fault: a rank that finished its last exchange and exits at once must not make a peer
// that has not yet read its "done" (from its memory, gone with it) raise.
TEST_P(Faults, RankExitingRightAfterItsLastExchangeFailsNoSlowerPeer) {
  Case c = on_transport();
  c.scenario = "lag_after_done";
  const auto outcomes = run_case(c);
  for (const RankOutcome& o : outcomes) EXPECT_EQ(o.report, "ok") << describe(c, outcomes);
}

// Kills land 0-1.5 s after every rank has formed its mesh, at random points of the rounds of
// exchanges (faults during start-up are the launcher's and mesh creation's tests).
TEST_P(Faults, RankKilledAtRandomTimes) {
  std::mt19937 random(20261124);
  for (int repetition = 0; repetition < 20; ++repetition) {
    Case c = on_transport();
    c.scenario = "run";
    c.victim = static_cast<int>(random() % 3);
    c.kill_after_s = 1.5 * std::uniform_real_distribution<double>(0, 1)(random);
    judge(c, false);
  }
}

TEST_P(Faults, RankKilledInsideAnExchange) {
  const std::vector<std::string> points =
      reached(peer_memory() ? std::vector<std::string>{"peer_memory:posted", "peer_memory:read", "peer_memory:write", "peer_memory:finish"}
                            : std::vector<std::string>{"messages:wait", "messages:checked"});
  for (int repetition = 0; repetition < 20; ++repetition) {
    Case c = on_transport();
    c.scenario = "kill_at:" + points[repetition % points.size()];
    c.victim = repetition % 3;
    c.seed = repetition;
    judge(c, false);
  }
}

TEST_P(Faults, RankStoppedPastTheTimeout) {
  for (const std::string& point : reached(peer_memory() ? std::vector<std::string>{"peer_memory:read", "peer_memory:write"}
                                                       : std::vector<std::string>{"messages:checked"})) {
    Case c = on_transport();
    c.scenario = std::string("stop_at:") + point;
    judge(c, true);
  }
}

TEST_P(Faults, RankLateThenEveryoneGoesOn) {
  // Late at a write: the victim resumes and writes into buffers whose owners gave up the
  // exchange and went on; they must have kept them (heap churn shows a write into freed memory).
  for (const std::string& point : reached(peer_memory() ? std::vector<std::string>{"peer_memory:posted", "peer_memory:read", "peer_memory:write"}
                                                       : std::vector<std::string>{"messages:wait", "messages:checked"})) {
    Case c = on_transport();
    c.scenario = std::string("late_at:") + point;
    c.victim = 2;
    judge(c, true);
  }
}

TEST_P(Faults, RankSkippingACollective) {
  Case c = on_transport();
  c.scenario = "skip";
  judge(c, true, "different collectives");
}

TEST_P(Faults, RankReorderingCollectivesOfTheSameSize) {
  Case c = on_transport();
  c.scenario = "reorder_same";
  judge(c, true, "different collectives");
}

TEST_P(Faults, RankReorderingCollectivesOfDifferentSizes) {
  Case c = on_transport();
  c.scenario = "reorder_sizes";
  c.victim = 0;
  judge(c, true, "different collectives");
}

INSTANTIATE_TEST_SUITE_P(Transports, Faults, ::testing::Values(Transport::PeerMemory, Transport::Arena, Transport::Messages),
                         [](const auto& info) {
                           return info.param == Transport::PeerMemory ? std::string("PeerMemory")
                                  : info.param == Transport::Arena    ? std::string("Arena")
                                                                      : std::string("Messages");
                         });

}  // namespace
