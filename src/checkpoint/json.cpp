// See json.h.
#include "checkpoint/json.h"

#include <c10/util/Exception.h>

#include <cstdio>
#include <limits>

namespace shardtensor::checkpoint {
namespace {

const char* kind_name(Json::Kind k) {
  switch (k) {
    case Json::Kind::Null: return "null";
    case Json::Kind::Bool: return "a boolean";
    case Json::Kind::Int: return "an integer";
    case Json::Kind::String: return "a string";
    case Json::Kind::Array: return "an array";
    case Json::Kind::Object: return "an object";
  }
  return "?";
}

void expect_kind(const Json& j, Json::Kind k, const std::string& what) {
  TORCH_CHECK(j.kind() == k, "checkpoint metadata: '", what, "' should be ", kind_name(k), " but is ", kind_name(j.kind()), ".");
}

void dump_string(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else out += static_cast<char>(c);
  }
  out += '"';
}

void dump_to(const Json& j, std::string& out);

class Parser {
 public:
  Parser(const std::string& text, const std::string& source) : text_(text), source_(source) {}

  Json document() {
    Json v = value(0);
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) {
    TORCH_CHECK(false, "checkpoint: ", source_, " is not valid JSON at byte ", pos_, ": ", why, ".");
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' || text_[pos_] == '\r' || text_[pos_] == '\t')) ++pos_;
  }
  char peek() {
    skip_space();
    if (pos_ >= text_.size()) fail("unexpected end of text");
    return text_[pos_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  bool consume_word(const char* word) {
    const std::string w(word);
    if (text_.compare(pos_, w.size(), w) != 0) return false;
    pos_ += w.size();
    return true;
  }

  Json value(int depth) {
    if (depth > 64) fail("nesting deeper than 64");
    const char c = peek();
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') return Json::string(string());
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    if (consume_word("true")) return Json::boolean(true);
    if (consume_word("false")) return Json::boolean(false);
    if (consume_word("null")) return Json();
    fail(std::string("unexpected character '") + c + "'");
  }

  Json object(int depth) {
    expect('{');
    Json out = Json::object();
    if (peek() == '}') {
      ++pos_;
      return out;
    }
    while (true) {
      if (peek() != '"') fail("expected a string key");
      std::string key = string();
      if (out.find(key)) fail("duplicate key '" + key + "'");
      expect(':');
      out.set(key, value(depth + 1));
      const char c = peek();
      ++pos_;
      if (c == '}') return out;
      if (c != ',') fail("expected ',' or '}'");
    }
  }

  Json array(int depth) {
    expect('[');
    Json out = Json::array();
    if (peek() == ']') {
      ++pos_;
      return out;
    }
    while (true) {
      out.push(value(depth + 1));
      const char c = peek();
      ++pos_;
      if (c == ']') return out;
      if (c != ',') fail("expected ',' or ']'");
    }
  }

  Json number() {
    const size_t start = pos_;
    bool negative = false;
    if (text_[pos_] == '-') {
      negative = true;
      ++pos_;
    }
    if (pos_ >= text_.size() || text_[pos_] < '0' || text_[pos_] > '9') fail("expected a digit");
    if (text_[pos_] == '0' && pos_ + 1 < text_.size() && text_[pos_ + 1] >= '0' && text_[pos_ + 1] <= '9') fail("leading zero");
    uint64_t magnitude = 0;
    const uint64_t limit = negative ? uint64_t(std::numeric_limits<int64_t>::max()) + 1 : uint64_t(std::numeric_limits<int64_t>::max());
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      const uint64_t digit = uint64_t(text_[pos_] - '0');
      if (magnitude > (limit - digit) / 10) {
        pos_ = start;
        fail("integer out of the int64 range");
      }
      magnitude = magnitude * 10 + digit;
      ++pos_;
    }
    if (pos_ < text_.size() && (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E'))
      fail("only integers are expected here (no fraction or exponent)");
    return Json::integer(negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude));
  }

  uint32_t hex4() {
    if (pos_ + 4 > text_.size()) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= uint32_t(c - '0');
      else if (c >= 'a' && c <= 'f') v |= uint32_t(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= uint32_t(c - 'A' + 10);
      else fail("bad hex digit in \\u escape");
    }
    return v;
  }

  static void append_utf8(uint32_t cp, std::string& out) {
    if (cp < 0x80) out += char(cp);
    else if (cp < 0x800) {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    }
  }

  std::string string() {
    expect('"');
    std::string out;
    while (true) {
      if (pos_ >= text_.size()) fail("unterminated string");
      const unsigned char c = static_cast<unsigned char>(text_[pos_++]);
      if (c == '"') return out;
      if (c < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += char(c);
        continue;
      }
      if (pos_ >= text_.size()) fail("unterminated escape");
      const char e = text_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {
            if (!consume_word("\\u")) fail("unpaired surrogate");
            const uint32_t low = hex4();
            if (low < 0xDC00 || low >= 0xE000) fail("unpaired surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            fail("unpaired surrogate");
          }
          append_utf8(cp, out);
          break;
        }
        default: fail(std::string("unknown escape '\\") + e + "'");
      }
    }
  }

  const std::string& text_;
  const std::string& source_;
  size_t pos_ = 0;
};

void dump_to(const Json& j, std::string& out) {
  switch (j.kind()) {
    case Json::Kind::Null: out += "null"; break;
    case Json::Kind::Bool: out += j.as_bool("") ? "true" : "false"; break;
    case Json::Kind::Int: out += std::to_string(j.as_int("")); break;
    case Json::Kind::String: dump_string(j.as_string(""), out); break;
    case Json::Kind::Array: {
      out += '[';
      bool first = true;
      for (const Json& item : j.as_array("")) {
        if (!first) out += ',';
        first = false;
        dump_to(item, out);
      }
      out += ']';
      break;
    }
    case Json::Kind::Object: {
      out += '{';
      bool first = true;
      for (const auto& [key, value] : j.as_object("")) {
        if (!first) out += ',';
        first = false;
        dump_string(key, out);
        out += ':';
        dump_to(value, out);
      }
      out += '}';
      break;
    }
  }
}

}  // namespace

Json Json::boolean(bool b) {
  Json j;
  j.kind_ = Kind::Bool;
  j.bool_ = b;
  return j;
}
Json Json::integer(int64_t v) {
  Json j;
  j.kind_ = Kind::Int;
  j.int_ = v;
  return j;
}
Json Json::string(std::string s) {
  Json j;
  j.kind_ = Kind::String;
  j.string_ = std::move(s);
  return j;
}
Json Json::array(std::vector<Json> items) {
  Json j;
  j.kind_ = Kind::Array;
  j.items_ = std::move(items);
  return j;
}
Json Json::object() {
  Json j;
  j.kind_ = Kind::Object;
  return j;
}
Json Json::int_array(const std::vector<int64_t>& values) {
  Json j = array();
  for (int64_t v : values) j.items_.push_back(integer(v));
  return j;
}

Json& Json::set(const std::string& key, Json value) {
  TORCH_INTERNAL_ASSERT(kind_ == Kind::Object && !find(key), "Json::set: not an object or duplicate key ", key);
  members_.emplace_back(key, std::move(value));
  return *this;
}
Json& Json::push(Json value) {
  TORCH_INTERNAL_ASSERT(kind_ == Kind::Array, "Json::push on a non-array");
  items_.push_back(std::move(value));
  return *this;
}

bool Json::as_bool(const std::string& what) const {
  expect_kind(*this, Kind::Bool, what);
  return bool_;
}
int64_t Json::as_int(const std::string& what) const {
  expect_kind(*this, Kind::Int, what);
  return int_;
}
const std::string& Json::as_string(const std::string& what) const {
  expect_kind(*this, Kind::String, what);
  return string_;
}
const std::vector<Json>& Json::as_array(const std::string& what) const {
  expect_kind(*this, Kind::Array, what);
  return items_;
}
const std::vector<std::pair<std::string, Json>>& Json::as_object(const std::string& what) const {
  expect_kind(*this, Kind::Object, what);
  return members_;
}
std::vector<int64_t> Json::as_int_array(const std::string& what) const {
  std::vector<int64_t> out;
  for (const Json& item : as_array(what)) out.push_back(item.as_int(what + "[]"));
  return out;
}
const Json* Json::find(const std::string& key) const {
  if (kind_ != Kind::Object) return nullptr;
  for (const auto& [k, v] : members_)
    if (k == key) return &v;
  return nullptr;
}
const Json& Json::at(const std::string& key, const std::string& what) const {
  expect_kind(*this, Kind::Object, what);
  const Json* v = find(key);
  TORCH_CHECK(v, "checkpoint metadata: '", what, "' has no key '", key, "'.");
  return *v;
}

std::string Json::dump() const {
  std::string out;
  dump_to(*this, out);
  return out;
}

Json parse_json(const std::string& text, const std::string& source) { return Parser(text, source).document(); }

}  // namespace shardtensor::checkpoint
