// Staging of device memory for communicators that move host memory (comm::DeviceStaging for
// MPI): a GPU run without NCCL, or a run on "cpu-strict", hands the collectives device
// pointers; the MPI implementation copies them through host memory with these copies.
//
// One per ProcessGroups (process_groups.hpp), shared by its communicators; every model whose
// backend's memory is not host memory registers its backend while it lives (several models may
// share the groups, e.g. a reference and a device model in one test). A pointer none of the
// registered backends claims is host memory and goes to MPI unchanged. Copies run on a queue of
// their own per backend (the collectives' waits on compute events have already ordered them),
// and are complete when they return. Thread-safe.
#pragma once
#include <memory>
#include <mutex>
#include <vector>

#include "tetrad/backend/backend.hpp"
#include "tetrad/comm/comm_base.hpp"

namespace tetrad::parallel {

class BackendStaging final : public comm::DeviceStaging {
 public:
  // Counted: a backend added twice is removed after two remove() calls.
  void add(backend::Backend& be);
  void remove(backend::Backend& be);

  bool host_readable(const void* p) const override;
  void to_host(void* host, const void* device, size_t bytes) override;
  void to_device(void* device, const void* host, size_t bytes) override;

 private:
  struct Entry {
    backend::Backend* be;
    std::unique_ptr<backend::Queue> queue;
    int refs;
  };
  Entry& owner_of(const void* p, const char* what);  // mu_ held
  mutable std::mutex mu_;
  std::vector<Entry> entries_;
};

}  // namespace tetrad::parallel
