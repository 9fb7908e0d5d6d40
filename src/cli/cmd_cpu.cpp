// `tetrad cpu`: what this CPU runs (features, kernel paths, bf16 GEMMs, precision auto's choice).
#include <iostream>

#include "cli/command.hpp"
#include "tetrad/backend/cpu/precision.hpp"
#include "tetrad/core/cpu.hpp"

namespace tetrad::cli {

namespace {

Runner setup(CLI::App&) {
  return [](Context&) {
    const kernels::Precision p = kernels::resolve_precision("auto");
    std::cout << "cpu: " << cpu_features().summary() << "\n"
              << "bf16 GEMMs: " << kernels::bf16_matmul_path() << "\n"
              << "precision auto: " << kernels::precision_name(p) << " ("
              << kernels::auto_precision_reason() << ")\n"
              << "switches: TETRAD_MAX_CPU_ISA=scalar|avx2|avx512|avx512_bf16|amx caps the "
                 "kernels (and oneDNN); TETRAD_BF16=emulate; TETRAD_PRECISION_AUTO=fp32|bf16\n";
  };
}

}  // namespace

const Command cpu_command{
    "cpu", "what this CPU runs: features, kernel paths, bf16 GEMMs, what precision auto picks",
    false, &setup};

}  // namespace tetrad::cli
