#include "tetrad/train/validator.hpp"

#include <algorithm>
#include <iomanip>
#include <ostream>
#include <vector>

namespace tetrad {

Validator::Validator(const RunConfig& cfg, const TrainingData& data,
                     parallel::ParallelTransformer& model, parallel::PipelineDriver* pipe,
                     const parallel::ProcessGroups& groups, MetricsLog& metrics, std::ostream& out,
                     bool quiet)
    : data_(data),
      model_(model),
      pipe_(pipe),
      groups_(groups),
      metrics_(metrics),
      out_(out),
      quiet_(quiet),
      interval_(cfg.train.eval_interval),
      batches_(cfg.train.eval_batches) {}

double Validator::run(int64_t at_step) {
  const int B = data_.slot().local_batch, T = data_.slot().seq_len;
  const parallel::ContextSplit& cs = data_.slot().context;  // this rank's chunks of each sequence
  const int Tl = cs.local_len(T);
  data::DataLoader val = data_.validation_loader();
  double sums[2] = {0, 0};
  std::vector<int32_t> vi(size_t(B) * T), vt(vi.size()), li(size_t(B) * Tl), lt(li.size());
  // Document starts (data.document_*) of the whole sequences, and of this rank's chunks (their
  // values stay positions of the whole sequence), beside the tokens the model runs.
  const bool docs = data_.documents();
  std::vector<int32_t> vd(docs ? vi.size() : 0), ld(docs && cs.active() ? li.size() : 0);
  if (docs && cs.active()) model_.set_documents(li.data(), ld.data(), int64_t(li.size()));
  else if (docs) model_.set_documents(vi.data(), vd.data(), int64_t(vi.size()));
  for (int i = 0; i < batches_; ++i) {
    val.next_batch(vi.data(), vt.data(), docs ? vd.data() : nullptr);
    if (cs.active()) {
      cs.take(vi.data(), T, B, T, li.data());
      cs.take(vt.data(), T, B, T, lt.data());
      if (docs) cs.take(vd.data(), T, B, T, ld.data());
    }
    int32_t* x = cs.active() ? li.data() : vi.data();
    int32_t* y = cs.active() ? lt.data() : vt.data();
    sums[0] += pipe_ ? pipe_->forward_loss(x, y, B, Tl) : model_.forward_loss(x, y, B, Tl);
    for (int64_t k = 0; k < int64_t(B) * Tl; ++k) sums[1] += y[k] >= 0;
  }
  if (docs) model_.set_documents(nullptr, nullptr, 0);  // the vectors go out of scope
  if (groups_.tokens().size() > 1) groups_.tokens().allreduce_sum(sums, 2);
  if (pipe_) groups_.p().allreduce_sum(sums, 1);  // the loss is on the last stage
  const double vl = sums[0] / std::max(sums[1], 1.0);
  metrics_.write(val_record(at_step, vl));
  if (!quiet_) out_ << "step " << at_step << " | val loss " << std::fixed << std::setprecision(4)
                    << vl << std::defaultfloat << "\n";
  return vl;
}

}  // namespace tetrad
