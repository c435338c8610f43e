// Process- and thread-wide switches of the dispatch layer (strict mode, implicit replication,
// logging) and the record of operators that fell back. Public setters: shardtensor/dispatch.h.
#pragma once

#include <string>

namespace shardtensor {

class FallbackRefusal;
void refuse_if_open(const std::string& op_name);  // names op_name in this thread's open FallbackRefusal

// The process-wide setting, an ImplicitReplication scope, or autograd's backward on this thread.
bool implicit_replication_active();
bool log_enabled();  // SHARDTENSOR_LOG=1

// Records that `op_name` ran through its sharding rule (coverage reports).
void note_propagated(const std::string& op_name);

// Records a fallback; warns the first time for each operator. Raises in strict mode.
void note_fallback(const std::string& op_name, const std::string& why);
// The same for an operator whose zigzag inputs are put back in order first (`why` says why).
void note_order_fallback(const std::string& op_name, const std::string& why);

// Open on this thread while torch.compile traces one operator (python/shardtensor/_traceable.py):
// an operator that would fall back raises instead, as in strict mode, and names itself here, so
// that the tracer breaks the graph (run eagerly, the operator it came from has its kernel) rather
// than record a gather. Thread-local: strict mode stays as the user set it.
class FallbackRefusal {
 public:
  FallbackRefusal();
  ~FallbackRefusal();
  FallbackRefusal(const FallbackRefusal&) = delete;
  FallbackRefusal& operator=(const FallbackRefusal&) = delete;

  // The operator that would have fallen back (empty: none did).
  const std::string& refused() const { return refused_; }

 private:
  friend void refuse_if_open(const std::string& op_name);
  FallbackRefusal* previous_;
  std::string refused_;
};

}  // namespace shardtensor
