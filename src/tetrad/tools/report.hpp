// `tetrad report RUN_DIR`: one self-contained HTML page of a training run (inline SVG, no script,
// nothing fetched from the network): training and validation loss, tokens/s and MFU over the
// steps, where the step time went (compute, exposed communication, waiting, optimizer, data, and
// how much communication was hidden), the grid and the resolved configuration.
//
// Reads RUN_DIR/metrics.jsonl (written by the trainer, one JSON object per line) and
// RUN_DIR/config.toml. Throws Error when the folder has no metrics.jsonl or it holds no step.
#pragma once
#include <string>

namespace tetrad {

void write_run_report(const std::string& run_dir, const std::string& out_path);

}  // namespace tetrad
