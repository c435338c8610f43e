#include "shardtensor/log.h"

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <mutex>

namespace shardtensor {
namespace {

std::mutex sink_mutex;
LogSink& sink() {
  static LogSink* s = new LogSink();  // leaked: lines may come from atexit handlers
  return *s;
}
LogFilter& filter() {
  static LogFilter* f = new LogFilter();
  return *f;
}

std::atomic<bool>& debug_flag() {
  static std::atomic<bool> flag{[] {
    const char* v = std::getenv("SHARDTENSOR_LOG");
    return v && std::string(v) == "debug";
  }()};
  return flag;
}

}  // namespace

void set_log_sink(LogSink s, LogFilter wants) {
  std::lock_guard<std::mutex> lock(sink_mutex);
  sink() = std::move(s);
  filter() = std::move(wants);
}

void set_debug_log(bool on) { debug_flag() = on; }

bool debug_log_enabled() {
  if (debug_flag().load(std::memory_order_relaxed)) return true;
  LogFilter wants;
  {
    std::lock_guard<std::mutex> lock(sink_mutex);
    wants = filter();
  }
  return wants && wants(LogLevel::Debug);
}

void log_line(LogLevel level, const std::string& line) {
  LogSink current;
  {
    std::lock_guard<std::mutex> lock(sink_mutex);
    current = sink();
  }
  if (current) current(level, line);
  else std::cerr << "[shardtensor] " << line << "\n";
}

}  // namespace shardtensor
