// See format.h.
#include "checkpoint/format.h"

#include <c10/util/Exception.h>

#include <cstdio>
#include <set>

#include "checkpoint/checksum.h"
#include "shardtensor/placement.h"
#include "util/strings.h"

namespace shardtensor::checkpoint {
namespace {

struct DtypeName {
  c10::ScalarType dtype;
  const char* name;
};
constexpr DtypeName kDtypeNames[] = {
    {c10::kDouble, "F64"}, {c10::kFloat, "F32"}, {c10::kHalf, "F16"},  {c10::kBFloat16, "BF16"},
    {c10::kLong, "I64"},   {c10::kInt, "I32"},   {c10::kShort, "I16"}, {c10::kChar, "I8"},
    {c10::kByte, "U8"},    {c10::kBool, "BOOL"},
};

Json box_to_json(const SavedBox& b) {
  Json j = Json::object();
  j.set("offsets", Json::int_array(b.box.offsets));
  j.set("shape", Json::int_array(b.box.shape));
  j.set("file", Json::string(b.file));
  j.set("byte_range", Json::int_array({b.begin, b.end}));
  j.set("rows_per_chunk", Json::integer(b.rows_per_chunk));
  Json sums = Json::array();
  for (uint64_t s : b.chunk_checksums) sums.push(Json::string(to_hex(s)));
  j.set("chunk_xxh64", std::move(sums));
  return j;
}

// A file name from the metadata must stay inside the checkpoint directory.
void check_file_name(const std::string& file, const std::string& what) {
  TORCH_CHECK(!file.empty() && file.find('/') == std::string::npos && file != "." && file != "..",
              "checkpoint metadata: '", what, "' is \"", file, "\", which is not a file name inside the checkpoint directory.");
}

SavedBox box_from_json(const Json& j, const SavedTensor& t, int64_t element_size, const std::string& what) {
  SavedBox b;
  b.box.offsets = j.at("offsets", what).as_int_array(what + ".offsets");
  b.box.shape = j.at("shape", what).as_int_array(what + ".shape");
  b.file = j.at("file", what).as_string(what + ".file");
  check_file_name(b.file, what + ".file");
  const std::vector<int64_t> range = j.at("byte_range", what).as_int_array(what + ".byte_range");
  TORCH_CHECK(range.size() == 2, "checkpoint metadata: '", what, ".byte_range' should be [begin, end].");
  b.begin = range[0];
  b.end = range[1];
  b.rows_per_chunk = j.at("rows_per_chunk", what).as_int(what + ".rows_per_chunk");
  for (const Json& s : j.at("chunk_xxh64", what).as_array(what + ".chunk_xxh64"))
    b.chunk_checksums.push_back(from_hex(s.as_string(what + ".chunk_xxh64[]"), what + ".chunk_xxh64[]"));
  // The geometry must be self-consistent, or the loader would read outside the box.
  const size_t ndim = t.shape.size();
  bool inside = b.box.offsets.size() == ndim && b.box.shape.size() == ndim;
  for (size_t d = 0; inside && d < ndim; ++d)
    inside = b.box.offsets[d] >= 0 && b.box.shape[d] > 0 && b.box.offsets[d] + b.box.shape[d] <= t.shape[d];
  TORCH_CHECK(inside, "checkpoint metadata: '", what, "' has offsets [", join(b.box.offsets, ", "), "] and shape [",
              join(b.box.shape, ", "), "], which is not a non-empty box inside the tensor's shape [", join(t.shape, ", "), "].");
  TORCH_CHECK(b.rows_per_chunk >= 1, "checkpoint metadata: '", what, ".rows_per_chunk' must be at least 1.");
  const ChunkGeometry g = chunk_geometry(b.box.shape, element_size, b.rows_per_chunk);
  TORCH_CHECK(b.begin >= 0 && b.end - b.begin == b.box.numel() * element_size, "checkpoint metadata: '", what,
              ".byte_range' [", b.begin, ", ", b.end, ") does not hold ", b.box.numel(), " elements of ", element_size, " bytes.");
  TORCH_CHECK(static_cast<int64_t>(b.chunk_checksums.size()) == g.num_chunks, "checkpoint metadata: '", what, "' has ",
              b.chunk_checksums.size(), " chunk checksums; its shape and rows_per_chunk make ", g.num_chunks, " chunks.");
  return b;
}

// Note [One writer per box]: the box a rank holds is set by its coordinates on the mesh dims
// that Shard; every rank that agrees on those holds the same box (Replicate dims, and Partial
// dims once reduced). Of those, the rank at coordinate 0 on every other mesh dim writes it, so
// each element is written once and every writer writes only what it holds.
bool writes_its_box(const ShardTensorSpec& spec, const std::vector<int64_t>& coordinate) {
  const Placements& ps = spec.placements();
  for (size_t m = 0; m < ps.size(); ++m)
    if (!ps[m].is_shard() && coordinate[m] != 0) return false;
  return true;
}

std::string pad_header(std::string header) {
  while (header.size() % 8 != 0) header += ' ';
  return header;
}

}  // namespace

std::string safetensors_dtype(c10::ScalarType dtype, const std::string& tensor) {
  for (const DtypeName& d : kDtypeNames)
    if (d.dtype == dtype) return d.name;
  TORCH_CHECK(false, "checkpoint::save: '", tensor, "' has dtype ", c10::toString(dtype),
              ", which safetensors cannot name; supported: float64/32/16, bfloat16, int64/32/16/8, uint8 and bool.");
}

c10::ScalarType dtype_from_safetensors(const std::string& name, const std::string& what) {
  for (const DtypeName& d : kDtypeNames)
    if (name == d.name) return d.dtype;
  TORCH_CHECK(false, "checkpoint metadata: '", what, "' is \"", name, "\", not a dtype this build reads.");
}

std::string rank_file_name(int64_t rank) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "rank-%05lld.safetensors", static_cast<long long>(rank));
  return buf;
}

ChunkGeometry chunk_geometry(const std::vector<int64_t>& box_shape, int64_t element_size, int64_t rows_per_chunk) {
  ChunkGeometry g;
  g.rows = box_shape.empty() ? 1 : box_shape[0];
  int64_t row_elements = 1;
  for (size_t d = 1; d < box_shape.size(); ++d) row_elements *= box_shape[d];
  g.row_bytes = row_elements * element_size;
  g.rows_per_chunk = rows_per_chunk;
  g.num_chunks = g.rows == 0 || g.row_bytes == 0 ? 0 : (g.rows + rows_per_chunk - 1) / rows_per_chunk;
  return g;
}

int64_t rows_per_chunk_for(const std::vector<int64_t>& box_shape, int64_t element_size, int64_t chunk_bytes) {
  const ChunkGeometry g = chunk_geometry(box_shape, element_size, 1);
  return std::max<int64_t>(1, g.row_bytes == 0 ? 1 : chunk_bytes / g.row_bytes);
}

const SavedTensor* Metadata::find(const std::string& name) const {
  for (const SavedTensor& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

Json to_json(const Metadata& m) {
  Json doc = Json::object();
  doc.set("format", Json::string(kFormatName));
  doc.set("version", Json::integer(m.version));
  doc.set("world_size", Json::integer(m.world_size));
  doc.set("chunk_bytes", Json::integer(m.chunk_bytes));
  doc.set("checksum", Json::string("xxh64"));
  Json tensors = Json::object();
  for (const SavedTensor& t : m.tensors) {
    Json j = Json::object();
    j.set("dtype", Json::string(safetensors_dtype(t.dtype, t.name)));
    j.set("shape", Json::int_array(t.shape));
    j.set("mesh_shape", Json::int_array(t.mesh_shape));
    j.set("placements", Json::string(t.placements));
    Json boxes = Json::array();
    for (const SavedBox& b : t.boxes) boxes.push(box_to_json(b));
    j.set("boxes", std::move(boxes));
    tensors.set(t.name, std::move(j));
  }
  doc.set("tensors", std::move(tensors));
  return doc;
}

Metadata metadata_from_json(const Json& doc, const std::string& source) {
  TORCH_CHECK(doc.is_object(), "checkpoint: ", source, " is not a JSON object.");
  const Json* format = doc.find("format");
  TORCH_CHECK(format && format->kind() == Json::Kind::String && format->as_string("format") == kFormatName, "checkpoint: ",
              source, " is not shardtensor checkpoint metadata (its \"format\" should be \"", kFormatName, "\").");
  Metadata m;
  m.version = doc.at("version", "version").as_int("version");
  TORCH_CHECK(m.version <= kFormatVersion, "checkpoint: ", source, " has format version ", m.version,
              ", but this build of shardtensor reads versions up to ", kFormatVersion,
              ". It was written by a newer shardtensor; load it with that version or newer.");
  TORCH_CHECK(m.version >= 1, "checkpoint: ", source, " has format version ", m.version, ", which never existed.");
  m.world_size = doc.at("world_size", "world_size").as_int("world_size");
  m.chunk_bytes = doc.at("chunk_bytes", "chunk_bytes").as_int("chunk_bytes");
  const std::string& checksum = doc.at("checksum", "checksum").as_string("checksum");
  TORCH_CHECK(checksum == "xxh64", "checkpoint: ", source, " uses checksum \"", checksum, "\"; this build knows \"xxh64\".");
  for (const auto& [name, j] : doc.at("tensors", "tensors").as_object("tensors")) {
    const std::string what = "tensors." + name;
    SavedTensor t;
    t.name = name;
    t.dtype = dtype_from_safetensors(j.at("dtype", what).as_string(what + ".dtype"), what + ".dtype");
    t.shape = j.at("shape", what).as_int_array(what + ".shape");
    for (int64_t s : t.shape) TORCH_CHECK(s >= 0, "checkpoint metadata: '", what, ".shape' has a negative size.");
    t.mesh_shape = j.at("mesh_shape", what).as_int_array(what + ".mesh_shape");
    t.placements = j.at("placements", what).as_string(what + ".placements");
    const int64_t element_size = static_cast<int64_t>(c10::elementSize(t.dtype));
    const std::vector<Json>& boxes = j.at("boxes", what).as_array(what + ".boxes");
    for (size_t i = 0; i < boxes.size(); ++i)
      t.boxes.push_back(box_from_json(boxes[i], t, element_size, what + ".boxes[" + std::to_string(i) + "]"));
    int64_t covered = 0, numel = 1;
    for (const SavedBox& b : t.boxes) covered += b.box.numel();
    for (int64_t s : t.shape) numel *= s;
    TORCH_CHECK(covered == numel, "checkpoint metadata: the boxes of '", name, "' hold ", covered, " elements, but its shape [",
                join(t.shape, ", "), "] has ", numel, ": some of it was never saved.");
    m.tensors.push_back(std::move(t));
  }
  return m;
}

int64_t RankFilePlan::num_chunks() const {
  int64_t n = 0;
  for (const PlannedEntry& e : entries) n += e.chunks.num_chunks;
  return n;
}

std::vector<RankFilePlan> plan_files(const std::vector<TensorToSave>& tensors, const std::vector<int64_t>& ranks,
                                     int64_t plain_writer, int64_t chunk_bytes) {
  std::vector<RankFilePlan> plans;
  for (int64_t rank : ranks) {
    RankFilePlan plan;
    plan.rank = rank;
    plan.file = rank_file_name(rank);
    for (size_t i = 0; i < tensors.size(); ++i) {
      const TensorToSave& t = tensors[i];
      Box box;
      if (t.spec) {
        const DeviceMesh& mesh = t.spec->mesh();
        const std::vector<int64_t> coordinate = mesh.coordinate_of(rank);
        if (!writes_its_box(*t.spec, coordinate)) continue;
        box = box_of(*t.spec, coordinate);
      } else {
        if (rank != plain_writer) continue;
        box = Box{std::vector<int64_t>(t.shape.size(), 0), t.shape};
      }
      if (box.empty()) continue;
      PlannedEntry e;
      e.tensor = i;
      e.box = box;
      const int64_t element_size = static_cast<int64_t>(c10::elementSize(t.dtype));
      e.chunks = chunk_geometry(box.shape, element_size, rows_per_chunk_for(box.shape, element_size, chunk_bytes));
      e.end = box.numel() * element_size;  // relative to the data section until the header is known
      plan.entries.push_back(std::move(e));
    }
    if (plan.entries.empty()) continue;
    // safetensors: entries keyed by tensor name, data_offsets relative to the data section and
    // laid out back to back in entry order.
    Json header = Json::object();
    Json meta = Json::object();
    meta.set("format", Json::string(kFormatName));
    meta.set("rank", Json::string(std::to_string(rank)));
    for (const PlannedEntry& e : plan.entries)
      meta.set("offsets:" + tensors[e.tensor].name, Json::string(join(e.box.offsets, ",")));
    header.set("__metadata__", std::move(meta));
    int64_t at = 0;
    for (PlannedEntry& e : plan.entries) {
      const TensorToSave& t = tensors[e.tensor];
      Json j = Json::object();
      j.set("dtype", Json::string(safetensors_dtype(t.dtype, t.name)));
      j.set("shape", Json::int_array(e.box.shape));
      j.set("data_offsets", Json::int_array({at, at + e.end}));
      header.set(t.name, std::move(j));
      e.begin = at;
      at += e.end;
      e.end = at;
    }
    plan.header = pad_header(header.dump());
    const int64_t data_start = 8 + static_cast<int64_t>(plan.header.size());
    for (PlannedEntry& e : plan.entries) {
      e.begin += data_start;
      e.end += data_start;
    }
    plans.push_back(std::move(plan));
  }
  return plans;
}

}  // namespace shardtensor::checkpoint
