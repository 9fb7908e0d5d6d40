#include "tetrad/backend/precision.hpp"

#include "tetrad/core/error.hpp"

namespace tetrad::backend {

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::FP32;
  if (name == "bf16") return Precision::BF16;
  fail("precision must be \"fp32\" or \"bf16\", got \"", name, "\"");
}

std::string precision_name(Precision p) { return p == Precision::BF16 ? "bf16" : "fp32"; }

}  // namespace tetrad::backend
