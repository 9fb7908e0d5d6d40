#include "support/extraction.hpp"

#include <algorithm>

#include "tetrad/model/sampling.hpp"

namespace tetrad {

ExtractionReport measure_extraction(Transformer<float>& model,
                                    const std::vector<std::vector<int32_t>>& documents,
                                    const std::vector<std::string>& names,
                                    const ExtractionOptions& opt) {
  ExtractionReport rep;
  const std::vector<size_t> todo = plan_extraction(rep, documents, names, opt, model.max_len(),
                                                   model.config().vocab_size);
  const int P = opt.prefix_len, N = opt.suffix_len;
  const size_t B = size_t(std::min(opt.batch, model.max_batch()));
  for (size_t g = 0; g < todo.size(); g += B) {
    const size_t n = std::min(B, todo.size() - g);
    std::vector<std::vector<int32_t>> prompts(n);
    for (size_t k = 0; k < n; ++k) {
      const auto& doc = documents[todo[g + k]];
      prompts[k].assign(doc.begin(), doc.begin() + P);
    }
    const auto gen = generate_greedy_batch(model, prompts, N);
    for (size_t k = 0; k < n; ++k)
      score_document(rep.docs[todo[g + k]], documents[todo[g + k]], gen[k], P, N);
  }
  summarize_extraction(rep);
  return rep;
}

}  // namespace tetrad
