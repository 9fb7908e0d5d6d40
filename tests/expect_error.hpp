// expect_error(f, {parts...}): runs f, which must throw tetrad::Error whose message names every one
// of `parts` (what was wrong and what was expected). Returns the message for further checks.
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tetrad/core/error.hpp"

namespace tetrad_test {

template <typename F>
std::string expect_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const tetrad::Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "message lacks '" << p << "': " << msg;
    return msg;
  }
  ADD_FAILURE() << "expected tetrad::Error";
  return "";
}

}  // namespace tetrad_test
