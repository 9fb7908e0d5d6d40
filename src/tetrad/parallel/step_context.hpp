// What every part of the parallel model computes and communicates with (the weight gatherer, the
// gradient reducer, ...): the process groups, the one queue of collectives, the backend, the
// step's profile and this rank's dimensions. The ParallelTransformer owns it and passes it to
// its parts by reference; they hold no copy of any of it. Not thread-safe.
#pragma once
#include <cstdint>

#include "tetrad/backend/backend.hpp"
#include "tetrad/core/profile.hpp"
#include "tetrad/parallel/comm_schedule.hpp"
#include "tetrad/parallel/local_dims.hpp"
#include "tetrad/parallel/process_groups.hpp"

namespace tetrad::parallel {

// The documents of the micro-batch the model runs now (data.document_mask and
// data.document_positions; ParallelTransformer::set_documents): for token t of sequence b (row
// b * T + t), the position in its sequence where its document begins. dev: device memory, what
// the attention and rotary ops read; host: the same rows on the host (learned positions). Null
// when the options are off or the step has no documents.
struct MicroBatchDocuments {
  bool mask = false, positions = false;  // the options, fixed at construction
  const int32_t* dev = nullptr;
  const int32_t* host = nullptr;
};

struct StepContext {
  ProcessGroups* groups = nullptr;
  CommQueue* queue = nullptr;
  backend::Backend* be = nullptr;
  StepProfile* prof = nullptr;  // null: not profiled (ParallelTransformer::set_profile)
  LocalDims dims;
  MicroBatchDocuments docs;

  ProcessGroups& g() const { return *groups; }
  CommQueue& q() const { return *queue; }
  const GridShape& shape() const { return groups->shape; }
  const backend::OpTable& ops() const { return be->ops(); }
  backend::Queue& bq() const { return be->queue(); }
  // Zeros / a copy of n elements of device memory, through the queue (the host never touches
  // the model's buffers: they may be a GPU's).
  template <typename T> void zero_dev(T* p, int64_t n) const {
    if (n > 0) bq().fill_zero(p, size_t(n) * sizeof(T));
  }
  template <typename T> void copy_dev(T* dst, const T* src, int64_t n) const {
    if (n > 0 && dst != src) bq().copy_on_device(dst, src, size_t(n) * sizeof(T));
  }
  // `rows` rows of `width` elements, row r from src + r src_stride to dst + r dst_stride.
  template <typename T>
  void copy_rows_dev(T* dst, int64_t dst_stride, const T* src, int64_t src_stride, int64_t width,
                     int64_t rows) const {
    if (width > 0 && rows > 0)
      bq().copy_rows_on_device(dst, size_t(dst_stride) * sizeof(T), src,
                               size_t(src_stride) * sizeof(T), size_t(width) * sizeof(T),
                               size_t(rows));
  }
  // A sum over a group, skipped when the group is one rank; its time counts as communication.
  template <typename T>
  void sum_over(const comm::Communicator& group, T* data, int64_t n, const char* what = "") const {
    if (group.size() == 1) return;
    queue->run(group.iallreduce_sum(data, size_t(n), queue->ready()), group, "allreduce", what,
               prof ? prof->layer : -2, n * int64_t(sizeof(T)));
  }
};

}  // namespace tetrad::parallel
