// `tetrad cpu`: what this CPU runs (features, kernel paths, bf16 GEMMs, precision auto's choice).
#include <iostream>

#include "cli/command.hpp"
#include "tetrad/backend/backend.hpp"
#include "tetrad/core/cpu.hpp"

namespace tetrad::cli {

namespace {

Runner setup(CLI::App&) {
  return [](Context&) {
    backend::Backend& cpu = backend::cpu_backend();
    const backend::PrecisionChoice p = cpu.auto_precision();
    std::cout << "cpu: " << cpu_features().summary() << "\n"
              << "bf16 GEMMs: " << cpu.capabilities().gemm_bf16_path << "\n"
              << "precision auto: " << backend::precision_name(p.precision) << " (" << p.why
              << ")\n"
              << "switches: TETRAD_MAX_CPU_ISA=scalar|avx2|avx512|avx512_bf16|amx caps the "
                 "kernels (and oneDNN); TETRAD_BF16=emulate; TETRAD_PRECISION_AUTO=fp32|bf16\n";
  };
}

}  // namespace

const Command cpu_command{
    "cpu", "what this CPU runs: features, kernel paths, bf16 GEMMs, what precision auto picks",
    false, &setup};

}  // namespace tetrad::cli
