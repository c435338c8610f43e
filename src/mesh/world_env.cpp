// Parses the launcher's environment once per process. See world_env.h.
#include "mesh/world_env.h"

#include <c10/util/Exception.h>

#include <cstdlib>

#include "shardtensor/device_mesh.h"

namespace shardtensor {
namespace {

const char* first_set(std::initializer_list<const char*> names, const char** which) {
  for (const char* name : names) {
    if (const char* v = std::getenv(name)) {
      *which = name;
      return v;
    }
  }
  return nullptr;
}

int64_t parse_int(const char* name, const char* text) {
  char* end = nullptr;
  long long v = std::strtoll(text, &end, 10);
  TORCH_CHECK(end != text && *end == '\0', "shardtensor: environment variable ", name, "='", text,
              "' is not an integer.");
  return v;
}

WorldEnv read_world_env() {
  WorldEnv env;
  const char* which = nullptr;
  if (const char* r = first_set({"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}, &which)) {
    env.rank = parse_int(which, r);
    env.launched = true;
  }
  if (const char* s = first_set({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}, &which)) {
    env.world_size = parse_int(which, s);
  }
  if (const char* l = first_set({"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}, &which)) {
    env.local_rank = parse_int(which, l);
  }
  if (const char* a = std::getenv("MASTER_ADDR")) env.master_addr = a;
  if (const char* p = std::getenv("MASTER_PORT")) env.master_port = static_cast<int>(parse_int("MASTER_PORT", p));
  TORCH_CHECK(env.world_size >= 1, "shardtensor: world size must be >= 1, got ", env.world_size, ".");
  TORCH_CHECK(env.rank >= 0 && env.rank < env.world_size, "shardtensor: rank ", env.rank,
              " is out of range for world size ", env.world_size, ".");
  return env;
}

}  // namespace

const WorldEnv& world_env() {
  static const WorldEnv env = read_world_env();
  return env;
}

int64_t world_rank() { return world_env().rank; }
int64_t world_size() { return world_env().world_size; }

}  // namespace shardtensor
