// A stand-in rank program for shardrun's tests.
//   rank_behaviour env                        print the launcher variables and exit 0
//   rank_behaviour fail RANK CODE PIDDIR      RANK exits with CODE after 0.5 s; the others sleep 60 s
//   rank_behaviour hang PIDDIR                every rank sleeps 60 s
// Each rank of fail/hang writes its pid to PIDDIR/<rank>.pid so the test can check it was stopped.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

int main(int argc, char** argv) {
  const char* rank_env = std::getenv("RANK");
  const int rank = rank_env ? std::atoi(rank_env) : -1;
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "env") {
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS"})
      std::printf("%s=%s\n", name, std::getenv(name) ? std::getenv(name) : "(unset)");
    std::fprintf(stderr, "to stderr\n");
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
