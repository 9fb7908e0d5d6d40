// `tetrad report RUN_DIR`: one self-contained HTML page of a training run (inline SVG, no script,
// nothing fetched from the network): training and validation loss, tokens/s and MFU over the
// steps, where the step time went (compute, exposed communication, waiting, optimizer, data, and
// how much communication was hidden), the grid and the resolved configuration.
//
// Reads RUN_DIR/metrics.jsonl (written by the trainer, one JSON object per line) and
// RUN_DIR/config.toml. Throws Error when the folder has no metrics.jsonl or it holds no step.
// With a trace (`tetrad train --trace`; trace_path, or RUN_DIR/trace.json when it exists) the page
// also lists where the exposed communication went, collective by collective.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tetrad {

void write_run_report(const std::string& run_dir, const std::string& out_path,
                      const std::string& trace_path = {});

// Exposed communication in a trace (the compute track's "communication ..." events: the time a
// rank's training thread was blocked in a collective), grouped by the collective's name without
// its layer ("allgather", "reduce_scatter", "wait all", ...), largest first. seconds and count
// are per rank (summed over the trace's ranks, divided by their number); share is of the whole
// exposed time. Throws Error if the file is not a trace-event JSON.
struct ExposedComm {
  std::string what;
  double seconds = 0, share = 0;
  double count = 0;
};
std::vector<ExposedComm> exposed_communication(const std::string& trace_path, int* ranks = nullptr);

}  // namespace tetrad
