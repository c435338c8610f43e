// See format.h.
#include "checkpoint/format.h"

#include <c10/util/Exception.h>

#include <cstdio>
#include <set>

#include "checkpoint/checksum.h"
#include "checkpoint/json.h"
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

// The members in the order they are set: that order is part of the text (Note [Version 1 JSON
// text] in json.h).
Json box_to_json(const SavedBox& b) {
  Json j = Json::object();
  j["offsets"] = b.box.offsets;
  j["shape"] = b.box.shape;
  j["file"] = b.file;
  j["byte_range"] = std::vector<int64_t>{b.begin, b.end};
  j["rows_per_chunk"] = b.rows_per_chunk;
  Json sums = Json::array();
  for (uint64_t s : b.chunk_checksums) sums.push_back(to_hex(s));
  j["chunk_xxh64"] = std::move(sums);
  return j;
}

// A file name from the metadata must stay inside the checkpoint directory.
void check_file_name(const std::string& file, const std::string& what) {
  TORCH_CHECK(!file.empty() && file.find('/') == std::string::npos && file != "." && file != "..",
              "checkpoint metadata: '", what, "' is \"", file, "\", which is not a file name inside the checkpoint directory.");
}

SavedBox box_from_json(const Json& j, const SavedTensor& t, int64_t element_size, const std::string& what) {
  SavedBox b;
  b.box.offsets = as_int_array(member(j, "offsets", what), what + ".offsets");
  b.box.shape = as_int_array(member(j, "shape", what), what + ".shape");
  b.file = as_string(member(j, "file", what), what + ".file");
  check_file_name(b.file, what + ".file");
  const std::vector<int64_t> range = as_int_array(member(j, "byte_range", what), what + ".byte_range");
  TORCH_CHECK(range.size() == 2, "checkpoint metadata: '", what, ".byte_range' should be [begin, end].");
  b.begin = range[0];
  b.end = range[1];
  b.rows_per_chunk = as_int(member(j, "rows_per_chunk", what), what + ".rows_per_chunk");
  for (const Json& s : as_array(member(j, "chunk_xxh64", what), what + ".chunk_xxh64"))
    b.chunk_checksums.push_back(from_hex(as_string(s, what + ".chunk_xxh64[]"), what + ".chunk_xxh64[]"));
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

void check_tensor_name(const std::string& name, const char* api) {
  TORCH_CHECK(!name.empty() && name != "__metadata__", api, ": \"", name, "\" cannot name a tensor in safetensors.");
  TORCH_CHECK(is_valid_utf8(name), api, ": the tensor name \"", name, "\" is not valid UTF-8. Checkpoint names are keys in ",
              "JSON text (metadata.json and the safetensors headers), which must be UTF-8; rename the tensor.");
}

std::string metadata_text(const Metadata& m) {
  // The members in the order they are set: that order is part of the text.
  Json doc = Json::object();
  doc["format"] = kFormatName;
  doc["version"] = m.version;
  doc["world_size"] = m.world_size;
  doc["chunk_bytes"] = m.chunk_bytes;
  doc["checksum"] = "xxh64";
  Json tensors = Json::object();
  for (const SavedTensor& t : m.tensors) {
    Json j = Json::object();
    j["dtype"] = safetensors_dtype(t.dtype, t.name);
    j["shape"] = t.shape;
    j["mesh_shape"] = t.mesh_shape;
    j["placements"] = t.placements;
    Json boxes = Json::array();
    for (const SavedBox& b : t.boxes) boxes.push_back(box_to_json(b));
    j["boxes"] = std::move(boxes);
    TORCH_INTERNAL_ASSERT(!tensors.contains(t.name), "metadata_text: tensor ", t.name, " twice");
    tensors[t.name] = std::move(j);
  }
  doc["tensors"] = std::move(tensors);
  return dump_json(doc, kMetadataFile) + "\n";
}

Metadata parse_metadata(const std::string& text, const std::string& source) {
  const Json doc = parse_json(text, source);
  TORCH_CHECK(doc.is_object(), "checkpoint: ", source, " is not a JSON object.");
  const Json* format = find_member(doc, "format");
  TORCH_CHECK(format && format->is_string() && format->get_ref<const std::string&>() == kFormatName, "checkpoint: ", source,
              " is not shardtensor checkpoint metadata (its \"format\" should be \"", kFormatName, "\").");
  Metadata m;
  m.version = as_int(member(doc, "version", ""), "version");
  TORCH_CHECK(m.version <= kFormatVersion, "checkpoint: ", source, " has format version ", m.version,
              ", but this build of shardtensor reads versions up to ", kFormatVersion,
              ". It was written by a newer shardtensor; load it with that version or newer.");
  TORCH_CHECK(m.version >= 1, "checkpoint: ", source, " has format version ", m.version, ", which never existed.");
  m.world_size = as_int(member(doc, "world_size", ""), "world_size");
  m.chunk_bytes = as_int(member(doc, "chunk_bytes", ""), "chunk_bytes");
  const std::string& checksum = as_string(member(doc, "checksum", ""), "checksum");
  TORCH_CHECK(checksum == "xxh64", "checkpoint: ", source, " uses checksum \"", checksum, "\"; this build knows \"xxh64\".");
  for (const auto& [name, j] : as_object(member(doc, "tensors", ""), "tensors")) {
    const std::string what = "tensors." + name;
    SavedTensor t;
    t.name = name;
    t.dtype = dtype_from_safetensors(as_string(member(j, "dtype", what), what + ".dtype"), what + ".dtype");
    t.shape = as_int_array(member(j, "shape", what), what + ".shape");
    for (int64_t s : t.shape) TORCH_CHECK(s >= 0, "checkpoint metadata: '", what, ".shape' has a negative size.");
    t.mesh_shape = as_int_array(member(j, "mesh_shape", what), what + ".mesh_shape");
    t.placements = as_string(member(j, "placements", what), what + ".placements");
    const int64_t element_size = static_cast<int64_t>(c10::elementSize(t.dtype));
    const Json::array_t& boxes = as_array(member(j, "boxes", what), what + ".boxes");
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
    meta["format"] = kFormatName;
    meta["rank"] = std::to_string(rank);
    for (const PlannedEntry& e : plan.entries) meta["offsets:" + tensors[e.tensor].name] = join(e.box.offsets, ",");
    header["__metadata__"] = std::move(meta);
    int64_t at = 0;
    for (PlannedEntry& e : plan.entries) {
      const TensorToSave& t = tensors[e.tensor];
      Json j = Json::object();
      j["dtype"] = safetensors_dtype(t.dtype, t.name);
      j["shape"] = e.box.shape;
      j["data_offsets"] = std::vector<int64_t>{at, at + e.end};
      header[t.name] = std::move(j);
      e.begin = at;
      at += e.end;
      e.end = at;
    }
    plan.header = pad_header(dump_json(header, plan.file + "'s safetensors header"));
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
