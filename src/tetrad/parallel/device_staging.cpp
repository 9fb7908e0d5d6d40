#include "tetrad/parallel/device_staging.hpp"

#include "tetrad/core/error.hpp"

namespace tetrad::parallel {

void BackendStaging::add(backend::Backend& be) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Entry& e : entries_)
    if (e.be == &be) {
      ++e.refs;
      return;
    }
  entries_.push_back({&be, be.new_queue(), 1});
}

void BackendStaging::remove(backend::Backend& be) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < entries_.size(); ++i)
    if (entries_[i].be == &be && --entries_[i].refs == 0) {
      entries_.erase(entries_.begin() + long(i));
      return;
    }
}

bool BackendStaging::host_readable(const void* p) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Entry& e : entries_)
    if (!e.be->host_readable(p)) return false;
  return true;
}

BackendStaging::Entry& BackendStaging::owner_of(const void* p, const char* what) {
  for (Entry& e : entries_)
    if (!e.be->host_readable(p)) return e;
  fail("device staging (", what, "): ", p, " is not device memory of any backend of these "
       "process groups");
}

void BackendStaging::to_host(void* host, const void* device, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = owner_of(device, "to host");
  e.queue->copy_to_host(host, device, bytes);
  e.queue->synchronize();
}

void BackendStaging::to_device(void* device, const void* host, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = owner_of(device, "to device");
  e.queue->copy_to_device(device, host, bytes);
  e.queue->synchronize();
}

}  // namespace tetrad::parallel
