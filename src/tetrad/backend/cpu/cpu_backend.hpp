// The CPU backend: device memory is host memory (copies are memcpy, Capabilities::host_visible),
// the queue runs every op inline on the calling thread and its OpenMP team (every Event is
// complete when recorded), and the op table is the CPU kernels of backend/cpu/ (oneDNN sgemm and
// matmul for GEMMs, the flash-style attention, the fused elementwise loops), bit-identical to
// calling them directly.
//
// Thread-safety: the op table's functions are safe to call from several threads on distinct
// data; the default queue is meant for one thread (as every Queue).
#pragma once
#include <memory>

#include "tetrad/backend/backend.hpp"

namespace tetrad::backend::cpu {

// The op table of the CPU backend (static; every entry filled).
const OpTable& op_table();

class CpuBackend final : public Backend {
 public:
  CpuBackend();
  ~CpuBackend() override;
  std::string name() const override { return "cpu"; }
  std::string description() const override;
  const Capabilities& capabilities() const override { return caps_; }
  const OpTable& ops() const override { return op_table(); }
  Queue& queue() override { return *queue_; }
  std::unique_ptr<Queue> new_queue() override;
  DeviceCeilings ceilings(int threads, bool quick) override;
  DevicePeak peak(Precision p, int threads) override;
  PrecisionChoice auto_precision() const override;
  Bf16Status bf16_status() const override;
  bool host_readable(const void*) const override { return true; }  // device memory is host memory
  MemoryAvailable memory_available() const override { return host_memory_available(); }

 protected:
  void* allocate(size_t bytes, MemoryKind kind) override;
  void deallocate(void* p, size_t bytes, MemoryKind kind) noexcept override;

 private:
  Capabilities caps_;
  std::unique_ptr<Queue> queue_;
};

}  // namespace tetrad::backend::cpu
