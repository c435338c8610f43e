// A small JSON value, writer and strict parser for the checkpoint metadata and the safetensors
// headers. It covers exactly the subset the checkpoint emits and nothing more, so that no JSON
// dependency enters the project:
//   - values: object (key order kept), array, string, integer (int64), true/false, null;
//   - strings: UTF-8; the writer escapes '"', '\\' and control characters; the parser accepts
//     the standard escapes and \uXXXX (surrogate pairs included);
//   - numbers: integers only (no fraction, no exponent): shapes, offsets and byte ranges.
//     Checksums are 64-bit unsigned, so they travel as hex strings.
// The parser is strict: trailing commas, duplicate keys, leading zeros, trailing text and
// nesting deeper than 64 raise, with the byte offset of the problem.
// What does not live here: the meaning of any key (see checkpoint/format.h).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace shardtensor::checkpoint {

class Json {
 public:
  enum class Kind { Null, Bool, Int, String, Array, Object };

  Json() = default;  // null
  static Json boolean(bool b);
  static Json integer(int64_t v);
  static Json string(std::string s);
  static Json array(std::vector<Json> items = {});
  static Json object();
  static Json int_array(const std::vector<int64_t>& values);

  Kind kind() const { return kind_; }
  bool is_object() const { return kind_ == Kind::Object; }

  // Builders (raise on the wrong kind).
  Json& set(const std::string& key, Json value);  // object: appends; the key must be new
  Json& push(Json value);                         // array

  // Readers: raise with `what` (a path such as "tensors.w.shape") when the kind is wrong or a
  // key is missing, so a malformed file says where.
  bool as_bool(const std::string& what) const;
  int64_t as_int(const std::string& what) const;
  const std::string& as_string(const std::string& what) const;
  const std::vector<Json>& as_array(const std::string& what) const;
  const std::vector<std::pair<std::string, Json>>& as_object(const std::string& what) const;
  std::vector<int64_t> as_int_array(const std::string& what) const;
  const Json& at(const std::string& key, const std::string& what) const;  // object member
  const Json* find(const std::string& key) const;                         // nullptr when absent

  std::string dump() const;  // compact, no whitespace

 private:
  Kind kind_ = Kind::Null;
  bool bool_ = false;
  int64_t int_ = 0;
  std::string string_;
  std::vector<Json> items_;
  std::vector<std::pair<std::string, Json>> members_;
};

// Parses one JSON document; raises c10::Error naming `source` (a file name) and the offset.
Json parse_json(const std::string& text, const std::string& source);

}  // namespace shardtensor::checkpoint
