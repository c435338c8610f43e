// Runs a shell command to completion and keeps what it printed (stdout and stderr, if the
// command redirects 2>&1), its exit code and how long it took: how the launcher and checkpoint
// tests drive shardrun as a user would. Header-only, so test programs that do not link the
// test support library can use it.
#pragma once

#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace shardtensor::testing {

struct RunResult {
  int exit_code = -1;  // -1: killed by a signal
  std::string output;
  double seconds = 0;
};

inline RunResult run_command(const std::string& command) {
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

}  // namespace shardtensor::testing
