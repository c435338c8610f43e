// Which operator is running on this thread, and counting collectives for CommDebugMode.
// Lives in the comm layer (the lowest that issues collectives); the dispatch kernel sets the
// current operator, the c10d adapter records every collective it launches.
#pragma once

#include <mutex>
#include <string>

namespace shardtensor {

class CommDebugMode;

// The operator the kernel is running on this thread ("redistribute" outside the kernel).
const std::string& current_operator();

class CurrentOperatorScope {
 public:
  explicit CurrentOperatorScope(const std::string* name);
  ~CurrentOperatorScope();

 private:
  const std::string* previous_;
};

// No recording on this thread while it lives: for a collective that carries another one's data.
class CommDebugPause {
 public:
  CommDebugPause();
  ~CommDebugPause();
  CommDebugPause(const CommDebugPause&) = delete;
  CommDebugPause& operator=(const CommDebugPause&) = delete;

 private:
  CommDebugMode* paused_;
};

// Makes the CommDebugMode active on the thread that made it (if any) this thread's while it
// lives: a collective another thread runs for it (fully_shard's prefetched all-gathers) counts
// where that thread's would. The mode must outlive the scope; records from both threads are
// serialised by comm_debug_lock().
class CommDebugHandoff {
 public:
  CommDebugHandoff();  // on the thread whose mode it carries
  void enter();        // on the thread that runs the collectives
  void exit();

 private:
  CommDebugMode* mode_;
  CommDebugMode* previous_ = nullptr;
};

// Held while a collective is recorded; a reader of a mode's counts that another thread may be
// adding to takes it too.
std::unique_lock<std::mutex> comm_debug_lock();

// Counts one collective of `kind`, which sent `bytes` from this rank to others, into the
// active CommDebugMode of this thread, if any; with `counts` false it only adds the bytes (the
// second phase of a collective already counted).
void record_collective(const char* kind, int64_t bytes, bool counts = true);

}  // namespace shardtensor
