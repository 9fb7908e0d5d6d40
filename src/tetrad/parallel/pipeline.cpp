#include "tetrad/parallel/pipeline.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "tetrad/core/error.hpp"

namespace tetrad::parallel {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
// Message tags: one per (micro-batch, receiving virtual stage, direction), unique within a step.
int tag(int micro, int j, int V, bool forward) { return (micro * V + j) * 2 + (forward ? 0 : 1); }
// Hidden states cross the stages in host memory (the messages' buffers; a device model's are
// copied through its queue).
void to_model(ParallelTransformer& m, float* dev, const float* host, int64_t n) {
  backend::Queue& q = m.compute_backend().queue();
  q.copy_to_device(dev, host, size_t(n) * sizeof(float));
  q.synchronize();
}
std::vector<float> from_model(ParallelTransformer& m, const float* dev, int64_t n) {
  backend::Queue& q = m.compute_backend().queue();
  std::vector<float> host(static_cast<size_t>(n));
  q.copy_to_host(host.data(), dev, size_t(n) * sizeof(float));
  q.synchronize();
  return host;
}
}  // namespace

PipelineDriver::PipelineDriver(ParallelTransformer& model, PipelineSchedule schedule,
                               int micro_batches)
    : m_(model),
      g_(model.groups()),
      schedule_(schedule),
      m_micro_(micro_batches),
      v_(model.options().virtual_stages),
      p_(model.groups().shape.p()),
      s_(model.groups().coord.p()) {
  // Checks the combination once (throws naming what is wrong).
  (void)pipeline_schedule(schedule_, p_, s_, m_micro_, v_);
}

PipelineDriver::Chunk PipelineDriver::chunk(int c) const {
  const int V = p_ * v_, j = c * p_ + s_;
  const auto [l0, l1] = m_.layer_split().layers(j);
  return {l0, l1, j == 0, j == V - 1};
}

double PipelineDriver::step(const int32_t* inputs, const int32_t* targets, int B, int T,
                            float grad_scale) {
  const auto t_start = std::chrono::steady_clock::now();
  wait_s_ = 0;
  const int V = p_ * v_;
  const int64_t n = m_.hidden_floats(B, T);  // hidden [N, C/Gx] (N/Gy rows: sequence sharding)
  const int next = (s_ + 1) % p_, prev = (s_ + p_ - 1) % p_;
  const std::vector<PipeOp> ops = pipeline_schedule(schedule_, p_, s_, m_micro_, v_);
  op_s_.assign(ops.size(), 0.0);
  std::map<std::pair<int, int>, std::vector<float>> stashed;  // (micro, chunk) -> activations
  std::vector<comm::Request> sends;
  std::vector<float> in(size_t(n), 0.0f);
  double loss = 0;
  // The router's losses of a mixture of experts enter each layer's backward on every stage.
  m_.set_block_grad_scale(grad_scale);

  // The receive an op needs (none for the first virtual stage's forwards and the last's
  // backwards), posted one op ahead.
  auto needs_recv = [&](const PipeOp& op) {
    const int j = op.chunk * p_ + s_;
    return op.forward ? j > 0 : j < V - 1;
  };
  auto post_recv = [&](const PipeOp& op, std::vector<float>& buf) {
    const int j = op.chunk * p_ + s_;
    return g_.p().irecv(buf.data(), buf.size(), op.forward ? prev : next,
                      tag(op.micro, j, V, op.forward));
  };
  std::vector<float> ahead(static_cast<size_t>(n));
  comm::Request pending;
  if (!ops.empty() && needs_recv(ops[0])) pending = post_recv(ops[0], ahead);

  for (size_t i = 0; i < ops.size(); ++i) {
    const PipeOp op = ops[i];
    const Chunk ch = chunk(op.chunk);
    const int j = op.chunk * p_ + s_;
    const int32_t* x = inputs + size_t(op.micro) * B * T;
    const int32_t* y = targets + size_t(op.micro) * B * T;
    if (needs_recv(op)) {
      const auto t0 = std::chrono::steady_clock::now();
      pending.wait();
      wait_s_ += seconds_since(t0);
      std::swap(in, ahead);
    }
    if (i + 1 < ops.size() && needs_recv(ops[i + 1])) pending = post_recv(ops[i + 1], ahead);
    const auto t_op = std::chrono::steady_clock::now();

    if (op.forward) {
      if (!ch.embed) to_model(m_, m_.chunk_input(ch.l0), in.data(), n);
      m_.forward_chunk(ch.l0, ch.l1, ch.embed, ch.head, x, B, T);
      if (ch.head) {
        loss += m_.chunk_loss(y, B, T, grad_scale, true);
      } else {
        sends.push_back(g_.p().isend(from_model(m_, m_.chunk_output(ch.l1), n), next,
                                   tag(op.micro, j + 1, V, true)));
      }
      stashed[{op.micro, op.chunk}] = m_.stash(ch.l0, ch.l1, ch.embed, ch.head);
    } else {
      auto it = stashed.find({op.micro, op.chunk});
      TETRAD_CHECK(it != stashed.end(), "pipeline: backward before forward");
      m_.restore(ch.l0, ch.l1, ch.embed, ch.head, it->second);
      stashed.erase(it);
      m_.backward_chunk(ch.l0, ch.l1, ch.embed, ch.head, x, in.data(), B, T);
      if (!ch.embed) {
        sends.push_back(g_.p().isend(from_model(m_, m_.input_grad(), n), prev,
                                   tag(op.micro, j - 1, V, false)));
      }
    }
    // Completed sends free their copies; the rest are waited for at the end.
    for (auto& r : sends) r.test();
    op_s_[i] = seconds_since(t_op);
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& r : sends) r.wait();
  wait_s_ += seconds_since(t0);
  TETRAD_CHECK(stashed.empty(), "pipeline: a forward without its backward");
  step_s_ = seconds_since(t_start);
  return loss;
}

int64_t PipelineDriver::stash_peak_bytes(int B, int T) {
  const int64_t n = m_.hidden_floats(B, T);
  int64_t alive = 0, peak = 0;
  for (const PipeOp& op : pipeline_schedule(schedule_, p_, s_, m_micro_, v_)) {
    const Chunk ch = chunk(op.chunk);
    const int64_t k = m_.stash_numel(ch.l0, ch.l1, ch.embed, ch.head);
    alive += op.forward ? k : -k;
    peak = std::max(peak, alive);
  }
  return (peak + 3 * n) * int64_t(sizeof(float));
}

double PipelineDriver::forward_loss(const int32_t* inputs, const int32_t* targets, int B, int T) {
  const int V = p_ * v_;
  const int64_t n = m_.hidden_floats(B, T);
  const int next = (s_ + 1) % p_, prev = (s_ + p_ - 1) % p_;
  std::vector<comm::Request> sends;
  double loss = 0;
  for (int c = 0; c < v_; ++c) {
    const Chunk ch = chunk(c);
    const int j = c * p_ + s_;
    if (!ch.embed) g_.p().recv(m_.chunk_input(ch.l0), size_t(n), prev, tag(0, j, V, true));
    m_.forward_chunk(ch.l0, ch.l1, ch.embed, ch.head, inputs, B, T);
    if (ch.head) {
      loss += m_.chunk_loss(targets, B, T, 0.0f, false);
    } else {
      sends.push_back(g_.p().isend(from_model(m_, m_.chunk_output(ch.l1), n), next, tag(0, j + 1, V, true)));
    }
  }
  for (auto& r : sends) r.wait();
  return loss;
}

}  // namespace tetrad::parallel
