// A stand-in rank program for shardrun's tests.
//   rank_behaviour env                        print the launcher variables and exit 0
//   rank_behaviour fail RANK CODE PIDDIR      RANK exits with CODE after 0.5 s; the others sleep 60 s
//   rank_behaviour hang PIDDIR                every rank sleeps 60 s
//   rank_behaviour signals                    print how the rank starts: the SIGPIPE, SIGINT,
//                                             SIGTERM and SIGHUP dispositions, the blocked
//                                             signals and the parent-death signal
//   rank_behaviour as-job RANK JOB program... every rank runs program; RANK with
//                                             SHARDTENSOR_JOB_ID=JOB, as if of another job
//   rank_behaviour only RANK program...       RANK runs program; the others sleep 60 s
//   rank_behaviour port                       print how MASTER_PORT binds: "plain=<errno name>"
//                                             for a socket without SO_REUSEADDR (another
//                                             program), "store=ok|<errno name>" for one with it,
//                                             listening on every address (as rank 0's store)
// Each rank of fail/hang writes its pid to PIDDIR/<rank>.pid so the test can check it was stopped.
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>

namespace {

const char* disposition(int sig) {
  struct sigaction current {};
  sigaction(sig, nullptr, &current);
  return current.sa_handler == SIG_DFL ? "default" : current.sa_handler == SIG_IGN ? "ignored" : "handled";
}

int print_signal_state() {
  for (auto [sig, name] : {std::pair{SIGPIPE, "SIGPIPE"}, {SIGINT, "SIGINT"}, {SIGTERM, "SIGTERM"}, {SIGHUP, "SIGHUP"}})
    std::printf("%s=%s\n", name, disposition(sig));
  sigset_t blocked;
  sigprocmask(SIG_SETMASK, nullptr, &blocked);
  std::string names;
  for (int sig = 1; sig < NSIG; ++sig)
    if (sigismember(&blocked, sig) == 1) names += (names.empty() ? "" : ",") + std::to_string(sig);
  std::printf("blocked=%s\n", names.empty() ? "none" : names.c_str());
  int death_signal = 0;
  prctl(PR_GET_PDEATHSIG, &death_signal);
  std::printf("pdeathsig=%d\n", death_signal);
  return 0;
}

// "ok", or the name of the error that binding (and listening on) the port gave.
std::string bind_result(int port, bool reuse_address) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const int on = 1;
  if (reuse_address) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && listen(fd, 1) == 0;
  const std::string result = ok ? "ok" : errno == EADDRINUSE ? "EADDRINUSE" : std::strerror(errno);
  close(fd);
  return result;
}

int run(char** command) {
  execvp(command[0], command);
  std::fprintf(stderr, "rank_behaviour: cannot run %s: %s\n", command[0], std::strerror(errno));
  return 127;
}

}  // namespace

int main(int argc, char** argv) {
  const char* rank_env = std::getenv("RANK");
  const int rank = rank_env ? std::atoi(rank_env) : -1;
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "env") {
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS",
                             "SHARDTENSOR_JOB_ID"})
      std::printf("%s=%s\n", name, std::getenv(name) ? std::getenv(name) : "(unset)");
    std::fprintf(stderr, "to stderr\n");
    return 0;
  }
  if (mode == "signals") return print_signal_state();
  if (mode == "port") {
    const int port = std::atoi(std::getenv("MASTER_PORT") ? std::getenv("MASTER_PORT") : "0");
    std::printf("plain=%s\nstore=%s\n", bind_result(port, false).c_str(), bind_result(port, true).c_str());
    return 0;
  }
  if ((mode == "as-job" && argc > 4) || (mode == "only" && argc > 3)) {
    const bool chosen = rank == std::atoi(argv[2]);
    if (mode == "as-job") {
      if (chosen) setenv("SHARDTENSOR_JOB_ID", argv[3], /*overwrite=*/1);
      return run(argv + 4);
    }
    if (chosen) return run(argv + 3);
    sleep(60);
    return 0;
  }
  const std::string pid_dir = mode == "fail" && argc > 4 ? argv[4] : mode == "hang" && argc > 2 ? argv[2] : "";
  if (pid_dir.empty()) {
    std::fprintf(stderr, "rank_behaviour: bad arguments\n");
    return 2;
  }
  std::ofstream(pid_dir + "/" + std::to_string(rank) + ".pid") << getpid() << "\n";
  if (mode == "fail" && rank == std::atoi(argv[2])) {
    usleep(500000);
    std::printf("rank %d failing on purpose\n", rank);
    return std::atoi(argv[3]);
  }
  sleep(60);
  return 0;
}
