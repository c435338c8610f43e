// Process- and thread-wide switches of the dispatch layer (strict mode, implicit replication,
// logging) and the record of operators that fell back. Public setters: shardtensor/dispatch.h.
#pragma once

#include <string>

namespace shardtensor {

// The process-wide setting, an ImplicitReplication scope, or autograd's backward on this thread.
bool implicit_replication_active();
bool log_enabled();  // SHARDTENSOR_LOG=1

// Records that `op_name` ran through its sharding rule (coverage reports).
void note_propagated(const std::string& op_name);

// Records a fallback; warns the first time for each operator. Raises in strict mode.
void note_fallback(const std::string& op_name, const std::string& why);
// The same for an operator whose zigzag inputs are put back in order first (`why` says why).
void note_order_fallback(const std::string& op_name, const std::string& why);

}  // namespace shardtensor
