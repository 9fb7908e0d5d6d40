// The device seam: a Backend owns memory on its device, an ordered execution queue with events,
// its capabilities, its machine ceilings and the op table (backend/ops.hpp). The model, the loss
// and the optimizer run on whatever Backend they are given; the CPU backend (backend/cpu/) is the
// first, a CUDA or HIP backend fills the same interface (ggml's backend table is the model).
//
// Memory. DeviceBuffer is an owning allocation of `bytes` on one backend (its owner), freed back
// to it in the destructor; movable, not copyable. MemoryKind::HostStaging is host memory the
// device copies from and to fast (pinned on a GPU; plain aligned host memory on the CPU). Device
// pointers are only dereferenced by the backend's own ops and copies, except on a backend whose
// Capabilities::host_visible is true (the CPU: device memory is host memory, copies are memcpy).
//
// Queue. Work (ops, copies) submitted to one Queue runs in submission order. The CPU backend runs
// everything inline, so every call has finished when it returns and every Event is already
// complete; a GPU backend enqueues on a stream and returns at once. An Event marks a point in a
// queue: query() says whether the work before it is done, synchronize() blocks until it is,
// Queue::wait(e) makes later work on that queue wait for it (other queues, or communication).
// A default-constructed Event is complete.
//
// Threads: one Queue is used from one thread at a time; Backend's allocation functions are
// thread-safe. Errors: allocation failures and device errors throw tetrad::Error naming the
// backend, the operation and the size; an unsupported request (a dtype the device lacks) throws
// naming what is supported, never silently does something else.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tetrad/backend/ops.hpp"
#include "tetrad/core/event.hpp"

namespace tetrad::backend {

class Backend;

enum class MemoryKind : uint8_t { Device, HostStaging };

class DeviceBuffer {
 public:
  DeviceBuffer() = default;  // empty: no owner, 0 bytes
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() { return ptr_; }
  const void* data() const { return ptr_; }
  template <typename T> T* as() { return static_cast<T*>(ptr_); }
  template <typename T> const T* as() const { return static_cast<const T*>(ptr_); }
  size_t bytes() const { return bytes_; }
  MemoryKind kind() const { return kind_; }
  Backend* owner() const { return owner_; }
  bool empty() const { return bytes_ == 0; }

 private:
  friend class Backend;
  DeviceBuffer(Backend* owner, void* ptr, size_t bytes, MemoryKind kind)
      : owner_(owner), ptr_(ptr), bytes_(bytes), kind_(kind) {}
  void release() noexcept;
  Backend* owner_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  MemoryKind kind_ = MemoryKind::Device;
};

// A typed, sized array in one backend's memory (parameters, gradients, activations, scratch):
// data() is a device pointer (dereferenceable by the host only where the backend is
// host_visible). Zero-filled; empty when n is 0 (data() null). Movable.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(Backend& be, size_t n, MemoryKind kind = MemoryKind::Device);
  T* data() { return buf_.as<T>(); }
  const T* data() const { return buf_.as<T>(); }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }

 private:
  DeviceBuffer buf_;
  size_t n_ = 0;
};

// A point in a queue's work (see the file comment): core's Event, which communicators share, so
// that a queue can wait for a collective's completion (Queue::wait(request.event())) and a
// collective can start after a queue's work (core/event.hpp).
using Event = ::tetrad::Event;

class Queue {
 public:
  virtual ~Queue() = default;
  Backend& backend() const { return *backend_; }

  // Copies, ordered with the queue's other work. host pointers: any host memory (HostStaging
  // lets a GPU copy asynchronously; other host memory may make the copy synchronous).
  virtual void copy_to_device(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void copy_on_device(void* dst, const void* src, size_t bytes) = 0;
  // `rows` copies of row_bytes bytes, row r from src + r src_pitch to dst + r dst_pitch (bytes;
  // a column block of a row-major matrix into a packed one, or back). By rows unless overridden.
  virtual void copy_rows_on_device(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                                   size_t row_bytes, size_t rows) {
    for (size_t r = 0; r < rows; ++r)
      copy_on_device(static_cast<char*>(dst) + r * dst_pitch,
                     static_cast<const char*>(src) + r * src_pitch, row_bytes);
  }
  virtual void fill_zero(void* dst, size_t bytes) = 0;

  virtual Event record() = 0;             // marks everything submitted so far
  // Later work waits for e: an event of any queue of this backend, or of a communicator (a CUDA
  // event is waited for on the device; an event without a native form is synchronized on first).
  virtual void wait(const Event& e) = 0;
  virtual void synchronize() = 0;         // blocks the host until everything submitted is done

 protected:
  explicit Queue(Backend& b) : backend_(&b) {}

 private:
  Backend* backend_;
};

// What a backend can do; the op table's optional entries are null where a flag is false.
struct Capabilities {
  bool host_visible = false;           // device memory is host memory (CPU)
  bool dtype_f32 = true, dtype_bf16 = false, dtype_f64 = false;
  bool gemm_bf16 = false;              // Precision::BF16 GEMMs run (natively or emulated)
  bool gemm_bf16_native = false;       // ... on bf16 matrix hardware (AMX, tensor cores)
  bool gemm_bf16_storage = false;      // GemmArgs a_type / b_type may be BF16
  bool adamw_bf16_copy = false;        // AdamWArgs::p16 (the fused bf16 weight copy) is written
  bool attention_bf16 = false;         // AttentionArgs::dtype may be BF16
  bool attention_bf16_products = false;// AttentionArgs::precision may be BF16 (any offsets)
  bool attention_bf16_faster = false;  // ... and runs faster than fp32 attention here (bf16 runs
                                       // then default to it: ParallelOptions::attention_precision)
  bool attention_bf16_saved = false;   // AttentionArgs::saved_bf16 (bf16 products' backward)
  bool attention_any_q_offset = false; // AttentionArgs::relative_q_offset() other than Tk - Tq
  bool attention_document_mask = false;// AttentionArgs::doc_start (the document mask) is honoured
  bool fused_cross_entropy = false;    // OpTable::cross_entropy_fused present
  bool bf16_producers = false;         // OpTable::norm_apply_bf16, gelu_forward_bf16,
                                       // swiglu_forward_bf16, cast_transpose_f32_to_bf16 present
  bool bf16_stash_fused = false;       // OpTable::gelu_forward_bf16_x, swiglu_forward_bf16_x,
                                       // gelu_backward_x16, swiglu_backward_x16 present
  bool bf16_loss_grad = false;         // OpTable::ce_grad_bf16 present
  bool ce_row_stats_fused = false;     // OpTable::ce_row_max_sum_exp_target present
  bool gemm_product_forms = false;     // GemmArgs::product is honoured by bf16 GEMMs (the model
                                       // may then tune its per-site layouts, gemm_layouts.hpp)
  std::string gemm_bf16_path;          // how bf16 GEMMs run here, for logs
};

// The device's performance ceilings, for model FLOP/s utilisation (docs/benchmarks.md): peak
// GEMM throughput in fp32 and bf16 (0 where not available, with `skipped` saying why) and memory
// bandwidth, measured (or, where `measured` is false, from the vendor's data sheet).
struct DeviceCeilings {
  double gemm_fp32_gflops = 0, gemm_bf16_gflops = 0, memory_gbs = 0;
  bool measured = false;
  std::string method, skipped;
};

// The peak a run's model FLOP/s are divided by (MFU and HFU in the trainer and the benchmark), for
// GEMMs in one precision, per device: gflops, and name, what it is for the log ("bf16 matrix
// peak (AMX-BF16 register loop)", "H100 SXM bf16 dense peak (datasheet)").
struct DevicePeak {
  double gflops = 0;
  std::string name;
};

// bf16 as a backend runs it now (Backend::bf16_status). native: bf16 GEMMs on bf16 matrix
// hardware now (Capabilities::gemm_bf16_native, unless a CPU backend's emulation is forced:
// TETRAD_BF16=emulate, kernels::set_bf16_emulation_forced); gemm_path: how bf16 GEMMs run;
// attention_path: how bf16 attention products run ("" where the backend does not say);
// layout_choices: the GEMM layout its kernels chose per shape so far, one line each ("" if none).
struct Bf16Status {
  bool native = false;
  std::string gemm_path, attention_path, layout_choices;
};

// Memory a backend's device has for new allocations now, for the trainer's check that a run fits
// before its first step (train/device_memory.hpp). available, total: bytes (0: unknown). source
// names the figure for logs and errors ("MemAvailable", "cgroup memory.max", "cudaMemGetInfo").
// host_shared: it is the node's host memory, which every rank on the node shares (the CPU
// backends); a GPU's memory is shared only by the ranks on that GPU (`devices`: the GPUs visible,
// `index`: this one, for counting them).
struct MemoryAvailable {
  uint64_t available = 0, total = 0;
  std::string source;
  bool host_shared = false;
  int devices = 1, index = 0;
};

// The node's host memory: MemAvailable of /proc/meminfo, bounded by the cgroup's limit (v2
// memory.max less memory.current, or v1 limit_in_bytes less usage_in_bytes) where that is lower.
MemoryAvailable host_memory_available();

class Backend {
 public:
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  virtual std::string name() const = 0;         // "cpu", "cuda:0"
  virtual std::string description() const = 0; // device, ISA / compute capability, library versions
  virtual const Capabilities& capabilities() const = 0;
  virtual const OpTable& ops() const = 0;
  virtual Queue& queue() = 0;                   // the default ordered queue
  virtual std::unique_ptr<Queue> new_queue() = 0;  // another one (a GPU: another stream)
  // Ceilings on `threads` host threads (CPU; 0: all cores); quick: well under a second.
  virtual DeviceCeilings ceilings(int threads, bool quick) = 0;
  // The MFU baseline among the ceilings: the peak of GEMMs in precision p on this device, one
  // rank on `threads` host threads (CPU; 0: OpenMP's current count). The CPU backends measure it
  // (the fp32 FMA peak, the bf16 matrix peak: backend/ceilings.hpp); a GPU gives its part's
  // datasheet peak (backend/gpu_parts.hpp), else its measured GEMM ceiling.
  virtual DevicePeak peak(Precision p, int threads) = 0;
  // What GEMM precision "auto" means on this backend, and why (resolve_precision,
  // backend/precision.hpp). The default: bf16 where bf16 GEMMs run on bf16 matrix hardware
  // (Capabilities::gemm_bf16_native), fp32 elsewhere. The CPU backends measure instead: the
  // faster of the two GEMMs on this machine, cached per machine (backend/cpu/precision_auto.hpp),
  // and honour TETRAD_PRECISION_AUTO (backend/cpu/precision.hpp).
  virtual PrecisionChoice auto_precision() const;
  // bf16 as it runs here now, for logs and the choices that depend on it (see Bf16Status).
  virtual Bf16Status bf16_status() const;
  // Whether the host may load and store through p: true for host memory and, where
  // Capabilities::host_visible, for device memory too; false for device memory of a GPU (or of
  // "cpu-strict"). A communicator that moves host memory (MPI) stages p through host memory when
  // this is false (comm::DeviceStaging, staging_for()).
  virtual bool host_readable(const void* p) const = 0;
  // What the device has free now (see MemoryAvailable); cheap, callable before any allocation.
  virtual MemoryAvailable memory_available() const = 0;

  // Zero-filled allocation of `bytes` (rounded up to the device's alignment, at least 64).
  DeviceBuffer alloc(size_t bytes, MemoryKind kind = MemoryKind::Device);
  template <typename T>
  DeviceBuffer alloc_array(size_t n, MemoryKind kind = MemoryKind::Device) {
    return alloc(n * sizeof(T), kind);
  }

 protected:
  Backend() = default;
  // The device's allocator: zero-filled memory of `bytes` (> 0) or an Error.
  virtual void* allocate(size_t bytes, MemoryKind kind) = 0;
  virtual void deallocate(void* p, size_t bytes, MemoryKind kind) noexcept = 0;
  friend class DeviceBuffer;
};

template <typename T>
DeviceArray<T>::DeviceArray(Backend& be, size_t n, MemoryKind kind)
    : buf_(be.alloc_array<T>(n, kind)), n_(n) {}

// A GEMM precision setting on `device` (backend/precision.hpp): "fp32" | "bf16" as given, "auto"
// as device.auto_precision() says; anything else throws Error naming the choices.
PrecisionChoice resolve_precision(const std::string& setting, const Backend& device);

// ---- which backends this build has ------------------------------------------------------------

// One entry per backend compiled in. available: a device is present here (a CUDA build on a
// machine without a GPU lists "cuda" with available false and the reason in why_not).
struct BackendInfo {
  std::string name;
  bool available = false;
  std::string why_not;
  // Makes one for a device name of this family ("cuda", "cuda:1"); only when available.
  std::function<std::unique_ptr<Backend>(const std::string& device)> create;
};
std::vector<BackendInfo> backends();
// The process's CPU backend (always present).
Backend& cpu_backend();
// A new backend by name ("cpu", "cuda", "cuda:1"); throws Error listing those this build has
// and why an unavailable one cannot run.
std::unique_ptr<Backend> create(const std::string& name);

}  // namespace tetrad::backend
