// Validation passes: the mean loss per kept target over the first train.eval_batches
// micro-batches of the validation split (from its start, unshuffled, this rank's slot), summed
// over the Z x D slots (and, on a pipeline grid, taken from the last stage), written to
// metrics.jsonl and the console. Collective over the model's groups.
#pragma once
#include <cstdint>
#include <iosfwd>

#include "tetrad/parallel/parallel_transformer.hpp"
#include "tetrad/parallel/pipeline.hpp"
#include "tetrad/parallel/process_groups.hpp"
#include "tetrad/train/config.hpp"
#include "tetrad/train/metrics_log.hpp"
#include "tetrad/train/training_data.hpp"

namespace tetrad {

class Validator {
 public:
  // pipe: the pipeline's driver on a grid with Gp > 1, else null.
  Validator(const RunConfig& cfg, const TrainingData& data, parallel::ParallelTransformer& model,
            parallel::PipelineDriver* pipe, const parallel::ProcessGroups& groups,
            MetricsLog& metrics, std::ostream& out, bool quiet);

  bool enabled() const { return interval_ > 0; }
  bool due(int64_t step) const { return interval_ > 0 && step % interval_ == 0; }
  double run(int64_t step);  // the validation loss after step `step`

 private:
  const TrainingData& data_;
  parallel::ParallelTransformer& model_;
  parallel::PipelineDriver* pipe_;
  const parallel::ProcessGroups& groups_;
  MetricsLog& metrics_;
  std::ostream& out_;
  bool quiet_;
  int64_t interval_;
  int batches_;
};

}  // namespace tetrad
