// Event: a point in some ordered stream of work (a backend's queue, a communicator's operation)
// that another stream can wait for. It lives below both the backend seam and the communicators
// (which share a level and may not include each other), so that a backend queue can wait for the
// completion of a collective and a communicator can order a collective after compute:
//   queue.wait(request.event());            // compute after the all-reduce
//   group.iallreduce_sum(p, n, queue.record());  // the all-reduce after compute
//
// query() says whether the work before it is done, synchronize() blocks the host until it is.
// native() names what the event is to the device runtime, so a stream can wait for it without a
// host round trip: a CUDA event (cudaEvent_t) recorded on a stream (a CUDA queue's record(), an
// NCCL communicator's completion). Everything else (a CPU backend's events, which are complete at
// once; an MPI request) has no native form: a device queue that must wait for one synchronizes
// the host on it first.
//
// A default-constructed Event is complete. Cheap to copy (shared state).
#pragma once
#include <cstdint>
#include <memory>

namespace tetrad {

struct NativeEvent {
  enum class Kind : uint8_t { None, CudaEvent };
  Kind kind = Kind::None;
  void* handle = nullptr;  // Kind::CudaEvent: the cudaEvent_t
};

class Event {
 public:
  struct Impl {
    virtual ~Impl() = default;
    virtual bool query() = 0;
    virtual void synchronize() = 0;
    virtual NativeEvent native() const { return {}; }
  };
  Event() = default;  // complete
  explicit Event(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  bool query() const { return !impl_ || impl_->query(); }
  void synchronize() const {
    if (impl_) impl_->synchronize();
  }
  NativeEvent native() const { return impl_ ? impl_->native() : NativeEvent{}; }
  bool empty() const { return !impl_; }
  Impl* impl() const { return impl_.get(); }  // the owner's own type

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace tetrad
