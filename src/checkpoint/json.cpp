// See json.h.
#include "checkpoint/json.h"

#include <c10/util/Exception.h>

#include <limits>
#include <set>

namespace shardtensor::checkpoint {
namespace {

const char* kind_name(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "an integer";
    case Json::value_t::number_float: return "a number with a fraction or an exponent, or beyond 64 bits";
    case Json::value_t::string: return "a string";
    case Json::value_t::array: return "an array";
    case Json::value_t::object: return "an object";
    case Json::value_t::binary:
    case Json::value_t::discarded: break;
  }
  return "not a JSON value";
}

[[noreturn]] void wrong_kind(const Json& j, const char* expected, const std::string& what) {
  TORCH_CHECK(false, "checkpoint metadata: '", what, "' should be ", expected, " but is ", kind_name(j), ".");
}

// See Note [Version 1 JSON text]. In dumped JSON a backslash only ever starts an escape, so
// reading escapes pairwise never mistakes an escaped backslash followed by 'n' for "\n".
std::string with_version1_escapes(std::string text) {
  if (text.find('\\') == std::string::npos) return text;
  std::string out;
  out.reserve(text.size() + 16);
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\\') {
      out += text[i];
      continue;
    }
    TORCH_INTERNAL_ASSERT(i + 1 < text.size(), "dumped JSON ends inside an escape");
    const char e = text[++i];
    switch (e) {
      case 'b': out += "\\u0008"; break;
      case 't': out += "\\u0009"; break;
      case 'n': out += "\\u000a"; break;
      case 'f': out += "\\u000c"; break;
      case 'r': out += "\\u000d"; break;
      default:
        out += '\\';
        out += e;
    }
  }
  return out;
}

}  // namespace

std::string dump_json(const Json& doc, const std::string& what) {
  std::string text;
  try {
    text = doc.dump();
  } catch (const Json::type_error& e) {
    TORCH_CHECK(false, "checkpoint: ", what, " cannot be written as JSON: ", e.what(), ". Names must be valid UTF-8.");
  }
  return with_version1_escapes(std::move(text));
}

bool is_valid_utf8(const std::string& s) {
  try {
    (void)Json(s).dump();
    return true;
  } catch (const Json::type_error&) {
    return false;
  }
}

Json parse_json(const std::string& text, const std::string& source) {
  // The keys seen so far in each open object, innermost last.
  std::vector<std::set<std::string>> open_objects;
  const Json::parser_callback_t refuse_repeated_keys = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == Json::parse_event_t::object_end) {
      open_objects.pop_back();
    } else if (event == Json::parse_event_t::key) {
      const std::string& key = parsed.get_ref<const std::string&>();
      TORCH_CHECK(open_objects.back().insert(key).second, "checkpoint: ", source, " is not valid JSON: the key \"", key,
                  "\" appears twice in one object.");
    }
    return true;
  };
  try {
    return Json::parse(text, refuse_repeated_keys);
  } catch (const Json::parse_error& e) {
    // what() is "[json.exception.parse_error.N] parse error at line L, column C: <why>".
    std::string why = e.what();
    const size_t colon = why.find(": ");
    if (colon != std::string::npos) why = why.substr(colon + 2);
    TORCH_CHECK(false, "checkpoint: ", source, " is not valid JSON at byte ", e.byte, ": ", why, ".");
  }
}

int64_t as_int(const Json& j, const std::string& what) {
  if (j.is_number_unsigned()) {  // the parser reads every non-negative integer as unsigned
    const uint64_t v = j.get<uint64_t>();
    TORCH_CHECK(v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), "checkpoint metadata: '", what, "' is ", v,
                ", outside the int64 range.");
    return static_cast<int64_t>(v);
  }
  if (!j.is_number_integer()) wrong_kind(j, "an integer", what);
  return j.get<int64_t>();
}

const std::string& as_string(const Json& j, const std::string& what) {
  if (!j.is_string()) wrong_kind(j, "a string", what);
  return j.get_ref<const std::string&>();
}

const Json::array_t& as_array(const Json& j, const std::string& what) {
  if (!j.is_array()) wrong_kind(j, "an array", what);
  return j.get_ref<const Json::array_t&>();
}

const Json::object_t& as_object(const Json& j, const std::string& what) {
  if (!j.is_object()) wrong_kind(j, "an object", what);
  return j.get_ref<const Json::object_t&>();
}

std::vector<int64_t> as_int_array(const Json& j, const std::string& what) {
  std::vector<int64_t> out;
  for (const Json& item : as_array(j, what)) out.push_back(as_int(item, what + "[]"));
  return out;
}

const Json& member(const Json& object, const std::string& key, const std::string& what) {
  if (!object.is_object()) wrong_kind(object, "an object", what);
  const Json* v = find_member(object, key);
  if (!v && what.empty()) TORCH_CHECK(false, "checkpoint metadata: the top-level object has no key '", key, "'.");
  TORCH_CHECK(v, "checkpoint metadata: '", what, "' has no key '", key, "'.");
  return *v;
}

const Json* find_member(const Json& object, const std::string& key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

}  // namespace shardtensor::checkpoint
