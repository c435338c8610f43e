// The checkpoint's JSON, on nlohmann-json (ordered_json: object keys keep their insertion
// order). Only format.cpp includes this header; the rest of the checkpoint sees the metadata
// as values (checkpoint/format.h). What lives here is what the library does not do for us:
//   - dump_json writes the text format version 1 has always written (Note [Version 1 JSON
//     text]), so a checkpoint saved today is byte for byte what an older shardtensor saved;
//   - parse_json turns the library's errors into messages that name the file, and refuses a
//     key repeated in one object (the library would keep the last one silently);
//   - typed readers that name the key path ("tensors.w.shape[]") when a value has the wrong
//     kind, is missing, or is an integer outside int64 (shapes, offsets and byte ranges are
//     int64; checksums travel as hex strings, see checksum.h).
// What does not live here: the meaning of any key (format.cpp).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace shardtensor::checkpoint {

using Json = nlohmann::ordered_json;

// Note [Version 1 JSON text]: compact (no whitespace), object members in insertion order,
// integers in decimal, strings as UTF-8 with '"' and '\\' escaped and every control character
// (below 0x20) written as \u00xx in lowercase hex; nothing else is escaped (not '/', not DEL,
// not non-ASCII). nlohmann's compact dump is that text except for five control characters,
// which it writes as \b \f \n \r \t; dump_json rewrites those five. Raises, naming `what`,
// for a string that is not valid UTF-8.
std::string dump_json(const Json& doc, const std::string& what);

// Whether `s` can be a JSON string (valid UTF-8).
bool is_valid_utf8(const std::string& s);

// Parses one JSON document (surrounding whitespace allowed, nothing else after it); raises
// c10::Error naming `source` (a file name), the byte offset and what was expected there.
Json parse_json(const std::string& text, const std::string& source);

// Readers: raise with `what` (a path such as "tensors.w.shape") when the kind is wrong or a
// key is missing, so a malformed file says where.
int64_t as_int(const Json& j, const std::string& what);
const std::string& as_string(const Json& j, const std::string& what);
const Json::array_t& as_array(const Json& j, const std::string& what);
const Json::object_t& as_object(const Json& j, const std::string& what);
std::vector<int64_t> as_int_array(const Json& j, const std::string& what);
const Json& member(const Json& object, const std::string& key, const std::string& what);  // `what` names the object; "" the top level
const Json* find_member(const Json& object, const std::string& key);  // nullptr when absent or not an object

}  // namespace shardtensor::checkpoint
