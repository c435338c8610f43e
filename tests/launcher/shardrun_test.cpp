// shardrun's contract: the torchrun environment, rank-prefixed output, and no hang: one failing
// rank or the timeout stops every rank and makes shardrun exit non-zero.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

struct RunResult {
  int exit_code = -1;
  std::string output;
  double seconds = 0;
};

RunResult run(const std::string& args) {
  const std::string command = std::string(SHARDRUN_PATH) + " " + args + " 2>&1";
  const auto start = std::chrono::steady_clock::now();
  FILE* pipe = popen(command.c_str(), "r");
  RunResult r;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) r.output.append(buffer, n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

std::string fresh_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("shardrun_test_" + name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
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
