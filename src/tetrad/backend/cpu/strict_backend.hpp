// "cpu-strict": the CPU backend's arithmetic behind a device whose memory the host cannot read,
// so that code written against the seam shows on any machine (CI has no GPU) whether it would
// run on a GPU. Device memory is a PROT_NONE address range: every host load or store through a
// device pointer faults (SIGSEGV) instead of silently working as it does on the "cpu" backend
// (Capabilities::host_visible is false here). The data live at the same offsets of a second,
// readable mapping; the op table translates every pointer argument there and calls the CPU
// backend's op, and the queue's copies translate too, so results are bit-identical to "cpu".
//
// Misuse is an Error naming the op and the argument, not a wrong result: a host pointer passed
// to an op or as the device side of a copy ("cpu-strict: gemm argument A is not device memory of
// this backend"), device memory passed as the host side of a copy. HostStaging memory is plain
// host memory (it is not device memory: ops refuse it, as a GPU's kernels would).
//
// What it does not emulate: asynchrony (the queue runs inline as the CPU's does, so a missing
// synchronize() before the host reads a copied-back result is not caught), device-side bounds
// (only the first element of each pointer argument is checked against its allocation; the
// readable mapping is rounded up to whole pages).
//
// Selected as `--device cpu-strict` (train.device), listed by backend::backends(), so the
// conformance suite and the model's device tests run on it in every build.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "tetrad/backend/backend.hpp"

namespace tetrad::backend::cpu {

class CpuBackend;

class StrictBackend final : public Backend {
 public:
  StrictBackend();
  ~StrictBackend() override;
  std::string name() const override { return "cpu-strict"; }
  std::string description() const override;
  const Capabilities& capabilities() const override { return caps_; }
  const OpTable& ops() const override;
  Queue& queue() override { return *queue_; }
  std::unique_ptr<Queue> new_queue() override;
  DeviceCeilings ceilings(int threads, bool quick) override;
  DevicePeak peak(Precision p, int threads) override;
  PrecisionChoice auto_precision() const override;
  Bf16Status bf16_status() const override;
  bool host_readable(const void* p) const override;
  // Its "device" memory is host memory (mmap'ed pages): the node's, shared by its ranks.
  MemoryAvailable memory_available() const override { return host_memory_available(); }

  // Where the host finds the data of device address p (p must lie in a live device allocation,
  // its end included); `op` and `arg` name the caller for the Error. Null stays null.
  void* data_of(const void* p, const char* op, const char* arg) const;
  // The CPU backend whose ops and queue do the arithmetic.
  Backend& cpu();
  // Device bytes allocated now (tests check that nothing leaks).
  size_t device_bytes_in_use() const;

 protected:
  void* allocate(size_t bytes, MemoryKind kind) override;
  void deallocate(void* p, size_t bytes, MemoryKind kind) noexcept override;

 private:
  struct Region {
    char* data;      // the readable mapping
    size_t mapped;   // bytes of both mappings (whole pages)
    size_t bytes;    // as asked
  };
  Capabilities caps_;
  std::unique_ptr<CpuBackend> cpu_;
  std::unique_ptr<Queue> queue_;
  mutable std::mutex mu_;
  std::map<uintptr_t, Region> regions_;  // device address -> its data
  size_t in_use_ = 0;
};

}  // namespace tetrad::backend::cpu
