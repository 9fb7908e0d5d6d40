// A model's weights alone, drawn at random: what the checkpoint tests write and read back
// (test_checkpoint.cpp, test_hf_moe.cpp).
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

#include "support/test_files.hpp"
#include "tetrad/model/model_config.hpp"
#include "tetrad/model/params.hpp"

namespace tetrad_test {

struct RandomModel {
  tetrad::ModelConfig cfg;
  tetrad::ParamTable table;
  std::vector<float> params;
};

// Every parameter of `cfg`'s table drawn from N(0, 1) (random_floats) with `seed`.
inline RandomModel random_model(const tetrad::ModelConfig& cfg, uint32_t seed) {
  RandomModel m{cfg, tetrad::build_param_table(cfg), {}};
  m.params = random_floats(size_t(m.table.total), seed);
  return m;
}

// The same floats, bit for bit (NaN payloads and signed zeros included).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

}  // namespace tetrad_test
