/* Preloaded (LD_PRELOAD) into a process that may crash, on the GPU machine, which has no gdb:
 * on SIGSEGV, SIGBUS, SIGILL, SIGFPE or SIGABRT it writes the faulting address and the native
 * stack (glibc's backtrace, one frame per line as "module(symbol+offset) [address]") to stderr,
 * then lets the signal take its default course, so the exit status is the crash's. run.sh
 * compiles it there with cc and demangles the frames with c++filt. */
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void on_fault(int signal_number, siginfo_t* info, void* context) {
  (void)context;
  char line[128];
  int length = snprintf(line, sizeof line, "fault_stack: signal %d at address %p; native stack:\n", signal_number,
                        info ? info->si_addr : NULL);
  if (write(2, line, (size_t)length) < 0) {}
  void* frames[96];
  int count = backtrace(frames, 96);
  backtrace_symbols_fd(frames, count, 2);
  /* SA_RESETHAND restored the default action: raising again ends the process as the fault would. */
  raise(signal_number);
}

__attribute__((constructor)) static void install_fault_stack(void) {
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_sigaction = on_fault;
  action.sa_flags = SA_SIGINFO | SA_RESETHAND | SA_NODEFER;
  const int signals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
  for (size_t i = 0; i < sizeof signals / sizeof signals[0]; ++i) sigaction(signals[i], &action, NULL);
}
