#include "tetrad/parallel/pipeline_schedule.hpp"

#include <algorithm>
#include <sstream>

#include "tetrad/core/error.hpp"

namespace tetrad::parallel {

PipelineSchedule parse_pipeline_schedule(const std::string& text) {
  if (text == "1f1b") return PipelineSchedule::OneFOneB;
  if (text == "interleaved") return PipelineSchedule::Interleaved;
  fail("parallel.schedule: expected \"1f1b\" or \"interleaved\", got \"", text, "\"");
}

const char* schedule_name(PipelineSchedule s) {
  return s == PipelineSchedule::OneFOneB ? "1f1b" : "interleaved";
}

std::vector<PipeOp> pipeline_schedule(PipelineSchedule s, int p, int stage, int m, int v) {
  if (p < 1 || m < 1 || v < 1)
    fail("pipeline schedule: stages (", p, "), micro-batches (", m, ") and virtual stages (", v,
         ") must be positive");
  if (stage < 0 || stage >= p) fail("pipeline schedule: stage ", stage, " outside 0..", p - 1);
  std::vector<PipeOp> ops;
  if (s == PipelineSchedule::OneFOneB) {
    if (v != 1)
      fail("parallel.virtual_stages = ", v, " needs parallel.schedule = \"interleaved\" (1F1B "
           "has one chunk per stage)");
    const int warmup = std::min(p - stage - 1, m);
    int f = 0, b = 0;
    for (; f < warmup; ++f) ops.push_back({true, f, 0});
    for (; f < m; ++f, ++b) {
      ops.push_back({true, f, 0});
      ops.push_back({false, b, 0});
    }
    for (; b < m; ++b) ops.push_back({false, b, 0});
    return ops;
  }
  if (m % p != 0)
    fail("the interleaved schedule needs train.grad_accum (", m, " micro-batches) divisible by "
         "the pipeline stages Gp = ", p);
  // Megatron-LM's order: the k-th forward of this rank is micro-batch
  // (k / (p v)) p + k % p of chunk (k / p) % v; backwards the same from the last chunk.
  const int total = m * v;
  auto micro = [&](int k) { return (k / (p * v)) * p + k % p; };
  auto fwd = [&](int k) { return PipeOp{true, micro(k), (k / p) % v}; };
  auto bwd = [&](int k) { return PipeOp{false, micro(k), v - 1 - (k / p) % v}; };
  int warmup = m == p ? total : std::min(total, (p - stage - 1) * 2 + (v - 1) * p);
  int f = 0, b = 0;
  for (; f < warmup; ++f) ops.push_back(fwd(f));
  for (; f < total; ++f, ++b) {
    ops.push_back(fwd(f));
    ops.push_back(bwd(b));
  }
  for (; b < total; ++b) ops.push_back(bwd(b));
  return ops;
}

std::string to_string(const std::vector<PipeOp>& ops, int v) {
  std::ostringstream os;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (i) os << ' ';
    os << (ops[i].forward ? 'F' : 'B') << ops[i].micro;
    if (v > 1) os << '.' << ops[i].chunk;
  }
  return os.str();
}

double PipelineTiming::mean_bubble() const {
  double sum = 0;
  for (double b : busy) sum += b > 0 ? (makespan - b) / b : 0.0;
  return busy.empty() ? 0.0 : sum / double(busy.size());
}

PipelineTiming simulate_pipeline(PipelineSchedule s, int p, int m, int v, double t_f, double t_b) {
  PipelineTiming out = simulate_pipeline(
      s, p, m, v, [&](int, size_t, const PipeOp& op) { return op.forward ? t_f : t_b; });
  out.ideal = double(m) * v * (t_f + t_b);
  return out;
}

PipelineTiming simulate_pipeline(
    PipelineSchedule s, int p, int m, int v,
    const std::function<double(int stage, size_t index, const PipeOp& op)>& duration) {
  std::vector<std::vector<PipeOp>> lists(p);
  for (int st = 0; st < p; ++st) lists[st] = pipeline_schedule(s, p, st, m, v);
  const int V = p * v;  // virtual stages
  // done[f?][micro][virtual stage]: finish time, < 0 while not run.
  std::vector<std::vector<double>> fdone(m, std::vector<double>(V, -1)),
      bdone(m, std::vector<double>(V, -1));
  std::vector<size_t> next(p, 0);
  std::vector<double> free_at(p, 0);
  std::vector<int> in_flight(p, 0);
  PipelineTiming out;
  out.busy.assign(size_t(p), 0.0);
  size_t remaining = 0;
  for (const auto& l : lists) remaining += l.size();
  while (remaining > 0) {
    // Run, on the stage that can start earliest, its next op whose inputs are ready.
    int best = -1;
    double best_start = 0;
    for (int st = 0; st < p; ++st) {
      if (next[st] == lists[st].size()) continue;
      const PipeOp& op = lists[st][next[st]];
      const int j = op.chunk * p + st;
      double ready;
      if (op.forward) {
        ready = j == 0 ? 0 : fdone[op.micro][j - 1];
      } else {
        ready = j == V - 1 ? fdone[op.micro][j] : bdone[op.micro][j + 1];
        if (fdone[op.micro][j] < 0) ready = -1;
      }
      if (ready < 0) continue;
      const double start = std::max(ready, free_at[st]);
      if (best < 0 || start < best_start) {
        best = st;
        best_start = start;
      }
    }
    if (best < 0) fail("pipeline schedule deadlocks: no stage can run its next op");
    const size_t index = next[best]++;
    const PipeOp& op = lists[best][index];
    const int j = op.chunk * p + best;
    const double dt = duration(best, index, op);
    out.busy[size_t(best)] += dt;
    const double end = best_start + dt;
    (op.forward ? fdone : bdone)[op.micro][j] = end;
    free_at[best] = end;
    in_flight[best] += op.forward ? 1 : -1;
    out.max_in_flight = std::max(out.max_in_flight, in_flight[best]);
    out.makespan = std::max(out.makespan, end);
    --remaining;
  }
  out.ideal = *std::max_element(out.busy.begin(), out.busy.end());
  return out;
}

}  // namespace tetrad::parallel
