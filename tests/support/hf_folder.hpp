// Editing a Hugging Face folder that save_hf wrote, to make the bad or other-layout folders the
// import tests read (test_hf_moe.cpp, test_hf_qwen_moe.cpp): config.json read and written, the
// tensors of model.safetensors dropped, renamed, reshaped or added.
#pragma once
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tetrad/checkpoint/safetensors.hpp"

namespace tetrad_test {

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

inline void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream(path) << j.dump(2);
}

// A tensor rewrite_tensors adds after the kept ones; `data` is read when the file is written.
struct AddedTensor {
  std::string name;
  std::vector<int64_t> shape;
  const float* data;
};

// Rewrites dir/model.safetensors through `edit(name, shape, data)`: return false to drop the
// tensor; it may change the name, shape and data. Then `added` follows the kept tensors.
template <typename Edit>
void rewrite_tensors(const std::string& dir, Edit edit, const std::vector<AddedTensor>& added = {}) {
  const std::string path = dir + "/model.safetensors";
  std::vector<std::tuple<std::string, std::vector<int64_t>, std::vector<float>>> kept;
  {
    tetrad::SafetensorsReader r(path);
    for (const tetrad::TensorInfo& t : r.tensors()) {
      std::string name = t.name;
      std::vector<int64_t> shape = t.shape;
      std::vector<float> data = r.read_float(t.name);
      if (edit(name, shape, data)) kept.emplace_back(name, shape, std::move(data));
    }
  }
  tetrad::SafetensorsWriter w;
  for (auto& [name, shape, data] : kept) w.add(name, shape, data.data());
  for (const AddedTensor& t : added) w.add(t.name, t.shape, t.data);
  w.set_metadata("format", "pt");
  w.write(path);
}

// dir/model.safetensors without the tensor `name`.
inline void drop_tensor(const std::string& dir, const std::string& name) {
  rewrite_tensors(dir, [&](std::string& n, auto&, auto&) { return n != name; });
}

// dir/model.safetensors with the tensor `name` of another shape (its data resized to fit).
inline void reshape_tensor(const std::string& dir, const std::string& name,
                           const std::vector<int64_t>& shape) {
  rewrite_tensors(dir, [&](std::string& n, std::vector<int64_t>& s, std::vector<float>& d) {
    if (n == name) {
      s = shape;
      int64_t count = 1;
      for (int64_t x : shape) count *= x;
      d.resize(size_t(count));
    }
    return true;
  });
}

}  // namespace tetrad_test
