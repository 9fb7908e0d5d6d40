// Weights read from a Hugging Face folder that are not finite are refused before a run starts
// from them (run.init_from in the trainer, `tetrad import`): training from a NaN or an infinity
// gives a NaN loss at the first step.
#pragma once
#include <string>

#include "tetrad/model/params.hpp"

namespace tetrad {

// Throws when `data` (one whole tensor, tetrad's layout) holds a value that is not finite: the
// message starts with `source` ("run.init_from 'dir'") and names the tensor, its shape and the
// first bad element in the file's layout (a transposed Conv1D weight is [in, out] there), how
// many are bad and the value.
void check_finite_weights(const std::string& source, const ParamSpec& spec, const float* data);

}  // namespace tetrad
