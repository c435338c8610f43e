// Distributed checkpoint: save a state dict of ShardTensors, plain tensors and scalars from any
// layout, and load it into any other (another world size, mesh, placements or uneven sizes).
//
//   shardtensor::checkpoint::StateDict state = {{"w", w}, {"b", b}, {"step", step}};
//   shardtensor::checkpoint::save(state, "ckpt/step-100");   // every rank calls it
//   ...
//   shardtensor::checkpoint::load(state, "ckpt/step-100");   // fills w, b, step in place
//
// Saving writes every element once: the rank at coordinate 0 of each Replicate (and reduced
// Partial) mesh dim writes its box, plain tensors are written by the group's first rank, and no
// rank gathers a tensor. Loading reads, on each rank, only the saved boxes that intersect the
// box its tensors already hold, and communicates only to agree that every rank succeeded.
// The format is described in docs/checkpoint.md ("Format").
//
// Both calls are collective over the group of the state's ShardTensors (the mesh of the first
// one by name, or `mesh` in the options; every ShardTensor's mesh must span the same ranks). A
// state of plain tensors only needs `mesh` when the world has more than one rank.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardtensor/device_mesh.h"

namespace shardtensor::checkpoint {

using StateDict = std::map<std::string, at::Tensor>;

struct SaveOptions {
  std::optional<DeviceMesh> mesh;        // the group to agree over; see the file comment
  int64_t chunk_bytes = int64_t(4) << 20;  // checksum granularity (docs/checkpoint.md: "Format")
  // fsync every file and directory before the rename. Without it the save is still atomic
  // against a crash of the processes (the rename comes after every write), not against a crash
  // of the machine, as torch::save.
  bool fsync = true;
};

struct LoadOptions {
  // strict: a key of the state missing from the checkpoint, or a checkpoint key absent from the
  // state, raises. Otherwise both are skipped and reported in LoadResult.
  bool strict = true;
  std::optional<DeviceMesh> mesh;
};

struct LoadResult {
  std::vector<std::string> missing_keys;     // in the state, not in the checkpoint (not loaded)
  std::vector<std::string> unexpected_keys;  // in the checkpoint, not in the state (ignored)
};

// Writes `state` to the directory `dir` atomically: into `dir.tmp-<job>` first, every file
// fsynced, metadata.json last, then one rename. An existing `dir` is replaced. Raises on every
// rank when any rank fails, and then leaves `dir` as it was.
void save(const StateDict& state, const std::string& dir, const SaveOptions& options = {});

// Fills the tensors of `state` in place (their layouts stay as they are). Everything is
// validated before any tensor is written: a missing or truncated file, a checksum mismatch, a
// missing or unexpected key, a shape or dtype mismatch, or a newer format version raises on
// every rank and leaves `state` untouched.
LoadResult load(StateDict& state, const std::string& dir, const LoadOptions& options = {});

// A save whose file writing runs in the background. save_async returns once every rank has
// copied its boxes (so training may change the tensors right away); wait() then finishes the
// save: it is collective (every rank must call it) and raises like save(). The destructor
// waits if wait() was not called, swallowing errors: call wait() to see them.
class AsyncSave {
 public:
  struct State;
  AsyncSave();
  explicit AsyncSave(std::unique_ptr<State> state);
  AsyncSave(AsyncSave&&) noexcept;
  AsyncSave& operator=(AsyncSave&&) noexcept;
  ~AsyncSave();

  void wait();
  bool valid() const { return state_ != nullptr; }  // false after wait()

 private:
  std::unique_ptr<State> state_;
};

AsyncSave save_async(const StateDict& state, const std::string& dir, const SaveOptions& options = {});

}  // namespace shardtensor::checkpoint
