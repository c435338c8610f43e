// shardrun: start N local ranks of a program, the way torchrun does, for tests, examples and
// benchmarks.
//
//   shardrun -n N [--timeout SECONDS] [--port PORT] [--] program [args...]
//
// Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR
// (127.0.0.1) and MASTER_PORT (a free port unless --port is given), and OMP_NUM_THREADS=1
// unless the caller set it, so that N ranks do not fight over the cores. Every line a rank
// prints comes out prefixed with "[rank R] " on the same stream (stdout or stderr).
// When a rank exits non-zero (or dies of a signal), or the timeout passes, shardrun stops the
// other ranks (SIGTERM to each rank's process group, SIGKILL after a grace period) and exits
// non-zero: the failing rank's status, or 124 on timeout. It exits 0 when every rank does.
// SIGINT, SIGTERM or SIGHUP to shardrun stops the ranks the same way; it then exits 128 + the
// signal's number. A shardrun that is killed outright (SIGKILL) takes its ranks with it: each
// rank is started with PR_SET_PDEATHSIG. Ranks start with the signal dispositions and mask
// shardrun was given, except SIGPIPE, which is always the default (prepare_rank_process).
//
// Every rank of one launch also gets SHARDTENSOR_JOB_ID, random per launch: the library
// compares it with rank 0's when it forms the world group, so that a process of another job
// that reaches this job's MASTER_PORT is refused (see Note [Job identity] in
// src/comm/c10d_mesh.cpp).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int kTimeoutExitCode = 124;
constexpr auto kGracePeriod = std::chrono::seconds(5);

struct Options {
  int num_ranks = 0;
  double timeout_s = 0;  // 0: none
  int port = 0;          // 0: pick a free one
  std::vector<char*> command;
};

void usage_and_exit(const char* message) {
  std::fprintf(stderr,
               "shardrun: %s\n"
               "usage: shardrun -n N [--timeout SECONDS] [--port PORT] [--] program [args...]\n",
               message);
  std::exit(2);
}

Options parse_options(int argc, char** argv) {
  Options o;
  int i = 1;
  auto value = [&](const char* flag) -> const char* {
    if (i + 1 >= argc) usage_and_exit((std::string(flag) + " needs a value").c_str());
    return argv[++i];
  };
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-n" || arg == "--nproc" || arg == "--nproc-per-node") {
      o.num_ranks = std::atoi(value(argv[i]));
    } else if (arg == "--timeout") {
      o.timeout_s = std::atof(value(argv[i]));
    } else if (arg == "--port") {
      o.port = std::atoi(value(argv[i]));
    } else if (arg == "--") {
      ++i;
      break;
    } else if (!arg.empty() && arg[0] == '-') {
      usage_and_exit(("unknown option " + arg).c_str());
    } else {
      break;
    }
  }
  for (; i < argc; ++i) o.command.push_back(argv[i]);
  o.command.push_back(nullptr);
  if (o.num_ranks < 1) usage_and_exit("-n must be a positive number of ranks");
  if (o.timeout_s < 0) usage_and_exit("--timeout must be >= 0");
  if (o.command.size() < 2) usage_and_exit("no program given");
  return o;
}

// A free port, held for the whole job: the socket stays bound (never listening) with
// SO_REUSEADDR, so rank 0's store, which sets SO_REUSEADDR too, can bind the port, while a
// program that asks the kernel for a free port meanwhile is never given this one (a port that
// was only free a moment ago could be taken before rank 0 binds it; with other jobs on the
// machine, it was). Closed when shardrun exits; not inherited by the ranks.
int reserve_free_port() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int on = 1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on)) != 0 ||
      bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::perror("shardrun: finding a free port");
    std::exit(2);
  }
  return ntohs(addr.sin_port);  // fd stays open until exit
}

// One output stream of one rank: bytes in, whole prefixed lines out.
struct Stream {
  int fd = -1;
  FILE* sink = nullptr;
  std::string pending;
};

struct Rank {
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  Stream out, err;
};

void emit_lines(Stream& s, int rank, bool flush_partial) {
  size_t start = 0;
  for (size_t nl; (nl = s.pending.find('\n', start)) != std::string::npos; start = nl + 1)
    std::fprintf(s.sink, "[rank %d] %.*s\n", rank, static_cast<int>(nl - start), s.pending.data() + start);
  s.pending.erase(0, start);
  if (flush_partial && !s.pending.empty()) {
    std::fprintf(s.sink, "[rank %d] %s\n", rank, s.pending.c_str());
    s.pending.clear();
  }
  std::fflush(s.sink);
}

// The signals that make shardrun stop its ranks and exit (128 + the signal).
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP};

volatile sig_atomic_t g_stop_signal = 0;  // the stop signal received, 0 while none
void on_stop_signal(int sig) { g_stop_signal = sig; }

// What shardrun changed about signals for itself, so that each rank can be given back what
// shardrun was given.
struct LauncherSignals {
  sigset_t stop_signals;    // blocked around fork(), see spawn()
  sigset_t inherited_mask;  // the mask shardrun started with
};

// Handlers for the stop signals, and SIGPIPE ignored: a reader of shardrun's output that goes
// away must not kill it while it still has ranks to stop. A stop signal that shardrun's own
// parent ignores (SIGHUP under nohup) stays ignored, for shardrun and its ranks.
LauncherSignals install_signal_handlers() {
  LauncherSignals s;
  sigprocmask(SIG_SETMASK, nullptr, &s.inherited_mask);
  sigemptyset(&s.stop_signals);
  for (int sig : kStopSignals) {
    struct sigaction current {};
    sigaction(sig, nullptr, &current);
    if (current.sa_handler == SIG_IGN) continue;
    signal(sig, on_stop_signal);
    sigaddset(&s.stop_signals, sig);
  }
  signal(SIGPIPE, SIG_IGN);
  return s;
}

// 128 random bits in hex: SHARDTENSOR_JOB_ID, which tells this launch's ranks from any other's.
std::string random_job_id() {
  std::random_device device;
  char text[33];
  std::snprintf(text, sizeof(text), "%08x%08x%08x%08x", static_cast<unsigned>(device()),
                static_cast<unsigned>(device()), static_cast<unsigned>(device()), static_cast<unsigned>(device()));
  return text;
}

// Runs in the forked child, before exec: undoes what shardrun changed about signals and ties
// the rank's life to shardrun's.
void prepare_rank_process(const LauncherSignals& signals, pid_t launcher) {
  // exec() would reset the handlers anyway, but a stop signal that is pending now (blocked
  // around fork) must find the default action, which ends the rank, not shardrun's handler.
  for (int sig : kStopSignals)
    if (sigismember(&signals.stop_signals, sig)) signal(sig, SIG_DFL);
  // An ignored disposition survives exec(): without this, a rank writing to a pipe whose
  // reader died would get EPIPE errors forever instead of the default death by SIGPIPE.
  signal(SIGPIPE, SIG_DFL);
  sigprocmask(SIG_SETMASK, &signals.inherited_mask, nullptr);
  // Die with the launcher, however it ends (SIGKILL included, where it cannot stop its ranks
  // itself). The kernel sends this when the parent *thread* exits; shardrun is
  // single-threaded, so that is when shardrun exits. It applies to the rank process, not to
  // processes the rank starts itself. If shardrun died between fork() and prctl(), the signal
  // will never come: the parent is already another process, so stop at once.
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
    std::perror("shardrun: prctl(PR_SET_PDEATHSIG)");
    _exit(127);
  }
  if (getppid() != launcher) _exit(127);
}

pid_t spawn(const Options& o, int rank, int port, const std::string& job_id, const LauncherSignals& signals,
            Rank& r) {
  int out_pipe[2], err_pipe[2];
  if (pipe(out_pipe) != 0 || pipe(err_pipe) != 0) {
    std::perror("shardrun: pipe");
    std::exit(2);
  }
  const pid_t launcher = getpid();
  // Stop signals wait until the child has reset its handlers (prepare_rank_process) and the
  // parent has recorded the child; delivered in between, shardrun's handler would run in the
  // child, which never reads the flag it sets.
  sigset_t mask_before_fork;
  sigprocmask(SIG_BLOCK, &signals.stop_signals, &mask_before_fork);
  pid_t pid = fork();
  if (pid < 0) {
    std::perror("shardrun: fork");
    std::exit(2);
  }
  if (pid == 0) {
    prepare_rank_process(signals, launcher);
    setpgid(0, 0);  // its own process group, so stopping it also stops what it started
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    close(out_pipe[0]);
    close(out_pipe[1]);
    close(err_pipe[0]);
    close(err_pipe[1]);
    setenv("RANK", std::to_string(rank).c_str(), 1);
    setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
    setenv("WORLD_SIZE", std::to_string(o.num_ranks).c_str(), 1);
    setenv("LOCAL_WORLD_SIZE", std::to_string(o.num_ranks).c_str(), 1);
    setenv("GROUP_RANK", "0", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    setenv("OMP_NUM_THREADS", "1", /*overwrite=*/0);
    setenv("SHARDTENSOR_JOB_ID", job_id.c_str(), /*overwrite=*/1);  // a new job, even inside another
    execvp(o.command[0], o.command.data());
    std::fprintf(stderr, "shardrun: cannot run %s: %s\n", o.command[0], std::strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid);
  sigprocmask(SIG_SETMASK, &mask_before_fork, nullptr);
  close(out_pipe[1]);
  close(err_pipe[1]);
  r.pid = pid;
  r.running = true;
  r.out = {out_pipe[0], stdout, {}};
  r.err = {err_pipe[0], stderr, {}};
  return pid;
}

void signal_all(std::vector<Rank>& ranks, int sig) {
  for (Rank& r : ranks)
    if (r.running) kill(-r.pid, sig);
}

// Reads whatever the ranks printed, for at most `wait_ms`.
void pump_output(std::vector<Rank>& ranks, int wait_ms) {
  std::vector<pollfd> fds;
  std::vector<std::pair<int, Stream*>> owners;
  for (size_t i = 0; i < ranks.size(); ++i) {
    for (Stream* s : {&ranks[i].out, &ranks[i].err}) {
      if (s->fd < 0) continue;
      fds.push_back({s->fd, POLLIN, 0});
      owners.push_back({static_cast<int>(i), s});
    }
  }
  if (fds.empty()) {
    if (wait_ms > 0) usleep(static_cast<useconds_t>(wait_ms) * 1000);
    return;
  }
  if (poll(fds.data(), fds.size(), wait_ms) <= 0) return;
  char buffer[65536];
  for (size_t k = 0; k < fds.size(); ++k) {
    if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    Stream& s = *owners[k].second;
    ssize_t n = read(s.fd, buffer, sizeof(buffer));
    if (n > 0) {
      s.pending.append(buffer, static_cast<size_t>(n));
      emit_lines(s, owners[k].first, /*flush_partial=*/false);
    } else {
      emit_lines(s, owners[k].first, /*flush_partial=*/true);
      close(s.fd);
      s.fd = -1;
    }
  }
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_options(argc, argv);
  const int port = o.port > 0 ? o.port : reserve_free_port();
  const LauncherSignals signals = install_signal_handlers();
  const std::string job_id = random_job_id();

  std::vector<Rank> ranks(static_cast<size_t>(o.num_ranks));
  for (int r = 0; r < o.num_ranks; ++r) spawn(o, r, port, job_id, signals, ranks[r]);

  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  int result = 0;
  bool stopping = false;
  Clock::time_point stop_started;
  int running = o.num_ranks;

  auto begin_stop = [&](int code, const std::string& why) {
    if (stopping) return;
    stopping = true;
    result = code;
    stop_started = Clock::now();
    std::fprintf(stderr, "[shardrun] %s; stopping the ranks still running\n", why.c_str());
    signal_all(ranks, SIGTERM);
  };

  while (running > 0 || std::any_of(ranks.begin(), ranks.end(), [](const Rank& r) { return r.out.fd >= 0 || r.err.fd >= 0; })) {
    pump_output(ranks, 100);
    for (int i = 0; i < o.num_ranks; ++i) {
      Rank& r = ranks[i];
      if (!r.running) continue;
      if (waitpid(r.pid, &r.status, WNOHANG) != r.pid) continue;
      r.running = false;
      --running;
      kill(-r.pid, SIGKILL);  // anything the rank left behind in its group
      const int code = exit_code_of(r.status);
      if (code != 0 && !stopping) {
        begin_stop(code, "rank " + std::to_string(i) + (WIFSIGNALED(r.status) ? " was killed by signal " + std::to_string(WTERMSIG(r.status))
                                                                             : " exited with code " + std::to_string(code)));
      }
    }
    if (const int sig = g_stop_signal; sig != 0 && !stopping)
      begin_stop(128 + sig, std::string("received ") + strsignal(sig));
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if (o.timeout_s > 0 && elapsed > o.timeout_s && !stopping && running > 0) {
      char why[128];
      std::snprintf(why, sizeof(why), "timeout: %d rank(s) still running after %.0f s", running, o.timeout_s);
      begin_stop(kTimeoutExitCode, why);
    }
    if (stopping && running > 0 && Clock::now() - stop_started > kGracePeriod) {
      signal_all(ranks, SIGKILL);
    }
    // A rank's children may keep its pipes open after it exits; do not wait for them forever.
    if (running == 0 && stopping && Clock::now() - stop_started > kGracePeriod + std::chrono::seconds(1)) break;
  }
  return result;
}
