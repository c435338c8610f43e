// join(): the one helper every error message uses to print a list ("2x3", "[1, 4, 2]").
#pragma once

#include <sstream>
#include <string>

namespace shardtensor {

template <typename Container>
std::string join(const Container& items, const char* separator) {
  std::ostringstream os;
  bool first = true;
  for (const auto& item : items) {
    if (!first) os << separator;
    os << item;
    first = false;
  }
  return os.str();
}

}  // namespace shardtensor
