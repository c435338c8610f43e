// checkpoint::save and save_async: prepare (collective: agree on the state, reduce Partial
// tensors, pick this rank's boxes), write this rank's data file (local I/O, in the background
// for save_async), commit (collective: gather the checksums, rank 0 writes metadata.json and
// renames the staged directory, every rank learns the outcome). Loading is in load.cpp.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "checkpoint/agreement.h"
#include "checkpoint/checksum.h"
#include "checkpoint/file_io.h"
#include "checkpoint/format.h"
#include "shardtensor/checkpoint.h"
#include "shardtensor/redistribute.h"
#include "shardtensor/shard_tensor.h"
#include "spec/sequence_order.h"
#include "util/strings.h"

namespace shardtensor::checkpoint {

struct AsyncSave::State {
  Agreement group;
  std::vector<TensorToSave> tensors;
  std::vector<std::string> saved_from;  // per tensor: the mesh and placements as given (Partial included)
  std::vector<RankFilePlan> plans;
  int64_t my_plan = -1;             // index into plans, -1 when this rank writes nothing
  std::vector<at::Tensor> pieces;   // per entry of my plan: the box's data (CPU copies for save_async)
  std::string dir, staged;
  int64_t chunk_bytes = kDefaultChunkBytes;
  bool fsync = true;

  std::string write_error;          // set by write_rank_file
  std::vector<uint64_t> checksums;  // of my plan's chunks, in entry order
  std::thread writer;
};

namespace {

constexpr const char* kSave = "checkpoint::save";

// Note [Checkpoint test kills]: SHARDTENSOR_CHECKPOINT_TEST_KILL="<rank>:<point>" makes that
// global rank SIGKILL itself at a point of the save ("after_data": its data file is written
// and synced; "before_rename": metadata.json is staged but not published). Tests use it to show
// that a save killed midway leaves no loadable checkpoint. Unset, it costs one getenv.
void test_kill_point(int64_t rank, const char* point) {
  const char* spec = std::getenv("SHARDTENSOR_CHECKPOINT_TEST_KILL");
  if (!spec) return;
  if (std::string(spec) == std::to_string(rank) + ":" + point) ::raise(SIGKILL);
}

Placements without_partial(Placements ps) {
  for (Placement& p : ps)
    if (p.is_partial()) p = Replicate();
  return ps;
}

// Raises on every rank when a row's first entry (the failure flag) is set: the failing rank
// with its own message, the others naming it.
void raise_if_any_failed(const char* api, const std::vector<std::vector<int64_t>>& rows, const Agreement& group,
                         const std::string& my_error, const std::string& consequence) {
  std::vector<int64_t> failed;
  for (size_t p = 0; p < rows.size(); ++p)
    if (rows[p][0] != 0) failed.push_back(group.ranks()[p]);
  if (failed.empty()) return;
  if (!my_error.empty()) TORCH_CHECK(false, my_error, " ", consequence);
  TORCH_CHECK(false, api, ": rank(s) [", join(failed, ", "), "] failed (their error says why). ", consequence);
}

std::string job_tag() {
  const char* job = std::getenv("SHARDTENSOR_JOB_ID");
  return job && *job ? std::string(job).substr(0, 12) + "-" : std::string();
}

// The bytes of one piece, contiguous on the CPU: the piece itself when it already is.
at::Tensor host_bytes(const at::Tensor& piece) {
  at::Tensor t = piece;
  if (!t.device().is_cpu()) t = t.cpu();
  return t.contiguous();
}

void write_rank_file(AsyncSave::State& s) {
  if (s.my_plan < 0) return;
  try {
    const RankFilePlan& plan = s.plans[s.my_plan];
    File file = File::create(s.staged + "/" + plan.file);
    const uint64_t header_size = plan.header.size();
    unsigned char size_bytes[8];
    for (int i = 0; i < 8; ++i) size_bytes[i] = static_cast<unsigned char>(header_size >> (8 * i));  // little-endian
    file.write_at(size_bytes, 8, 0);
    file.write_at(plan.header.data(), static_cast<int64_t>(header_size), 8);
    for (size_t i = 0; i < plan.entries.size(); ++i) {
      const PlannedEntry& e = plan.entries[i];
      const at::Tensor bytes = host_bytes(s.pieces[i]);
      const char* data = static_cast<const char*>(bytes.data_ptr());
      TORCH_INTERNAL_ASSERT(static_cast<int64_t>(bytes.nbytes()) == e.end - e.begin, "checkpoint piece of ",
                            s.tensors[e.tensor].name, " has ", bytes.nbytes(), " bytes, planned ", e.end - e.begin);
      for (int64_t c = 0; c < e.chunks.num_chunks; ++c) {
        const int64_t begin = e.chunks.chunk_begin_row(c) * e.chunks.row_bytes;
        const int64_t end = e.chunks.chunk_end_row(c) * e.chunks.row_bytes;
        s.checksums.push_back(xxh64(data + begin, static_cast<size_t>(end - begin)));
      }
      file.write_at(data, e.end - e.begin, e.begin);
      if (s.pieces[i].use_count() == 1) s.pieces[i] = at::Tensor();  // a copy (save_async) is freed once written
    }
    if (s.fsync) file.sync();
    test_kill_point(plan.rank, "after_data");
  } catch (const c10::Error& e) {
    s.write_error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    s.write_error = std::string(kSave) + ": writing rank " + std::to_string(s.group.rank()) + "'s file failed: " + e.what();
  }
}

std::unique_ptr<AsyncSave::State> prepare(const StateDict& state, const std::string& dir, const SaveOptions& options,
                                          bool copy_pieces) {
  auto s = std::make_unique<AsyncSave::State>();
  s->group = Agreement::for_state(kSave, state, options.mesh);
  s->dir = dir;
  s->chunk_bytes = options.chunk_bytes;
  s->fsync = options.fsync;
  std::string error;
  std::string structure;
  try {
    TORCH_CHECK(!dir.empty(), kSave, ": the directory name is empty.");
    TORCH_CHECK(options.chunk_bytes > 0, kSave, ": chunk_bytes must be positive, got ", options.chunk_bytes, ".");
    for (const auto& [name, t] : state) {
      check_tensor_name(name, kSave);
      TORCH_CHECK(t.defined(), kSave, ": '", name, "' is an undefined tensor.");
      TensorToSave entry;
      entry.name = name;
      entry.dtype = t.scalar_type();
      safetensors_dtype(entry.dtype, name);
      entry.shape = t.sizes().vec();
      if (is_shard_tensor(t)) {
        const ShardTensorSpec& sp = spec(t);
        // Saved in order: a zigzag piece is two stretches, and a checkpoint's boxes are one each.
        entry.spec = in_order(ShardTensorSpec(sp.mesh(), without_partial(sp.placements()), sp.shape(), sp.dtype(), sp.shard_sizes()));
        structure += name + "|" + sp.to_string() + "\n";
        s->saved_from.push_back(to_string(sp.placements()) + " on " + sp.mesh().to_string());
      } else {
        structure += name + "|" + t.toString() + "[" + join(entry.shape, ",") + "]\n";
        s->saved_from.push_back("");
      }
      s->tensors.push_back(std::move(entry));
    }
    if (s->group.position() == 0) {
      const std::filesystem::path parent = std::filesystem::absolute(dir).lexically_normal().parent_path();
      std::error_code ec;
      std::filesystem::create_directories(parent, ec);
      s->staged = dir + ".tmp-" + job_tag() + std::to_string(::getpid());
      make_fresh_directory(s->staged);
    }
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  }
  // Barrier: the staged directory exists, and every rank holds the same state structure.
  const uint64_t hash = xxh64(structure.data(), structure.size());
  const auto rows = s->group.gather({error.empty() ? 0 : 1, static_cast<int64_t>(hash),
                                     s->group.position() == 0 ? static_cast<int64_t>(::getpid()) : 0});
  raise_if_any_failed(kSave, rows, s->group, error, "Nothing was written.");
  for (const auto& row : rows)
    TORCH_CHECK(row[1] == rows[0][1], kSave, ": the ranks hold different state dicts (names, dtypes, shapes or layouts ",
                "differ). Every rank must pass the same keys with the same layouts.");
  s->staged = dir + ".tmp-" + job_tag() + std::to_string(rows[0][2]);

  s->plans = plan_files(s->tensors, s->group.ranks(), s->group.ranks()[0], s->chunk_bytes);
  for (size_t p = 0; p < s->plans.size(); ++p)
    if (s->plans[p].rank == s->group.rank()) s->my_plan = static_cast<int64_t>(p);

  // Partial tensors are reduced, zigzag ones put in order (collectively, in name order on every
  // rank) before writing.
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> locals(s->tensors.size());
  size_t i = 0;
  for (const auto& [name, t] : state) {
    if (is_shard_tensor(t)) {
      const at::Tensor reduced = spec(t).has_partial() || has_zigzag(spec(t)) ? redistribute(t, s->tensors[i].spec->placements()) : t;
      locals[i] = to_local(reduced);
    } else {
      locals[i] = t;
    }
    ++i;
  }
  if (s->my_plan >= 0) {
    for (const PlannedEntry& e : s->plans[s->my_plan].entries) {
      const at::Tensor& local = locals[e.tensor];
      TORCH_INTERNAL_ASSERT(local.sizes().vec() == e.box.shape, kSave, ": the local tensor of ", s->tensors[e.tensor].name,
                            " has shape [", join(local.sizes(), ", "), "], its box [", join(e.box.shape, ", "), "].");
      s->pieces.push_back(copy_pieces ? local.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true).contiguous() : local);
    }
  }
  return s;
}

void commit(AsyncSave::State& s) {
  int64_t max_chunks = 0;
  for (const RankFilePlan& p : s.plans) max_chunks = std::max(max_chunks, p.num_chunks());
  std::vector<int64_t> row(1 + max_chunks, 0);
  row[0] = s.write_error.empty() ? 0 : 1;
  for (size_t c = 0; c < s.checksums.size() && s.write_error.empty(); ++c) row[1 + c] = static_cast<int64_t>(s.checksums[c]);
  const auto rows = s.group.gather(row);
  bool any_failed = false;
  for (const auto& r : rows) any_failed = any_failed || r[0] != 0;
  if (any_failed && s.group.position() == 0) remove_tree(s.staged);
  raise_if_any_failed(kSave, rows, s.group, s.write_error, std::string("The checkpoint at ") + s.dir + " was left as it was.");

  std::string error;
  if (s.group.position() == 0) {
    try {
      Metadata m;
      m.world_size = s.group.size();
      m.chunk_bytes = s.chunk_bytes;
      for (size_t t = 0; t < s.tensors.size(); ++t) {
        SavedTensor st;
        st.name = s.tensors[t].name;
        st.dtype = s.tensors[t].dtype;
        st.shape = s.tensors[t].shape;
        if (s.tensors[t].spec) st.mesh_shape = s.tensors[t].spec->mesh().shape();
        st.placements = s.saved_from[t];
        m.tensors.push_back(std::move(st));
      }
      for (const RankFilePlan& plan : s.plans) {
        const int64_t position = std::find(s.group.ranks().begin(), s.group.ranks().end(), plan.rank) - s.group.ranks().begin();
        size_t next = 1;
        for (const PlannedEntry& e : plan.entries) {
          SavedBox b;
          b.box = e.box;
          b.file = plan.file;
          b.begin = e.begin;
          b.end = e.end;
          b.rows_per_chunk = e.chunks.rows_per_chunk;
          for (int64_t c = 0; c < e.chunks.num_chunks; ++c) b.chunk_checksums.push_back(static_cast<uint64_t>(rows[position][next++]));
          m.tensors[e.tensor].boxes.push_back(std::move(b));
        }
      }
      const std::string text = metadata_text(m);
      File meta = File::create(s.staged + "/" + kMetadataFile);
      meta.write_at(text.data(), static_cast<int64_t>(text.size()), 0);
      if (s.fsync) {
        meta.sync();
        sync_directory(s.staged);
      }
      test_kill_point(s.group.rank(), "before_rename");
      publish_directory(s.staged, s.dir, s.fsync);
    } catch (const c10::Error& e) {
      error = e.what_without_backtrace();
      remove_tree(s.staged);
    }
  }
  // Nobody returns before the checkpoint is published (a load right after must find it).
  const auto done = s.group.gather({error.empty() ? 0 : 1});
  raise_if_any_failed(kSave, done, s.group, error, std::string("The checkpoint at ") + s.dir + " was left as it was.");
}

}  // namespace

void save(const StateDict& state, const std::string& dir, const SaveOptions& options) {
  std::unique_ptr<AsyncSave::State> s = prepare(state, dir, options, /*copy_pieces=*/false);
  write_rank_file(*s);
  commit(*s);
}

AsyncSave save_async(const StateDict& state, const std::string& dir, const SaveOptions& options) {
  std::unique_ptr<AsyncSave::State> s = prepare(state, dir, options, /*copy_pieces=*/true);
  AsyncSave::State* raw = s.get();
  s->writer = std::thread([raw] { write_rank_file(*raw); });
  return AsyncSave(std::move(s));
}

AsyncSave::AsyncSave() = default;
AsyncSave::AsyncSave(std::unique_ptr<State> state) : state_(std::move(state)) {}
AsyncSave::AsyncSave(AsyncSave&&) noexcept = default;
AsyncSave& AsyncSave::operator=(AsyncSave&& other) noexcept {
  if (this != &other) {
    try {
      if (state_) wait();
    } catch (...) {
    }
    state_ = std::move(other.state_);
  }
  return *this;
}
AsyncSave::~AsyncSave() {
  try {
    if (state_) wait();
  } catch (...) {
  }
}

void AsyncSave::wait() {
  TORCH_CHECK(state_, "AsyncSave::wait: this save was already waited for (or was never started).");
  std::unique_ptr<State> s = std::move(state_);
  if (s->writer.joinable()) s->writer.join();
  commit(*s);
}

}  // namespace shardtensor::checkpoint
