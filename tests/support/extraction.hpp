// The extraction test (tools/memorization.hpp) on the serial Transformer<float>, the test oracle:
// tests compare the one model's report (measure_extraction on a ParallelTransformer) with it.
// It runs the production test's own pieces (plan_extraction, score_document,
// summarize_extraction), batching prompts min(opt.batch, model.max_batch()) at a time with the
// oracle's KV cache; `tetrad memorization` never runs it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "support/transformer.hpp"
#include "tetrad/tools/memorization.hpp"

namespace tetrad {

ExtractionReport measure_extraction(Transformer<float>& model,
                                    const std::vector<std::vector<int32_t>>& documents,
                                    const std::vector<std::string>& names,
                                    const ExtractionOptions& opt);

}  // namespace tetrad
