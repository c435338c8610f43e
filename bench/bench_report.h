// What the benchmark programs share for their machine-readable output (bench/regenerate.py
// reads it): min / median / max of a list of samples, a few command-line options, and a small
// JSON writer. Header-only, no torch.
//
//   --json FILE   rank 0 also writes its figures to FILE as one JSON object
//   --runs N      (where a program supports it) timed runs per figure
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace bench_report {

struct Stats {
  double min = 0, median = 0, max = 0;
};

// The median is the upper middle sample for an even count (what the programs always took).
inline Stats stats_of(std::vector<double> samples) {
  if (samples.empty()) return {};
  std::sort(samples.begin(), samples.end());
  return {samples.front(), samples[samples.size() / 2], samples.back()};
}

// The value after `name` on the command line, or "" when it is not there.
inline std::string option(int argc, char** argv, const std::string& name) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == name) return argv[i + 1];
  return "";
}

inline bool flag(int argc, char** argv, const std::string& name) {
  for (int i = 1; i < argc; ++i)
    if (argv[i] == name) return true;
  return false;
}

inline int int_option(int argc, char** argv, const std::string& name, int fallback) {
  const std::string v = option(argc, argv, name);
  if (v.empty()) return fallback;
  const int n = std::atoi(v.c_str());
  if (n <= 0) {
    std::fprintf(stderr, "%s wants a positive number, got '%s'\n", name.c_str(), v.c_str());
    std::exit(2);
  }
  return n;
}

inline std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

inline std::string number(double v) {
  if (!std::isfinite(v)) return "null";
  std::ostringstream s;
  s.precision(6);
  s << v;
  return s.str();
}

inline std::string json(const Stats& s) {
  return "{\"min\": " + number(s.min) + ", \"median\": " + number(s.median) + ", \"max\": " + number(s.max) + "}";
}

// One JSON object built field by field: Object().add("a", 1.0).add("b", Object()...).str()
class Object {
 public:
  Object& raw(const std::string& key, const std::string& json_text) {
    fields_.push_back(quoted(key) + ": " + json_text);
    return *this;
  }
  Object& add(const std::string& key, const std::string& value) { return raw(key, quoted(value)); }
  Object& add(const std::string& key, const char* value) { return raw(key, quoted(value)); }
  Object& add(const std::string& key, double value) { return raw(key, number(value)); }
  template <typename Int, std::enable_if_t<std::is_integral_v<Int>, int> = 0>
  Object& add(const std::string& key, Int value) {
    return raw(key, std::to_string(value));
  }
  Object& add(const std::string& key, const Stats& value) { return raw(key, json(value)); }
  Object& add(const std::string& key, const Object& value) { return raw(key, value.str()); }
  Object& add(const std::string& key, const std::vector<Object>& values) {
    std::string list = "[";
    for (size_t i = 0; i < values.size(); ++i) list += (i ? ",\n  " : "\n  ") + values[i].str();
    return raw(key, list + (values.empty() ? "]" : "\n]"));
  }
  template <typename Int, std::enable_if_t<std::is_integral_v<Int>, int> = 0>
  Object& add(const std::string& key, const std::vector<Int>& values) {
    std::string list = "[";
    for (size_t i = 0; i < values.size(); ++i) list += (i ? ", " : "") + std::to_string(values[i]);
    return raw(key, list + "]");
  }
  std::string str() const {
    std::string out = "{";
    for (size_t i = 0; i < fields_.size(); ++i) out += (i ? ", " : "") + fields_[i];
    return out + "}";
  }

 private:
  std::vector<std::string> fields_;
};

// Writes `object` to `path` (nothing when path is empty); exits non-zero when it cannot.
inline void write(const std::string& path, const Object& object) {
  if (path.empty()) return;
  std::ofstream out(path);
  out << object.str() << "\n";
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

}  // namespace bench_report
