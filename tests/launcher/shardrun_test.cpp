// shardrun's contract: the torchrun environment, rank-prefixed output, and no hang: one failing
// rank, the timeout or a stop signal stops every rank and makes shardrun exit non-zero, and a
// killed shardrun takes its ranks with it. Also the job identity that shardrun hands its ranks:
// a process of another job that reaches a job's store is refused with a clear error (this
// part runs dist_tests, built beside this binary, as the program that creates a mesh).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../support/run_command.h"

namespace {

using Clock = std::chrono::steady_clock;

using shardtensor::testing::RunResult;

// `env` is a list of NAME=VALUE words put before the command.
RunResult run(const std::string& args, const std::string& env = "") {
  return shardtensor::testing::run_command((env.empty() ? "" : "env " + env + " ") + SHARDRUN_PATH + " " + args + " 2>&1");
}

// The directories the tests made, removed when the test program ends.
struct MadeDirs {
  std::vector<std::filesystem::path> dirs;
  ~MadeDirs() {
    for (const auto& d : dirs) {
      std::error_code ignored;
      std::filesystem::remove_all(d, ignored);
    }
  }
};

std::string fresh_dir(const std::string& name) {
  static MadeDirs made;
  auto dir = std::filesystem::temp_directory_path() / ("shardrun_test_" + name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  made.dirs.push_back(dir);
  return dir.string();
}

// Every rank that wrote a pid file must be gone (reaped by shardrun, so kill(pid, 0) fails).
void expect_all_stopped(const std::string& dir, int ranks) {
  for (int r = 0; r < ranks; ++r) {
    std::ifstream in(dir + "/" + std::to_string(r) + ".pid");
    pid_t pid = 0;
    ASSERT_TRUE(in >> pid) << "rank " << r << " wrote no pid";
    EXPECT_NE(kill(pid, 0), 0) << "rank " << r << " (pid " << pid << ") is still running";
  }
}

// shardrun in the background, its output in `log`; the pid is shardrun's own (sh execs it).
// The test's own signal dispositions are not passed on: shardrun must handle the stop
// signals itself, whatever the test runner ignores.
pid_t start_shardrun(const std::string& args, const std::string& log, const std::string& env = "") {
  const std::string command = "exec env " + env + " " + SHARDRUN_PATH + " " + args + " >" + log + " 2>&1";
  const pid_t pid = fork();
  if (pid == 0) {
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) signal(sig, SIG_DFL);
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// The exit status of our child `pid`, or -1 if it runs past `seconds` (it is then killed).
int wait_for_exit(pid_t pid, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return status;
}

// The pids the ranks wrote to dir/<rank>.pid, once all of them have (empty after 10 s).
std::vector<pid_t> wait_for_rank_pids(const std::string& dir, int ranks) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < deadline) {
    std::vector<pid_t> pids;
    for (int r = 0; r < ranks; ++r) {
      std::ifstream in(dir + "/" + std::to_string(r) + ".pid");
      pid_t pid = 0;
      if (in >> pid) pids.push_back(pid);
    }
    if (static_cast<int>(pids.size()) == ranks) return pids;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return {};
}

// Gone, or a zombie that only waits for init to reap it: either way it runs no more. The
// ranks of a killed shardrun are not our children, so they are not ours to reap.
bool process_gone(pid_t pid) {
  if (kill(pid, 0) != 0) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const size_t name_end = line.rfind(')');
  return name_end == std::string::npos || line.substr(name_end + 2, 1) == "Z";
}

bool all_gone_within(const std::vector<pid_t>& pids, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    bool gone = true;
    for (pid_t pid : pids) gone = gone && process_gone(pid);
    if (gone) return true;
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The values of `NAME=` in the lines of `output`, in order.
std::vector<std::string> values_of(const std::string& output, const std::string& name) {
  std::vector<std::string> values;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    const size_t at = line.find("] " + name + "=");
    if (at != std::string::npos) values.push_back(line.substr(at + name.size() + 3));
  }
  return values;
}

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

bool listening_within(int port, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < deadline) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const bool up = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    if (up) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// A program that creates meshes: one test of dist_tests (a build dependency of this binary).
std::string mesh_program() { return std::string(DIST_TESTS_PATH) + " --gtest_filter=DistMesh.EveryMeshDimGroupIsTheSliceThroughThisRank"; }

bool have_mesh_program() { return std::filesystem::exists(DIST_TESTS_PATH); }

constexpr double kMeshTimeoutS = 20;  // SHARDTENSOR_TIMEOUT_S of the job-identity tests
const std::string kMeshEnv = "SHARDTENSOR_TIMEOUT_S=20";

}  // namespace

TEST(Shardrun, GivesEveryRankTheTorchrunEnvironmentAndPrefixesItsLines) {
  RunResult r = run("-n 3 " RANK_BEHAVIOUR_PATH " env");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string prefix = "[rank " + std::to_string(rank) + "] ";
    EXPECT_NE(r.output.find(prefix + "RANK=" + std::to_string(rank) + "\n"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(prefix + "LOCAL_RANK=" + std::to_string(rank)), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(prefix + "WORLD_SIZE=3"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(prefix + "MASTER_ADDR=127.0.0.1"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(prefix + "OMP_NUM_THREADS=1"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(prefix + "to stderr"), std::string::npos) << r.output;
  }
  EXPECT_EQ(r.output.find("MASTER_PORT=(unset)"), std::string::npos) << r.output;
}

// The port shardrun picks stays held for the whole job: another program cannot bind it between
// the pick and rank 0's store (with other jobs on the machine, one did), and the store, which
// binds with SO_REUSEADDR, still can.
TEST(Shardrun, HoldsTheStorePortForTheJobAndLetsTheStoreBindIt) {
  RunResult r = run("-n 1 " RANK_BEHAVIOUR_PATH " port");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 0] plain=EADDRINUSE\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 0] store=ok\n"), std::string::npos) << r.output;
}

TEST(Shardrun, OneFailingRankStopsTheOthersAndSetsTheExitCode) {
  const std::string dir = fresh_dir("fail");
  RunResult r = run("-n 3 " RANK_BEHAVIOUR_PATH " fail 1 7 " + dir);
  EXPECT_EQ(r.exit_code, 7) << r.output;
  EXPECT_LT(r.seconds, 20.0) << "the sleeping ranks were not stopped";
  EXPECT_NE(r.output.find("[rank 1] rank 1 failing on purpose"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1 exited with code 7"), std::string::npos) << r.output;
  expect_all_stopped(dir, 3);
}

TEST(Shardrun, TimeoutStopsEveryRankAndExitsNonZero) {
  const std::string dir = fresh_dir("hang");
  RunResult r = run("-n 2 --timeout 2 " RANK_BEHAVIOUR_PATH " hang " + dir);
  EXPECT_EQ(r.exit_code, 124) << r.output;
  EXPECT_GE(r.seconds, 2.0);
  EXPECT_LT(r.seconds, 20.0);
  EXPECT_NE(r.output.find("timeout"), std::string::npos) << r.output;
  expect_all_stopped(dir, 2);
}

TEST(Shardrun, RejectsBadUsage) {
  EXPECT_EQ(run("-n 0 true").exit_code, 2);
  EXPECT_EQ(run("-n 2").exit_code, 2);
  EXPECT_EQ(run("--bogus -n 2 true").exit_code, 2);
  RunResult missing = run("-n 2 /nonexistent/program");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("cannot run /nonexistent/program"), std::string::npos) << missing.output;
}

TEST(Shardrun, EveryLaunchIsANewJobThatAllItsRanksShare) {
  RunResult first = run("-n 3 " RANK_BEHAVIOUR_PATH " env");
  RunResult second = run("-n 3 " RANK_BEHAVIOUR_PATH " env");
  const std::vector<std::string> ids = values_of(first.output, "SHARDTENSOR_JOB_ID");
  ASSERT_EQ(ids.size(), 3u) << first.output;
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), 1u) << first.output;
  EXPECT_EQ(ids[0].size(), 32u) << ids[0];
  const std::vector<std::string> next = values_of(second.output, "SHARDTENSOR_JOB_ID");
  ASSERT_FALSE(next.empty()) << second.output;
  EXPECT_NE(next[0], ids[0]);
}

TEST(Shardrun, RanksStartWithDefaultSignalsAndDieWithTheLauncher) {
  RunResult r = run("-n 2 " RANK_BEHAVIOUR_PATH " signals");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string prefix = "[rank " + std::to_string(rank) + "] ";
    for (const char* line : {"SIGPIPE=default", "SIGINT=default", "SIGTERM=default", "SIGHUP=default",
                             "blocked=none", "pdeathsig=9"})
      EXPECT_NE(r.output.find(prefix + line + "\n"), std::string::npos) << line << "\n" << r.output;
  }
}

TEST(Shardrun, KilledLauncherTakesItsRanksWithIt) {
  const std::string dir = fresh_dir("killed");
  const pid_t launcher = start_shardrun("-n 2 " RANK_BEHAVIOUR_PATH " hang " + dir, dir + "/log");
  const std::vector<pid_t> ranks = wait_for_rank_pids(dir, 2);
  ASSERT_EQ(ranks.size(), 2u) << read_file(dir + "/log");
  kill(launcher, SIGKILL);
  waitpid(launcher, nullptr, 0);
  EXPECT_TRUE(all_gone_within(ranks, 5.0)) << "ranks " << ranks[0] << " and " << ranks[1]
                                           << " outlived their killed launcher";
  for (pid_t pid : ranks)
    if (!process_gone(pid)) kill(pid, SIGKILL);  // leave nothing behind if the check failed
}

TEST(Shardrun, StopSignalStopsEveryRankAndExitsWith128PlusTheSignal) {
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    SCOPED_TRACE(strsignal(sig));
    const std::string dir = fresh_dir("signal" + std::to_string(sig));
    const pid_t launcher = start_shardrun("-n 2 " RANK_BEHAVIOUR_PATH " hang " + dir, dir + "/log");
    ASSERT_EQ(wait_for_rank_pids(dir, 2).size(), 2u) << read_file(dir + "/log");
    kill(launcher, sig);
    const int status = wait_for_exit(launcher, 15.0);
    ASSERT_NE(status, -1) << "shardrun did not exit after the signal";
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 128 + sig) << "status " << status;
    EXPECT_NE(read_file(dir + "/log").find("stopping the ranks"), std::string::npos) << read_file(dir + "/log");
    expect_all_stopped(dir, 2);
  }
}

TEST(JobIdentity, ARankOfAnotherJobIsRefusedWithAClearErrorAndNoHang) {
  ASSERT_TRUE(have_mesh_program()) << "build the dist_tests target: " << mesh_program();
  RunResult r = run("-n 2 " RANK_BEHAVIOUR_PATH " as-job 1 someone-elses-job " + mesh_program(), kMeshEnv);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(r.seconds, kMeshTimeoutS + 5) << r.output;
  EXPECT_NE(r.output.find("job 'someone-elses-job') reached the rendezvous store"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("a second job on the same MASTER_ADDR:MASTER_PORT"), std::string::npos) << r.output;
}

// The real mix-up: job A holds a port (its rank 0 serves the store and waits for rank 1);
// job B is started on the same port. B's rank 0 cannot serve the store, B's rank 1 reaches A's
// store; both raise, saying why, well within the timeout.
TEST(JobIdentity, ASecondJobOnTheSamePortFailsWithAClearErrorOnEveryRank) {
  ASSERT_TRUE(have_mesh_program()) << "build the dist_tests target: " << mesh_program();
  const std::string dir = fresh_dir("second_job");
  const int port = free_port();
  const std::string on_port = "-n 2 --port " + std::to_string(port) + " " RANK_BEHAVIOUR_PATH " only ";
  const pid_t first_job = start_shardrun(on_port + "0 " + mesh_program(), dir + "/first_job.log", kMeshEnv);
  ASSERT_TRUE(listening_within(port, 20.0)) << read_file(dir + "/first_job.log");

  RunResult second_rank1 = run(on_port + "1 " + mesh_program(), kMeshEnv);
  EXPECT_NE(second_rank1.exit_code, 0) << second_rank1.output;
  EXPECT_LT(second_rank1.seconds, kMeshTimeoutS + 5) << second_rank1.output;
  EXPECT_NE(second_rank1.output.find("reached the rendezvous store at 127.0.0.1:" + std::to_string(port) +
                                     ", which belongs to job"),
            std::string::npos)
      << second_rank1.output;

  RunResult second_rank0 = run(on_port + "0 " + mesh_program(), kMeshEnv);
  EXPECT_NE(second_rank0.exit_code, 0) << second_rank0.output;
  EXPECT_LT(second_rank0.seconds, kMeshTimeoutS + 5) << second_rank0.output;
  EXPECT_NE(second_rank0.output.find("could not serve the rendezvous store"), std::string::npos) << second_rank0.output;
  EXPECT_NE(second_rank0.output.find("a second job on the same MASTER_ADDR:MASTER_PORT"), std::string::npos)
      << second_rank0.output;

  kill(first_job, SIGTERM);
  EXPECT_NE(wait_for_exit(first_job, 15.0), -1) << "the first job did not stop";
}
