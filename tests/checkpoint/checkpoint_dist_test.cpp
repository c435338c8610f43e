// checkpoint::save and load on every mesh of this world size (part of dist_tests, so it runs
// at world sizes 1-4): round trips from random layouts (uneven and empty shards, Replicate,
// Partial, nested Shard, 2-D and 3-D meshes) into other random layouts on other meshes, plain
// tensors and scalars; the saved boxes tile each tensor exactly once; and every corruption of
// a checkpoint is refused on every rank with its message, leaving the state untouched.
// Loads at another world size and killed saves need several launches: checkpoint_driver_test.cpp.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "checkpoint/format.h"
#include "redistribute/executor.h"
#include "dist/dist_fixture.h"
#include "shardtensor/checkpoint.h"

using namespace shardtensor;
using namespace shardtensor::testing;
namespace ckpt = shardtensor::checkpoint;
namespace fs = std::filesystem;

namespace {

// One directory name for every rank of this launch (shardrun gives each launch a job id).
std::string shared_dir(const std::string& name) {
  const char* job = std::getenv("SHARDTENSOR_JOB_ID");
  const std::string tag = job ? std::string(job).substr(0, 12) : std::to_string(::getpid());
  return (fs::temp_directory_path() / ("shardtensor_ckpt_" + tag) / name).string();
}

void barrier(const DeviceMesh& mesh) {
  at::Tensor x = at::zeros({1});
  std::vector<int64_t> dims(mesh.ndim());
  for (int64_t m = 0; m < mesh.ndim(); ++m) dims[m] = m;
  all_reduce_over(mesh, dims, x, ReduceOp::Sum);
}

// Values that are exact in every dtype used here, distinct per tensor.
at::Tensor global_value(const std::vector<int64_t>& shape, c10::ScalarType dtype, int64_t salt) {
  at::Tensor v = (iota(shape, c10::kDouble) + salt).remainder(dtype == c10::kBool ? 2 : 250);
  return v.to(dtype);
}

// This rank's term of a Partial(sum) value: the value at coordinate 0 of each Partial mesh dim
// minus (n - 1), and 1 elsewhere, so that only the reduction gives the value back.
at::Tensor sum_partial_term(at::Tensor v, const DeviceMesh& mesh, const Placements& ps) {
  for (int64_t m = 0; m < mesh.ndim(); ++m)
    if (ps[m].is_partial()) v = mesh.coordinate()[m] == 0 ? v - (mesh.size(m) - 1) : at::ones_like(v);
  return v.contiguous();
}

at::Tensor make_shard_tensor(const at::Tensor& value, const DeviceMesh& mesh, const RandomLayout& layout) {
  Placements ps = layout.placements;
  for (Placement& p : ps)
    if (p.is_partial()) p = Partial(ReduceOp::Sum);
  const ShardTensorSpec s(mesh, ps, layout.shape, value.scalar_type(), layout.sizes);
  at::Tensor piece = reference_piece(value, mesh.shape(), s.placements(), s.shard_sizes(), mesh.coordinate());
  if (s.has_partial()) piece = sum_partial_term(piece.to(c10::kDouble), mesh, s.placements()).to(value.scalar_type());
  return from_local(piece.contiguous(), mesh, s.placements(), ShardSizing::given(s.shard_sizes()));
}

// The same layout with the sizes re-drawn for `shape` and `mesh_shape`.
RandomLayout layout_for(std::mt19937& rng, const std::vector<int64_t>& mesh_shape, const std::vector<int64_t>& shape) {
  RandomLayout l = random_layout(rng, mesh_shape, /*explicit_sizes=*/false);
  l.shape = shape;
  for (Placement& p : l.placements)
    if (p.is_shard()) p = Shard(p.tensor_dim % static_cast<int64_t>(shape.size()));
  if (rng() % 2 == 0) {
    for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
      int64_t pieces = 1;
      for (size_t m = 0; m < mesh_shape.size(); ++m)
        if (l.placements[m].is_shard(d)) pieces *= mesh_shape[m];
      if (pieces > 1 || std::any_of(l.placements.begin(), l.placements.end(), [&](const Placement& p) { return p.is_shard(d); }))
        l.sizes.push_back({d, random_sizes(rng, shape[d], pieces)});
    }
  }
  return l;
}

// Every element equals the global value: the local piece (or, for Partial, the reduction).
void expect_holds(const at::Tensor& t, const at::Tensor& value, const std::string& what) {
  if (!is_shard_tensor(t)) {
    EXPECT_TRUE(at::equal(t, value)) << what << ": " << t << " vs " << value;
    return;
  }
  const ShardTensorSpec& s = spec(t);
  if (s.has_partial()) {
    EXPECT_TRUE(at::equal(full_tensor(t), value)) << what << " (" << s << ")";
  } else {
    const at::Tensor expected = reference_piece(value, s.mesh().shape(), s.placements(), s.shard_sizes(), s.mesh().coordinate());
    EXPECT_TRUE(at::equal(to_local(t), expected)) << what << " (" << s << "): " << to_local(t) << " vs " << expected;
  }
}

ckpt::Metadata read_metadata(const std::string& dir) {
  std::ifstream in(dir + "/metadata.json");
  std::stringstream text;
  text << in.rdbuf();
  return ckpt::parse_metadata(text.str(), "metadata.json");
}

// No two saved boxes of a tensor overlap (their total size already equals the tensor's, which
// the metadata parser checks), so every element was written exactly once.
void expect_boxes_tile_once(const ckpt::Metadata& m) {
  for (const ckpt::SavedTensor& t : m.tensors)
    for (size_t i = 0; i < t.boxes.size(); ++i)
      for (size_t j = i + 1; j < t.boxes.size(); ++j)
        EXPECT_EQ(intersect(t.boxes[i].box, t.boxes[j].box).numel(), 0) << t.name << " boxes " << i << " and " << j << " overlap";
}

const c10::ScalarType kDtypes[] = {c10::kFloat, c10::kDouble, c10::kLong, c10::kBFloat16, c10::kInt, c10::kBool};

}  // namespace

TEST(Checkpoint, RandomLayoutsRoundTripIntoOtherLayoutsAndMeshes) {
  std::mt19937 rng(2026);
  const std::string dir = shared_dir("sweep");
  int cases = 0;
  for (const DeviceMesh& source_mesh : test_meshes()) {
    for (int i = 0; i < 8; ++i, ++cases) {
      const DeviceMesh& target_mesh = test_meshes()[rng() % test_meshes().size()];
      ckpt::StateDict saved, target;
      std::map<std::string, at::Tensor> values;
      std::string trace = "case " + std::to_string(cases);
      for (int k = 0; k < 4; ++k) {
        const std::string name = "layer" + std::to_string(k) + ".weight";
        const c10::ScalarType dtype = kDtypes[rng() % 6];
        const RandomLayout src = random_layout(rng, source_mesh.shape(), /*explicit_sizes=*/rng() % 2 == 0);
        const RandomLayout dst = layout_for(rng, target_mesh.shape(), src.shape);
        // Gloo reduces neither bool nor bfloat16: those tensors stay free of Partial.
        const bool partial_ok = dtype != c10::kBool && dtype != c10::kBFloat16;
        RandomLayout src_fixed = src, dst_fixed = dst;
        for (Placement& p : src_fixed.placements)
          if (p.is_partial() && !partial_ok) p = Replicate();
        for (Placement& p : dst_fixed.placements)
          if (p.is_partial() && !partial_ok) p = Replicate();
        values[name] = global_value(src.shape, dtype, 17 * cases + k);
        saved[name] = make_shard_tensor(values[name], source_mesh, src_fixed);
        target[name] = make_shard_tensor(at::zeros(src.shape, dtype), target_mesh, dst_fixed);
        trace += "; " + name + " " + c10::toString(dtype) + " " + src_fixed.describe() + " on " + source_mesh.to_string() +
                 " -> " + dst_fixed.describe() + " on " + target_mesh.to_string();
      }
      values["step"] = at::tensor(int64_t(1000 + cases));
      saved["step"] = values["step"].clone();
      target["step"] = at::tensor(int64_t(0));
      values["plain"] = global_value({3, 5}, c10::kFloat, cases);
      saved["plain"] = values["plain"].clone();
      target["plain"] = at::zeros({3, 5});
      SCOPED_TRACE(trace);

      ckpt::SaveOptions save_options;
      save_options.chunk_bytes = i % 2 ? 16 : ckpt::kDefaultChunkBytes;  // many chunks: partial reads of boxes
      ckpt::save(saved, dir, save_options);
      if (world_rank() == 0) expect_boxes_tile_once(read_metadata(dir));
      const ckpt::LoadResult r = ckpt::load(target, dir);
      EXPECT_TRUE(r.missing_keys.empty() && r.unexpected_keys.empty());
      for (const auto& [name, t] : target) expect_holds(t, values[name], name);
    }
  }
  barrier(test_meshes().front());
  if (world_rank() == 0) fs::remove_all(fs::path(dir).parent_path());
}

TEST(Checkpoint, NamedLayoutChangesLoadExactly) {
  // The cases: S(0) -> S(1), chunk sizes -> explicit uneven sizes with an empty shard,
  // 2x2 -> 1-D, Replicate (saved once) -> Shard.
  const DeviceMesh& flat = test_meshes().front();
  const int64_t n = flat.size();
  const std::string dir = shared_dir("named");
  const at::Tensor a = global_value({7, 5}, c10::kFloat, 1), b = global_value({10, 3}, c10::kFloat, 2),
                   c = global_value({6}, c10::kDouble, 3);
  std::vector<int64_t> uneven(n, 0);
  uneven[n - 1] = 10;  // everything on the last rank, the others empty
  if (n > 1) {
    uneven[0] = 3;
    uneven[n - 1] = 7;
  }
  ckpt::StateDict saved = {{"a", distribute_tensor(a, flat, {Shard(0)})},
                           {"b", distribute_tensor(b, flat, {Shard(0)})},
                           {"c", distribute_tensor(c, flat, {Replicate()})}};
  ckpt::save(saved, dir);
  if (world_rank() == 0) {
    const ckpt::Metadata m = read_metadata(dir);
    EXPECT_EQ(m.find("c")->boxes.size(), 1u) << "a replicated tensor is written by one rank";
    EXPECT_EQ(m.find("a")->boxes.size(), static_cast<size_t>(std::min<int64_t>(n, 7)));
  }
  ckpt::StateDict target = {{"a", distribute_tensor(at::zeros({7, 5}), flat, {Shard(1)})},
                            {"b", distribute_tensor(at::zeros({10, 3}), flat, {Shard(0)}, ShardSizes{{0, uneven}})},
                            {"c", distribute_tensor(at::zeros({6}, at::kDouble), flat, {Shard(0)})}};
  ckpt::load(target, dir);
  expect_holds(target["a"], a, "a");
  expect_holds(target["b"], b, "b");
  expect_holds(target["c"], c, "c");

  for (const DeviceMesh& mesh : test_meshes()) {  // nested 2-D layouts -> the flat mesh and back
    if (mesh.ndim() < 2) continue;
    ckpt::StateDict two_d = {{"a", distribute_tensor(a, mesh, Placements(mesh.ndim(), Shard(0)))}};
    ckpt::save(two_d, dir);
    ckpt::StateDict one_d = {{"a", distribute_tensor(at::zeros({7, 5}), flat, {Shard(1)})}};
    ckpt::load(one_d, dir);
    expect_holds(one_d["a"], a, "a from " + mesh.to_string());
    ckpt::save(one_d, dir);
    Placements ps(mesh.ndim(), Replicate());
    ps.back() = Shard(1);
    ckpt::StateDict back = {{"a", distribute_tensor(at::zeros({7, 5}), mesh, ps)}};
    ckpt::load(back, dir);
    expect_holds(back["a"], a, "a back to " + mesh.to_string());
  }
  barrier(flat);
  if (world_rank() == 0) fs::remove_all(fs::path(dir).parent_path());
}

TEST(Checkpoint, ReplicatedStateIsWrittenByTheFirstRankOnly) {
  const DeviceMesh& flat = test_meshes().front();
  const std::string dir = shared_dir("replicated");
  ckpt::StateDict state = {{"r", distribute_tensor(global_value({4, 4}, c10::kFloat, 0), flat, {Replicate()})},
                           {"s", at::tensor(3.5)}};
  ckpt::save(state, dir);
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"metadata.json", "rank-00000.safetensors"}));
  barrier(flat);
  if (world_rank() == 0) fs::remove_all(fs::path(dir).parent_path());
}

// ---- corruption: refused on every rank, before any tensor is written ----
namespace {

struct CorruptionCase {
  const DeviceMesh& mesh = test_meshes().front();
  std::string dir;
  at::Tensor w_value = global_value({9, 4}, c10::kFloat, 5);

  explicit CorruptionCase(const std::string& name) : dir(shared_dir(name)) {
    ckpt::StateDict state = {{"w", distribute_tensor(w_value, mesh, {Shard(0)})}, {"step", at::tensor(int64_t(7))}};
    ckpt::save(state, dir);
  }
  ~CorruptionCase() {
    barrier(mesh);
    if (world_rank() == 0) {
      fs::remove_all(dir);
      std::error_code not_empty;  // the launch's directory goes with its last case
      fs::remove(fs::path(dir).parent_path(), not_empty);
    }
  }
  // Rank 0 damages the checkpoint while the others wait.
  template <typename F>
  void damage(F&& f) {
    if (world_rank() == 0) f();
    barrier(mesh);
  }
  // A state laid out differently from the saved one (S(1)), filled with a sentinel.
  ckpt::StateDict sentinel_state() const {
    return {{"w", distribute_tensor(at::full({9, 4}, -7.0), mesh, {Shard(1)})}, {"step", at::tensor(int64_t(-7))}};
  }
  static void expect_untouched(const ckpt::StateDict& state) {
    for (const auto& [name, t] : state) {
      const at::Tensor local = is_shard_tensor(t) ? to_local(t) : t;
      EXPECT_TRUE(local.eq(-7).all().item<bool>()) << name << " was modified by a failed load";
    }
  }
  std::string data_file() const { return dir + "/rank-00000.safetensors"; }
};

void flip_byte(const std::string& path, int64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  char c = 0;
  f.read(&c, 1);
  c ^= 0x40;
  f.seekp(offset);
  f.write(&c, 1);
}

void replace_in_file(const std::string& path, const std::string& from, const std::string& to) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  const size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from << " not in " << path;
  text.replace(at, from.size(), to);
  std::ofstream(path, std::ios::trunc) << text;
}

}  // namespace

TEST(CheckpointCorruption, MissingMetadataSaysThereIsNoCheckpoint) {
  CorruptionCase c("no_metadata");
  c.damage([&] { fs::remove(c.dir + "/metadata.json"); });
  ckpt::StateDict state = c.sentinel_state();
  EXPECT_ERROR_CONTAINS(ckpt::load(state, c.dir), "no checkpoint at", "metadata.json is missing", "Nothing was loaded");
  c.expect_untouched(state);
}

TEST(CheckpointCorruption, MissingDataFileIsNamed) {
  CorruptionCase c("missing_file");
  c.damage([&] { fs::remove(c.data_file()); });
  ckpt::StateDict state = c.sentinel_state();
  EXPECT_ERROR_CONTAINS(ckpt::load(state, c.dir), "rank-00000.safetensors is missing", "Nothing was loaded");
  c.expect_untouched(state);
}

TEST(CheckpointCorruption, TruncatedDataFileIsNamed) {
  CorruptionCase c("truncated");
  c.damage([&] { fs::resize_file(c.data_file(), fs::file_size(c.data_file()) - 3); });
  ckpt::StateDict state = c.sentinel_state();
  EXPECT_ERROR_CONTAINS(ckpt::load(state, c.dir), "rank-00000.safetensors is", "the file is truncated", "Nothing was loaded");
  c.expect_untouched(state);
}

TEST(CheckpointCorruption, ChecksumMismatchIsRefusedOnEveryRank) {
  CorruptionCase c("checksum");
  // The last byte of rank 0's file lies in its last box; only some ranks read it, all refuse.
  c.damage([&] { flip_byte(c.data_file(), static_cast<int64_t>(fs::file_size(c.data_file())) - 1); });
  ckpt::StateDict state = c.sentinel_state();
  EXPECT_ERROR_CONTAINS(ckpt::load(state, c.dir), "checksum mismatch in", "rank-00000.safetensors", "The file is corrupt",
                        "Nothing was loaded");
  c.expect_untouched(state);
}

TEST(CheckpointCorruption, MissingAndUnexpectedKeysInStrictAndNonStrictModes) {
  CorruptionCase c("keys");
  ckpt::StateDict state = c.sentinel_state();
  state["bias"] = at::full({3}, -7.0);
  state.erase("step");
  EXPECT_ERROR_CONTAINS(ckpt::load(state, c.dir), "missing from the checkpoint: [bias]", "in the checkpoint but not in the state: [step]",
                        "strict = false");
  c.expect_untouched(state);
  ckpt::LoadOptions lenient;
  lenient.strict = false;
  const ckpt::LoadResult r = ckpt::load(state, c.dir, lenient);
  EXPECT_EQ(r.missing_keys, std::vector<std::string>{"bias"});
  EXPECT_EQ(r.unexpected_keys, std::vector<std::string>{"step"});
  expect_holds(state["w"], c.w_value, "w");
  EXPECT_TRUE(state["bias"].eq(-7).all().item<bool>());
}

TEST(CheckpointCorruption, ShapeAndDtypeMismatchesSayBoth) {
  CorruptionCase c("shape_dtype");
  ckpt::StateDict state = c.sentinel_state();
  state["w"] = distribute_tensor(at::full({9, 5}, -7.0), c.mesh, {Shard(0)});
  EXPECT_ERROR_CONTAINS(ckpt::load(state, c.dir), "'w' has shape [9, 4] in the checkpoint but [9, 5] in the state");
  c.expect_untouched(state);
  state = c.sentinel_state();
  state["step"] = at::tensor(-7.0);
  EXPECT_ERROR_CONTAINS(ckpt::load(state, c.dir), "'step' has dtype Long in the checkpoint but Double in the state");
  c.expect_untouched(state);
}

TEST(CheckpointCorruption, FutureFormatVersionIsRefused) {
  CorruptionCase c("version");
  c.damage([&] { replace_in_file(c.dir + "/metadata.json", "\"version\":1,", "\"version\":2,"); });
  ckpt::StateDict state = c.sentinel_state();
  EXPECT_ERROR_CONTAINS(ckpt::load(state, c.dir), "format version 2", "reads versions up to 1", "newer shardtensor");
  c.expect_untouched(state);
}

TEST(CheckpointCorruption, MalformedMetadataIsRefused) {
  CorruptionCase c("malformed");
  c.damage([&] { replace_in_file(c.dir + "/metadata.json", "\"byte_range\":[", "\"byte_range\":[1,"); });
  ckpt::StateDict state = c.sentinel_state();
  EXPECT_ERROR_CONTAINS(ckpt::load(state, c.dir), "byte_range' should be [begin, end]");
  c.expect_untouched(state);
}

// The format's building blocks (JSON text, checksums) and the committed version-1 checkpoint:
// checkpoint_v1_test.cpp.

namespace {
ShardSizes async_sizes(int64_t n) {
  std::mt19937 rng(4);
  return {{0, random_sizes(rng, 10, n)}};
}
}  // namespace

TEST(Checkpoint, AsyncSaveWritesTheValuesOfTheCallEvenIfTheTensorsChangeAfter) {
  const DeviceMesh& flat = test_meshes().front();
  const std::string dir = shared_dir("async");
  const at::Tensor value = global_value({10, 3}, c10::kFloat, 9);
  ckpt::StateDict state = {{"w", distribute_tensor(value, flat, {Shard(0)}, async_sizes(flat.size()))},
                           {"step", at::tensor(int64_t(5))}};
  ckpt::AsyncSave pending = ckpt::save_async(state, dir);
  {
    at::NoGradGuard no_grad;
    to_local(state["w"]).fill_(-1);  // training goes on while the files are written
    state["step"].fill_(6);
  }
  pending.wait();
  EXPECT_FALSE(pending.valid());
  ckpt::StateDict loaded = {{"w", distribute_tensor(at::zeros({10, 3}), flat, {Shard(1)})}, {"step", at::tensor(int64_t(0))}};
  ckpt::load(loaded, dir);
  expect_holds(loaded["w"], value, "w");
  EXPECT_EQ(loaded["step"].item<int64_t>(), 5);
  barrier(flat);
  if (world_rank() == 0) fs::remove_all(fs::path(dir).parent_path());
}
