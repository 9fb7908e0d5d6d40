// bf16 gradient collectives (bf16_grad_comm.hpp).
#include "tetrad/parallel/bf16_grad_comm.hpp"

#include <cstring>
#include <vector>

#include "tetrad/core/error.hpp"

namespace tetrad::parallel {

namespace {
constexpr int kTag = 7716;  // the exchange's messages; matched in order per (source, tag)
}

void reduce_scatter_sum_bf16(backend::Backend& be, const comm::Communicator& c, const float* send,
                             float* recv, int64_t n) {
  const int G = c.size(), me = c.rank();
  backend::Queue& q = be.queue();
  if (n <= 0) return;
  if (G == 1) {
    if (recv != send) q.copy_on_device(recv, send, size_t(n) * sizeof(float));
    return;
  }
  if (std::strcmp(c.transport(), "NCCL") == 0)
    fail("bf16 gradient communication on group '", c.name(), "': not implemented on NCCL "
         "(ungrouped point-to-point exchanges); use train.grad_comm_precision = \"fp32\"");
  const auto& ops = be.ops();
  backend::DeviceArray<uint16_t> mine(be, size_t(G) * size_t(n)), got(be, size_t(G) * size_t(n));
  ops.cast_f32_to_bf16(q, mine.data(), send, int64_t(G) * n);
  const Event ready = q.record();
  std::vector<comm::Request> reqs;
  reqs.reserve(size_t(2 * G));
  for (int p = 0; p < G; ++p)
    if (p != me) reqs.push_back(c.irecv(got.data() + int64_t(p) * n, size_t(n), p, kTag));
  for (int p = 0; p < G; ++p)
    if (p != me) reqs.push_back(c.isend(mine.data() + int64_t(p) * n, size_t(n), p, kTag, ready));
  q.copy_on_device(got.data() + int64_t(me) * n, mine.data() + int64_t(me) * n,
                   size_t(n) * sizeof(uint16_t));
  for (auto& r : reqs) r.wait();
  // The fp32 sum, in group-rank order on every rank.
  backend::DeviceArray<float> part(be, size_t(n));
  ops.cast_bf16_to_f32(q, recv, got.data(), n);
  for (int p = 1; p < G; ++p) {
    ops.cast_bf16_to_f32(q, part.data(), got.data() + int64_t(p) * n, n);
    ops.add(q, recv, part.data(), n);
  }
}

void allreduce_sum_bf16(backend::Backend& be, const comm::Communicator& c, float* inout, int64_t n) {
  const int64_t G = c.size();
  if (G == 1 || n <= 0) return;
  backend::Queue& q = be.queue();
  const auto& ops = be.ops();
  const int64_t piece = (n + G - 1) / G;
  backend::DeviceArray<float> padded(be, size_t(G * piece)), sum(be, size_t(piece));  // zero-filled
  q.copy_on_device(padded.data(), inout, size_t(n) * sizeof(float));
  reduce_scatter_sum_bf16(be, c, padded.data(), sum.data(), piece);
  backend::DeviceArray<uint16_t> sum16(be, size_t(piece)), all16(be, size_t(G * piece));
  ops.cast_f32_to_bf16(q, sum16.data(), sum.data(), piece);
  c.iallgather(sum16.data(), all16.data(), size_t(piece), q.record()).wait();
  ops.cast_bf16_to_f32(q, inout, all16.data(), n);
}

}  // namespace tetrad::parallel
