// Strict mode, implicit replication, the fallback record and the current-operator marker.
#include "dispatch/dispatch_state.h"

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/graph_task.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <set>

#include "shardtensor/dispatch.h"

namespace shardtensor {
namespace {

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && std::string(v) != "0" && std::string(v) != "";
}

std::atomic<bool>& strict_flag() {
  static std::atomic<bool> flag{env_flag("SHARDTENSOR_STRICT")};
  return flag;
}

std::atomic<bool>& implicit_replication_flag() {
  const char* v = std::getenv("SHARDTENSOR_IMPLICIT_REPLICATION");
  static std::atomic<bool> flag{!v || std::string(v) != "0"};
  return flag;
}

thread_local bool implicit_replication = false;

std::mutex records_mutex;
std::set<std::string>& fallbacks() {
  static std::set<std::string> names;
  return names;
}

}  // namespace

static thread_local FallbackRefusal* open_refusal = nullptr;

void set_strict(bool strict) { strict_flag() = strict; }
// A refusal counts as strict mode for the propagation cache too (propagation_key::seed), so that
// a propagation cached as a fallback is not reused without the refusal.
bool is_strict() { return open_refusal != nullptr || strict_flag(); }

FallbackRefusal::FallbackRefusal() : previous_(open_refusal) { open_refusal = this; }
FallbackRefusal::~FallbackRefusal() { open_refusal = previous_; }

void refuse_if_open(const std::string& op_name) {
  if (open_refusal) open_refusal->refused_ = op_name;
}

std::set<std::string>& propagated() {
  static std::set<std::string> names;
  return names;
}

void note_propagated(const std::string& op_name) {
  std::lock_guard<std::mutex> lock(records_mutex);
  propagated().insert(op_name);
}

std::vector<std::string> propagated_operators() {
  std::lock_guard<std::mutex> lock(records_mutex);
  return {propagated().begin(), propagated().end()};
}

std::vector<std::string> fallback_operators() {
  std::lock_guard<std::mutex> lock(records_mutex);
  return {fallbacks().begin(), fallbacks().end()};
}

void set_implicit_replication(bool enabled) { implicit_replication_flag() = enabled; }
bool is_implicit_replication() { return implicit_replication_flag(); }

ImplicitReplication::ImplicitReplication() : previous_(implicit_replication) { implicit_replication = true; }
ImplicitReplication::~ImplicitReplication() { implicit_replication = previous_; }

// Inside autograd's backward every plain tensor next to ShardTensors was made by libtorch's
// formulas from global sizes (split's backward fills unused pieces with at::zeros, sgn's
// gradient is a zero tensor), the same on every rank: a replicated value by construction.
bool implicit_replication_active() {
  return implicit_replication || implicit_replication_flag() ||
         torch::autograd::get_current_graph_task_exec_info() != nullptr;
}

bool log_enabled() {
  static const bool enabled = env_flag("SHARDTENSOR_LOG");
  return enabled;
}

void note_order_fallback(const std::string& op_name, const std::string& why) {
  refuse_if_open(op_name);
  TORCH_CHECK_NOT_IMPLEMENTED(!is_strict(), op_name, ": ", why, ", and strict mode is on (SHARDTENSOR_STRICT=1 or set_strict(true)), ",
                              "so its inputs are not put back in sequence order first. zigzag_unshard them yourself, or "
                              "compute on to_local() pieces.");
  static std::set<std::string>* warned = new std::set<std::string>;  // never destroyed: read until exit
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(records_mutex);
    first = warned->insert(op_name).second;
  }
  if (first)
    TORCH_WARN("shardtensor: ", op_name, ": ", why, "; its inputs split in zigzag order are put back in sequence order ",
               "first (one exchange each), and its outputs come out in order. Correct, but it moves them. (Warned once per ",
               "operator; SHARDTENSOR_STRICT=1 makes it an error.)");
}

void note_fallback(const std::string& op_name, const std::string& why) {
  refuse_if_open(op_name);
  TORCH_CHECK_NOT_IMPLEMENTED(!is_strict(), op_name, ": ", why, ", and strict mode is on (SHARDTENSOR_STRICT=1 or set_strict(true)), ",
              "so it does not fall back to gathering its inputs. Register a rule for '", op_name,
              "' with register_sharding_rule(), or compute on to_local() pieces.");
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(records_mutex);
    first = fallbacks().insert(op_name).second;
  }
  if (first)
    TORCH_WARN("shardtensor: ", op_name, ": ", why, "; falling back to gathering every input to Replicate, computing ",
               "on the whole tensor and returning Replicate outputs. Correct, but it moves whole tensors. ",
               "(Warned once per operator; SHARDTENSOR_STRICT=1 makes it an error.)");
}

}  // namespace shardtensor
