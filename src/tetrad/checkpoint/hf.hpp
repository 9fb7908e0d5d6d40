// Hugging Face model folders: config.json + model.safetensors, as transformers'
// GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM and MixtralForCausalLM write and read them.
//
// Names are the ParamTable's names (already Hugging Face's), but for a mixture of experts'
// stacked expert tensors, written one tensor per expert (the Hub's names) and read per expert or
// fused as transformers 5 holds them (hf_tensors.hpp). GPT-2's Conv1D weights
// (ParamSpec::hf_transposed) are stored [in, out] in the file and [out, in] in memory, so they
// are transposed on the way out and back. A tied output head is not written (HF drops it too);
// on load a tied lm_head.weight in the file is accepted and ignored.
//
// Not done here: tokenizer files (the run checkpoint copies tokenizer.model), pytorch_model.bin,
// quantized weights, writing sharded files (reading `model.safetensors.index.json` shards is
// supported). Failures throw tetrad::Error naming the folder and the tensor or field.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "tetrad/checkpoint/hf_config.hpp"
#include "tetrad/checkpoint/tensor_stream.hpp"
#include "tetrad/model/model_config.hpp"
#include "tetrad/model/params.hpp"

namespace tetrad {

// Writes `dir` as a complete HF folder (model.safetensors with F32 tensors, config.json),
// atomically: built in `dir.tmp-XXXXXX`, fsync'ed, renamed into place. An existing `dir` is
// replaced as a whole, but only if it looks like a model folder (empty, or holding config.json
// or model.safetensors); anything else is refused.
// `extra_metadata` (a JSON object) goes into the safetensors `__metadata__` (non-string values
// as their JSON text); its integer `bos_token_id` / `eos_token_id`, if present, also go into
// config.json.
void save_hf(const std::string& dir, const ModelConfig& cfg, const ParamTable& table,
             const float* params, const nlohmann::json& extra_metadata = {});

// Writes model.safetensors and config.json into the existing folder `dir` with no temporary
// folder (each file is fsync'ed): for callers that rename the whole folder into place
// themselves (run checkpoints).
void write_hf_files(const std::string& dir, const ModelConfig& cfg, const ParamTable& table,
                    const float* params, const nlohmann::json& extra_metadata = {});

// The same files (byte for byte) from a TensorSource: params(i) is called once for each tensor,
// i = 0..n-1 in table order; one tensor is held in memory at a time.
void write_hf_files_streamed(const std::string& dir, const ModelConfig& cfg,
                             const ParamTable& table, const TensorSource& params,
                             const nlohmann::json& extra_metadata = {});

// Loads the weights of `dir` into `params` (table.total floats, laid out by `table`).
// The folder's config.json must describe `expected` (same family, sizes, epsilons); every tensor
// of the table must be present with the right shape. Buffers that are not parameters
// (attn.bias, attn.masked_bias, rotary_emb.inv_freq) and a tied lm_head.weight are ignored; any
// other tensor the model does not have is an error (an expert tensor's message gives
// config.json's expert sizes). GPT-2 names with or without the
// `transformer.` prefix are accepted. F32, BF16 and F16 tensors are converted to float.
void load_hf_params(const std::string& dir, const ModelConfig& expected, const ParamTable& table,
                    float* params);

// The same checks, then params(i, data) for each tensor, i = 0..n-1 in table order, one tensor
// in memory at a time (for fine-tuning initialisation in a parallel run). Every check runs
// before the first call: a refused folder calls no sink.
void load_hf_params_streamed(const std::string& dir, const ModelConfig& expected,
                             const ParamTable& table, const TensorSink& params);

}  // namespace tetrad
