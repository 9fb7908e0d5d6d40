// The planner against a published long-context run (issue 28, docs/planner.md "Long sequences:
// against TorchTitan"): TorchTitan's Llama 3.1 8B on 8 H100 at 32K to 256K tokens, context
// parallelism 1 to 8, FSDP over the rest, full recomputation. TorchTitan ran FP8 GEMMs
// (torch.compile, torchao float8); tetrad has no FP8, so the rows are predicted in bf16 and
// the FP8 difference is stated beside them (fp8_bound): what the shape of the curve over the
// sequence length is compared on.
#pragma once
#include <string>
#include <vector>

#include "tetrad/planner/planner.hpp"

namespace tetrad::planner {

struct ContextRow {
  int seq = 0, cp = 1;
  double reported = 0;          // tokens/s per GPU, TorchTitan's table (FP8 GEMMs)
  double predicted = 0;         // tokens/s per GPU, the planner in bf16
  double fp8_speedup = 1;       // the most FP8 GEMMs could give: step / (step - GEMMs / 2)
  Estimate estimate;
  double error() const { return predicted / reported - 1; }
};
// The four rows (32K CP 1: 3,890; 64K CP 2: 2,540; 128K CP 4: 1,071; 256K CP 8: 548), each on
// TorchTitan's own mesh: Gz = 8 / C sequences (FSDP, one sequence per rank), C = cp with the
// parameters sharded over Z x C (shard_over_context) and keys and values all-gathered
// (TorchTitan's default rotation), one micro-batch; machines/h100-ib.toml, the reference memory
// layout (another framework's run).
std::vector<ContextRow> torchtitan_context_rows();
std::string context_rows_text(const std::vector<ContextRow>& rows);

}  // namespace tetrad::planner
