// See comm_debug.h and CommDebugMode in shardtensor/dispatch.h.
#include "comm/comm_debug.h"
#include "comm/traced_collectives.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "shardtensor/dispatch.h"

namespace shardtensor {
namespace {
thread_local const std::string* current_op = nullptr;
thread_local CommDebugMode* active_mode = nullptr;
}  // namespace

const std::string& current_operator() {
  static const std::string outside = "redistribute";
  return current_op ? *current_op : outside;
}

CurrentOperatorScope::CurrentOperatorScope(const std::string* name) : previous_(current_op) { current_op = name; }
CurrentOperatorScope::~CurrentOperatorScope() { current_op = previous_; }

std::unique_lock<std::mutex> comm_debug_lock() {
  static std::mutex mutex;
  return std::unique_lock<std::mutex>(mutex);
}

void record_collective(const char* kind, int64_t bytes, bool counts) {
  // A trace moves no bytes (comm/traced_collectives.h): its graph's collectives run as torch's.
  if (active_mode && !tracing_collectives()) {
    auto lock = comm_debug_lock();
    active_mode->record(kind, current_operator(), bytes, counts);
  }
}

CommDebugHandoff::CommDebugHandoff() : mode_(active_mode) {}
void CommDebugHandoff::enter() {
  previous_ = active_mode;
  active_mode = mode_;
}
void CommDebugHandoff::exit() { active_mode = previous_; }

CommDebugPause::CommDebugPause() : paused_(active_mode) { active_mode = nullptr; }
CommDebugPause::~CommDebugPause() { active_mode = paused_; }

CommDebugMode::CommDebugMode() : previous_(active_mode) { active_mode = this; }
CommDebugMode::~CommDebugMode() { active_mode = previous_; }

void CommDebugMode::record(const std::string& kind, const std::string& op, int64_t bytes, bool counts) {
  by_kind_[kind] += counts ? 1 : 0;
  by_operator_[op][kind] += counts ? 1 : 0;
  bytes_by_kind_[kind] += bytes;
  bytes_ += bytes;
}

int64_t CommDebugMode::bytes(const std::string& kind) const {
  auto it = bytes_by_kind_.find(kind);
  return it == bytes_by_kind_.end() ? 0 : it->second;
}

int64_t CommDebugMode::total() const {
  int64_t n = 0;
  for (const auto& entry : by_kind_) n += entry.second;
  return n;
}

int64_t CommDebugMode::count(const std::string& kind) const {
  auto it = by_kind_.find(kind);
  return it == by_kind_.end() ? 0 : it->second;
}

std::string CommDebugMode::table() const {
  // Columns as wide as their longest entry (operator names reach 50 characters), two apart.
  size_t op_width = std::string("operator").size(), kind_width = std::string("collective").size();
  for (const auto& op : by_operator_) {
    op_width = std::max(op_width, op.first.size());
    for (const auto& kind : op.second) kind_width = std::max(kind_width, kind.first.size());
  }
  const int a = static_cast<int>(op_width + 2), b = static_cast<int>(kind_width + 2);
  std::ostringstream os;
  os << std::left << std::setw(a) << "operator" << std::setw(b) << "collective" << "count\n";
  for (const auto& op : by_operator_)
    for (const auto& kind : op.second) os << std::setw(a) << op.first << std::setw(b) << kind.first << kind.second << "\n";
  os << std::setw(a + b) << "total" << total() << " (" << bytes_ << " bytes sent by this rank)\n";
  return os.str();
}

}  // namespace shardtensor
