// Format version 1 against the committed checkpoint tests/checkpoint/data/v1_small/
// (v1_small_fixture.h), written by the shardtensor that had its own JSON writer and XXH64:
// it parses as written, its checksums verify chunk by chunk, its data holds the fixture's
// values, it loads into other layouts, and saving its state again writes the same bytes in
// every file (the metadata text, the safetensors headers and the checksums). Part of
// dist_tests; the byte comparison runs at 2 ranks, where the checkpoint was written.
// Also the metadata parser's refusals, on edits of the committed text.
#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "checkpoint/checksum.h"
#include "checkpoint/format.h"
#include "checkpoint/v1_small_fixture.h"
#include "dist/dist_fixture.h"
#include "redistribute/executor.h"
#include "shardtensor/checkpoint.h"

using namespace shardtensor;
using namespace shardtensor::testing;
namespace ckpt = shardtensor::checkpoint;
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kFiles = {"metadata.json", "rank-00000.safetensors", "rank-00001.safetensors"};

std::string committed_dir() { return std::string(SHARDTENSOR_CHECKPOINT_DATA_DIR) + "/" + v1_small::kDir; }

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot read " << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string committed_metadata_text() { return read_bytes(committed_dir() + "/metadata.json"); }

ckpt::Metadata committed_metadata() { return ckpt::parse_metadata(committed_metadata_text(), "v1_small/metadata.json"); }

// "" when equal, else where and how they differ.
std::string difference(const std::string& got, const std::string& want) {
  if (got == want) return "";
  size_t at = 0;
  while (at < got.size() && at < want.size() && got[at] == want[at]) ++at;
  const size_t from = at < 40 ? 0 : at - 40;
  return "first difference at byte " + std::to_string(at) + " (sizes " + std::to_string(got.size()) + " vs " +
         std::to_string(want.size()) + "):\n  got  ..." + got.substr(from, 80) + "\n  want ..." + want.substr(from, 80);
}

std::string shared_dir(const std::string& name) {
  const char* job = std::getenv("SHARDTENSOR_JOB_ID");
  const std::string tag = job ? std::string(job).substr(0, 12) : std::to_string(::getpid());
  return (fs::temp_directory_path() / ("shardtensor_ckpt_v1_" + tag) / name).string();
}

void barrier(const DeviceMesh& mesh) {
  at::Tensor x = at::zeros({1});
  all_reduce_over(mesh, {0}, x, ReduceOp::Sum);
}

// The bytes of `value`'s elements in `box`, row-major: what a data file holds for the box.
std::string box_bytes(const at::Tensor& value, const Box& box) {
  at::Tensor t = value;
  for (size_t d = 0; d < box.shape.size(); ++d) t = t.narrow(static_cast<int64_t>(d), box.offsets[d], box.shape[d]);
  t = t.contiguous();
  return std::string(static_cast<const char*>(t.data_ptr()), t.nbytes());
}

ckpt::Metadata parse_edited(const std::string& from, const std::string& to) {
  std::string text = committed_metadata_text();
  const size_t at = text.find(from);
  TORCH_CHECK(at != std::string::npos, from, " is not in the committed metadata");
  return ckpt::parse_metadata(text.replace(at, from.size(), to), "edited.json");
}

}  // namespace

TEST(CheckpointV1, CommittedMetadataParsesAsWritten) {
  const ckpt::Metadata m = committed_metadata();
  EXPECT_EQ(m.version, 1);
  EXPECT_EQ(m.world_size, 2);
  EXPECT_EQ(m.chunk_bytes, 16);
  std::vector<std::string> names;
  for (const ckpt::SavedTensor& t : m.tensors) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{v1_small::kOddName, "r", "step", "v", "w"}));  // by name, bytewise

  const ckpt::SavedTensor& w = *m.find("w");
  EXPECT_EQ(w.dtype, c10::kFloat);
  EXPECT_EQ(w.shape, (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(w.mesh_shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(w.placements, "[S(0)] on mesh(2)");
  ASSERT_EQ(w.boxes.size(), 2u);
  EXPECT_EQ(w.boxes[0].box.shape, (std::vector<int64_t>{3, 3}));  // the default split of 5 rows: [3, 2]
  EXPECT_EQ(w.boxes[1].box.offsets, (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(w.boxes[1].file, "rank-00001.safetensors");
  EXPECT_EQ(w.boxes[0].rows_per_chunk, 1);  // 12-byte rows, 16-byte chunks
  EXPECT_EQ(w.boxes[0].chunk_checksums.size(), 3u);

  const ckpt::SavedTensor& v = *m.find("v");
  ASSERT_EQ(v.boxes.size(), 2u);
  EXPECT_EQ(v.boxes[0].box.shape, (std::vector<int64_t>{2, 5}));  // explicit sizes [5, 2] on dim 1
  EXPECT_EQ(v.boxes[1].box.offsets, (std::vector<int64_t>{0, 5}));

  const ckpt::SavedTensor& r = *m.find("r");
  EXPECT_EQ(r.dtype, c10::kBFloat16);
  ASSERT_EQ(r.boxes.size(), 1u) << "a replicated tensor is written once";
  EXPECT_EQ(r.boxes[0].file, "rank-00000.safetensors");

  for (const std::string& plain : {std::string("step"), v1_small::kOddName}) {
    const ckpt::SavedTensor& t = *m.find(plain);
    EXPECT_TRUE(t.mesh_shape.empty() && t.placements.empty()) << plain;
    ASSERT_EQ(t.boxes.size(), 1u) << plain;
    EXPECT_EQ(t.boxes[0].file, "rank-00000.safetensors") << plain;
  }
  EXPECT_TRUE(m.find("step")->shape.empty());
}

TEST(CheckpointV1, CommittedChecksumsVerifyAndTheDataHoldsTheValues) {
  const ckpt::Metadata m = committed_metadata();
  int64_t chunks = 0;
  for (const ckpt::SavedTensor& t : m.tensors) {
    const at::Tensor value = v1_small::value(t.name);
    ASSERT_EQ(value.scalar_type(), t.dtype) << t.name;
    const int64_t element_size = static_cast<int64_t>(c10::elementSize(t.dtype));
    for (const ckpt::SavedBox& b : t.boxes) {
      const std::string file = read_bytes(committed_dir() + "/" + b.file);
      ASSERT_LE(b.end, static_cast<int64_t>(file.size())) << t.name << " in " << b.file;
      const std::string data = file.substr(b.begin, b.end - b.begin);
      EXPECT_TRUE(data == box_bytes(value, b.box)) << t.name << " in " << b.file << " does not hold the fixture's values";
      const ckpt::ChunkGeometry g = ckpt::chunk_geometry(b.box.shape, element_size, b.rows_per_chunk);
      ASSERT_EQ(static_cast<int64_t>(b.chunk_checksums.size()), g.num_chunks) << t.name;
      for (int64_t c = 0; c < g.num_chunks; ++c, ++chunks) {
        const int64_t begin = g.chunk_begin_row(c) * g.row_bytes, end = g.chunk_end_row(c) * g.row_bytes;
        EXPECT_EQ(ckpt::to_hex(ckpt::xxh64(data.data() + begin, static_cast<size_t>(end - begin))),
                  ckpt::to_hex(b.chunk_checksums[c]))
            << t.name << " chunk " << c << " of the box at " << b.begin << " in " << b.file;
      }
    }
  }
  EXPECT_EQ(chunks, 3 + 2 + 2 + 2 + 1 + 1 + 1) << "w: 3 + 2 rows; v: 2 + 2 rows; r, step, the odd name: one chunk each";
}

TEST(CheckpointV1, CommittedCheckpointLoadsIntoOtherLayouts) {
  const DeviceMesh& flat = test_meshes().front();
  const std::vector<std::vector<Placement>> layouts = {{Shard(1), Shard(0), Shard(0)},  // w, v, r
                                                       {Replicate(), Replicate(), Replicate()}};
  for (const std::vector<Placement>& ps : layouts) {
    ckpt::StateDict state = {
        {"w", distribute_tensor(at::zeros({5, 3}), flat, {ps[0]})},
        {"v", distribute_tensor(at::zeros({2, 7}, at::kLong), flat, {ps[1]})},
        {"r", distribute_tensor(at::zeros({4}, at::kBFloat16), flat, {ps[2]})},
        {"step", at::scalar_tensor(0, at::kLong)},
        {v1_small::kOddName, at::zeros({2}, at::kDouble)},
    };
    ckpt::load(state, committed_dir());
    for (const auto& [name, t] : state) {
      const at::Tensor value = v1_small::value(name);
      if (!is_shard_tensor(t)) {
        EXPECT_TRUE(at::equal(t, value)) << name << ": " << t << " vs " << value;
        continue;
      }
      const ShardTensorSpec& s = spec(t);
      const at::Tensor expected = reference_piece(value, s.mesh().shape(), s.placements(), s.shard_sizes(), s.mesh().coordinate());
      EXPECT_TRUE(at::equal(to_local(t), expected)) << name << " (" << s << "): " << to_local(t) << " vs " << expected;
    }
  }
}

TEST(CheckpointV1, SavingTheSameStateWritesTheCommittedBytes) {
  if (world_size() != v1_small::kWorldSize) GTEST_SKIP() << "the committed checkpoint was written at 2 ranks";
  const DeviceMesh& flat = test_meshes().front();
  const std::string dir = shared_dir("resave");
  ckpt::save(v1_small::state(flat), dir, v1_small::save_options());
  if (world_rank() == 0) {
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path().filename().string());
    std::sort(files.begin(), files.end());
    EXPECT_EQ(files, kFiles);
    for (const std::string& f : kFiles)
      EXPECT_EQ(difference(read_bytes(dir + "/" + f), read_bytes(committed_dir() + "/" + f)), "") << f;
  }
  barrier(flat);
  if (world_rank() == 0) fs::remove_all(fs::path(dir).parent_path());
}

TEST(CheckpointV1, MetadataTextOfTheParsedMetadataIsTheCommittedText) {
  const std::string text = committed_metadata_text();
  EXPECT_EQ(difference(ckpt::metadata_text(ckpt::parse_metadata(text, "metadata.json")), text), "");
  // Whitespace is read and not written.
  std::string spaced = " \n" + text;
  for (const auto& [from, to] : {std::pair<std::string, std::string>{",", ",\n  "}, {":", " : "}})
    for (size_t at = spaced.find(from); at != std::string::npos; at = spaced.find(from, at + to.size()))
      spaced.replace(at, from.size(), to);
  EXPECT_EQ(difference(ckpt::metadata_text(ckpt::parse_metadata(spaced + "\t\r\n ", "spaced.json")), text), "");
  // The escapes of version 1 (json.h, Note [Version 1 JSON text]): \u00xx for every control
  // character, '"' and '\\' escaped, DEL and UTF-8 as they are.
  EXPECT_NE(text.find("\"odd \\\"name\\\"\\\\\\u0009\\u000a\\u0001\x7f \xc3\xa9\":{"), std::string::npos) << text;
}

TEST(CheckpointFormat, MetadataTextEscapesEveryControlCharacterAsVersion1Did) {
  ckpt::Metadata m;
  m.world_size = INT64_MIN;  // nonsense, but the integers' text is what is tested here
  m.chunk_bytes = INT64_MAX;
  ckpt::SavedTensor t;
  t.name = std::string("a\"\\/\b\f\n\r\t\x1f", 10) + std::string(1, '\0') + "\x7f\xf0\x9f\x98\x80";
  t.shape = {0};
  t.placements = "[S(0)] on mesh(3)";
  t.mesh_shape = {3};
  m.tensors.push_back(t);
  const std::string text = ckpt::metadata_text(m);
  EXPECT_EQ(text,
            "{\"format\":\"shardtensor-checkpoint\",\"version\":1,\"world_size\":-9223372036854775808,"
            "\"chunk_bytes\":9223372036854775807,\"checksum\":\"xxh64\","
            "\"tensors\":{\"a\\\"\\\\/\\u0008\\u000c\\u000a\\u000d\\u0009\\u001f\\u0000\x7f\xf0\x9f\x98\x80\":{\"dtype\":\"F32\","
            "\"shape\":[0],\"mesh_shape\":[3],\"placements\":\"[S(0)] on mesh(3)\",\"boxes\":[]}}}\n");
  const ckpt::Metadata back = ckpt::parse_metadata(text, "t.json");
  ASSERT_EQ(back.tensors.size(), 1u);
  EXPECT_EQ(back.tensors[0].name, t.name);
  EXPECT_EQ(ckpt::metadata_text(back), text);
}

TEST(CheckpointFormat, ChecksumIsXxh64) {
  EXPECT_EQ(ckpt::to_hex(ckpt::xxh64("", 0)), "ef46db3751d8e999");  // the specification's empty-input value
  EXPECT_EQ(ckpt::to_hex(ckpt::xxh64("abc", 3)), "44bc2cf5ad770999");
  const std::string long_text(1000, 'x');
  EXPECT_NE(ckpt::xxh64(long_text.data(), long_text.size()), ckpt::xxh64(long_text.data(), long_text.size() - 1));
  EXPECT_EQ(ckpt::from_hex(ckpt::to_hex(0x0123456789abcdefULL), "x"), 0x0123456789abcdefULL);
  EXPECT_ERROR_CONTAINS(ckpt::from_hex("0123456789ABCDEF", "tensors.w.boxes[0].chunk_xxh64[]"), "should be lowercase hex digits");
}

TEST(CheckpointFormat, MetadataParserRefusesWhatVersion1DoesNotWrite) {
  const std::string text = committed_metadata_text();
  // Syntax: the file, the byte and what was expected.
  for (const std::string& bad : {text.substr(0, 40), text + "x", std::string("{\"format\":1,}"), std::string("[1,]"),
                                 std::string("{\"a\":01}"), std::string("{\"a\":\"\\q\"}"), std::string("")})
    EXPECT_ERROR_CONTAINS(ckpt::parse_metadata(bad, "bad.json"), "checkpoint: bad.json is not valid JSON at byte");
  EXPECT_ERROR_CONTAINS(ckpt::parse_metadata(text.substr(0, text.find("\"world_size\"")), "bad.json"),
                        "unexpected end of input; expected string literal");
  EXPECT_ERROR_CONTAINS(parse_edited("\"checksum\":\"xxh64\"", "\"checksum\":\"xxh64\",\"checksum\":\"xxh64\""),
                        "edited.json is not valid JSON", "the key \"checksum\" appears twice");
  EXPECT_ERROR_CONTAINS(ckpt::parse_metadata("[1]", "bad.json"), "bad.json is not a JSON object");
  EXPECT_ERROR_CONTAINS(parse_edited("\"shardtensor-checkpoint\"", "\"other\""), "edited.json is not shardtensor checkpoint metadata");
  // Kinds and ranges: the key path.
  EXPECT_ERROR_CONTAINS(parse_edited("\"version\":1,", "\"version\":1.5,"), "'version' should be an integer but is a number with a fraction");
  EXPECT_ERROR_CONTAINS(parse_edited("\"chunk_bytes\":16", "\"chunk_bytes\":99999999999999999999"), "'chunk_bytes' should be an integer");
  EXPECT_ERROR_CONTAINS(parse_edited("\"world_size\":2", "\"world_size\":9223372036854775808"), "'world_size' is 9223372036854775808",
                        "outside the int64 range");
  EXPECT_EQ(parse_edited("\"world_size\":2", "\"world_size\":9223372036854775807").world_size, INT64_MAX);
  EXPECT_ERROR_CONTAINS(parse_edited("\"chunk_bytes\":16", "\"chunk_bytes\":\"16\""), "'chunk_bytes' should be an integer but is a string");
  EXPECT_ERROR_CONTAINS(parse_edited("\"checksum\":\"xxh64\",", ""), "the top-level object has no key 'checksum'");
  EXPECT_ERROR_CONTAINS(parse_edited("\"w\":{\"dtype\":\"F32\",", "\"w\":{"), "'tensors.w' has no key 'dtype'");
  EXPECT_ERROR_CONTAINS(parse_edited("\"w\":{\"dtype\":\"F32\",\"shape\":[5,3]", "\"w\":{\"dtype\":\"F32\",\"shape\":[5,true]"),
                        "'tensors.w.shape[]' should be an integer but is a boolean");
  // Standard escapes that version 1 never writes still read: \uXXXX with a surrogate pair.
  EXPECT_EQ(parse_edited("\"placements\":\"[R] on mesh(2)\"", "\"placements\":\"\\u00e9\\ud83d\\ude00\\/\\n\"").find("r")->placements,
            "\xc3\xa9\xf0\x9f\x98\x80/\n");
}

TEST(CheckpointFormat, NameThatIsNotUtf8IsRefusedBeforeAnythingIsWritten) {
  const DeviceMesh& flat = test_meshes().front();
  const std::string dir = shared_dir("not_utf8");
  ckpt::StateDict state = {{"bad\xff", distribute_tensor(at::zeros({2}), flat, {Replicate()})}};
  EXPECT_ERROR_CONTAINS(ckpt::save(state, dir), "checkpoint::save: the tensor name", "is not valid UTF-8", "Nothing was written");
  barrier(flat);
  EXPECT_FALSE(fs::exists(dir));
  barrier(flat);
  if (world_rank() == 0) fs::remove_all(fs::path(dir).parent_path());
}
