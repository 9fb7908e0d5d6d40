// A parameter's tensors in a Hugging Face folder. Most parameters are one tensor of the table's
// name; a mixture of experts' stacked expert weights (TensorRole::ExpertGateUp, ExpertDown) are
// one tensor per expert in the Hub's layout, which transformers 5's save_pretrained writes too,
// or transformers 5's fused 3-D tensors (FamilyDesc::hf_experts has the names). Each such tensor
// is a contiguous slice of the stacked parameter: expert e's gate rows, its up rows, its down
// projection.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tetrad/model/model_config.hpp"
#include "tetrad/model/params.hpp"

namespace tetrad {

// One tensor of a folder: `numel` floats at element `offset` of its parameter.
struct HfPiece {
  std::string name;
  std::vector<int64_t> shape;  // in the file
  int64_t offset = 0;
  int64_t numel = 0;
  bool transposed = false;  // the file holds the transpose of the parameter (GPT-2's Conv1D)
};
// Every tensor of one layout of a parameter, covering it exactly.
using HfLayout = std::vector<HfPiece>;

// The layouts of parameter `s` a folder may hold: the first is what export writes (the Hub's
// per-expert tensors for experts), the others what import accepts as well (transformers 5's
// fused tensors; tetrad's own stacked tensor under the table's name, which run checkpoints held
// before experts were split), in that order of preference.
std::vector<HfLayout> hf_layouts(const ModelConfig& c, const ParamSpec& s);

}  // namespace tetrad
