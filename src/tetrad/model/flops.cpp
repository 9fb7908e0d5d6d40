#include "tetrad/model/flops.hpp"

#include "tetrad/model/params.hpp"

namespace tetrad {

const char* attention_flops_name(AttentionFlops a) {
  return a == AttentionFlops::Causal ? "causal attention counted as half" : "attention counted in full";
}

namespace {
// The attention core's FLOPs per token that the causal count leaves out of the full one:
// half of c * L * A * T for c = 12 (forward + backward) or 4 (one forward again).
double causal_discount(const ModelConfig& c, int seq_len, double per_layer) {
  return 0.5 * per_layer * c.n_layer * double(c.q_dim()) * seq_len;
}
}  // namespace

double flops_per_token(const ModelConfig& c, int seq_len, AttentionFlops a) {
  const double full = flops_per_token(c, seq_len);  // 6 N_matmul (active) + 12 L A T
  return a == AttentionFlops::Full ? full : full - causal_discount(c, seq_len, 12.0);
}

double recompute_flops_per_token(const ModelConfig& c, int seq_len, const std::string& recompute,
                                 AttentionFlops a) {
  const double full = recompute_flops_per_token(c, seq_len, recompute);  // its attention: 4 L A T
  if (a == AttentionFlops::Full || recompute == "none") return full;
  return full - causal_discount(c, seq_len, 4.0);
}

}  // namespace tetrad
