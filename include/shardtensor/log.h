// shardtensor's log: what the dispatcher and the planner decide, as lines to one sink.
//
// Two kinds of line: per call (SHARDTENSOR_LOG=1: each operator with its placements in, moves
// and placements out) at Info, and per decision at Debug (each propagation miss with its input
// and output layouts, each redistribute plan made), which SHARDTENSOR_LOG=debug,
// set_debug_log(true) or the sink's own filter turns on; they are made on cache misses only, so
// asking the filter costs nothing per call. The sink is stderr unless one is set; the Python
// package sets one that hands the lines to logging.getLogger("shardtensor"), whose level
// (TORCH_LOGS=+shardtensor, torch._logging.set_logs) is the filter.
#pragma once

#include <functional>
#include <string>

namespace shardtensor {

enum class LogLevel : int { Debug = 10, Info = 20 };  // Python logging's numbers

using LogSink = std::function<void(LogLevel, const std::string&)>;
using LogFilter = std::function<bool(LogLevel)>;

// Where lines go from now on (an empty sink: stderr), and which levels it wants (empty: only
// what set_debug_log and the environment say). Thread-safe.
void set_log_sink(LogSink sink, LogFilter wants = {});
// Whether Debug lines are made (checked before building them, so they cost nothing when off).
void set_debug_log(bool on);
bool debug_log_enabled();
void log_line(LogLevel level, const std::string& line);

}  // namespace shardtensor
