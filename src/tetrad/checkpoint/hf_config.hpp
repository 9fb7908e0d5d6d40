// A Hugging Face config.json and the ModelConfig it describes, both ways: what hf.hpp writes into
// and reads from model folders, and what sharded checkpoints keep as their model description
// (sharded.hpp). Below both, so neither includes the other for it.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "tetrad/model/model_config.hpp"

namespace tetrad {

// The config.json transformers reads for this model.
nlohmann::json hf_config_json(const ModelConfig& cfg, const nlohmann::json& extra_metadata = {});
// Reads `dir/config.json` into a ModelConfig. Throws Error for an unknown model_type, missing
// size fields, and features this code does not implement (rope_scaling, biases in Llama,
// activations other than gelu_new / gelu_pytorch_tanh (gpt2) or silu (llama), ...). Fields
// that transformers defaults (epsilons, rope_theta, num_key_value_heads) take its defaults.
ModelConfig read_hf_config(const std::string& dir);
ModelConfig parse_hf_config(const nlohmann::json& j, const std::string& where);
// Refuses (naming the setting) a model whose parts the family's Hugging Face model does not have
// (a mixture of experts' shared expert or expert bias): what `tetrad export` would write would
// load in transformers as another model. Run checkpoints keep them (config.json's tetrad_*).
void require_hf_exportable(const ModelConfig& cfg);

// The shortest decimal that reads back as the same float ("1e-05" for 1e-5f): for messages and
// config values.
std::string float_text(float f);

}  // namespace tetrad
