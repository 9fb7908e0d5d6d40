// Scratch files and data for tests that write to disk (the checkpoint tests). Header only; needs
// the TETRAD_BINARY_DIR definition every test executable gets (tests/CMakeLists.txt).
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace tetrad_test {

// A fresh, empty folder for the running test: BINARY_DIR/<group>/<suite>.<test>.
inline std::string test_dir(const std::string& group) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path p = std::filesystem::path(TETRAD_BINARY_DIR) / group /
                            (std::string(info->test_suite_name()) + "." + info->name());
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

// n values drawn from N(0, 1), the same for the same seed.
inline std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

}  // namespace tetrad_test
