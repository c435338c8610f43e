// What the benchmark programs share for their machine-readable output (bench/regenerate.py
// reads it): min / median / max of a list of samples, a few command-line options, and JSON
// objects written through nlohmann-json. Header-only, no torch.
//
//   --json FILE   rank 0 also writes its figures to FILE as one JSON object
//   --runs N      (where a program supports it) timed runs per figure
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
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

using Json = nlohmann::ordered_json;  // keys in the order they are added

// One JSON object built field by field: Object().add("a", 1.0).add("b", Object()...). Values are
// anything nlohmann-json converts (numbers, strings, vectors), Stats and other Objects; a
// non-finite number is written as null.
class Object {
 public:
  template <typename T>
  Object& add(const std::string& key, const T& value) {
    json_[key] = value;
    return *this;
  }
  const Json& json() const { return json_; }

 private:
  Json json_ = Json::object();
};

inline void to_json(Json& j, const Stats& s) { j = Json{{"min", s.min}, {"median", s.median}, {"max", s.max}}; }
inline void to_json(Json& j, const Object& o) { j = o.json(); }

// Writes `object` to `path` (nothing when path is empty); exits non-zero when it cannot.
inline void write(const std::string& path, const Object& object) {
  if (path.empty()) return;
  std::ofstream out(path);
  out << object.json().dump() << "\n";
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

}  // namespace bench_report
