#include "tetrad/backend/backend.hpp"

#include <utility>

#include "tetrad/backend/cpu/cpu_backend.hpp"
#if TETRAD_HAVE_CUDA
#include "tetrad/backend/cuda/cuda_backend.hpp"
#endif
#include "tetrad/core/error.hpp"

namespace tetrad::backend {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F64: return 8;
    case DType::I32: return 4;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F64: return "f64";
    case DType::I32: return "i32";
  }
  return "?";
}

// ---- DeviceBuffer -----------------------------------------------------------------------------

DeviceBuffer::~DeviceBuffer() { release(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : owner_(std::exchange(o.owner_, nullptr)),
      ptr_(std::exchange(o.ptr_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)),
      kind_(o.kind_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    release();
    owner_ = std::exchange(o.owner_, nullptr);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    kind_ = o.kind_;
  }
  return *this;
}

void DeviceBuffer::release() noexcept {
  if (owner_ && ptr_) owner_->deallocate(ptr_, bytes_, kind_);
  owner_ = nullptr;
  ptr_ = nullptr;
  bytes_ = 0;
}

DeviceBuffer Backend::alloc(size_t bytes, MemoryKind kind) {
  if (bytes == 0) return DeviceBuffer();
  return DeviceBuffer(this, allocate(bytes, kind), bytes, kind);
}

// ---- the op table -----------------------------------------------------------------------------

void check_op_table(const OpTable& t, const char* backend_name) {
#define TETRAD_REQUIRE_OP(op) \
  if (!t.op) fail("backend '", backend_name, "': op table has no ", #op)
  TETRAD_REQUIRE_OP(gemm);
  TETRAD_REQUIRE_OP(bias_add);
  TETRAD_REQUIRE_OP(residual_add);
  TETRAD_REQUIRE_OP(add);
  TETRAD_REQUIRE_OP(bias_grad);
  TETRAD_REQUIRE_OP(norm_row_stats);
  TETRAD_REQUIRE_OP(norm_finish_stats);
  TETRAD_REQUIRE_OP(norm_apply);
  TETRAD_REQUIRE_OP(norm_backward_partials);
  TETRAD_REQUIRE_OP(norm_backward_apply);
  TETRAD_REQUIRE_OP(norm_param_grads);
  TETRAD_REQUIRE_OP(attention_forward);
  TETRAD_REQUIRE_OP(attention_backward);
  TETRAD_REQUIRE_OP(rope_forward);
  TETRAD_REQUIRE_OP(rope_backward);
  TETRAD_REQUIRE_OP(gelu_forward);
  TETRAD_REQUIRE_OP(gelu_backward);
  TETRAD_REQUIRE_OP(swiglu_forward);
  TETRAD_REQUIRE_OP(swiglu_backward);
  TETRAD_REQUIRE_OP(embedding_gather);
  TETRAD_REQUIRE_OP(position_add);
  TETRAD_REQUIRE_OP(embedding_scatter_add);
  TETRAD_REQUIRE_OP(position_grad);
  TETRAD_REQUIRE_OP(ce_row_max);
  TETRAD_REQUIRE_OP(ce_sum_exp_target);
  TETRAD_REQUIRE_OP(ce_loss);
  TETRAD_REQUIRE_OP(ce_grad);
  TETRAD_REQUIRE_OP(row_argmax);
  TETRAD_REQUIRE_OP(sum_squares);
  TETRAD_REQUIRE_OP(cast_f32_to_bf16);
  TETRAD_REQUIRE_OP(cast_bf16_to_f32);
  TETRAD_REQUIRE_OP(round_to_bf16);
  TETRAD_REQUIRE_OP(adamw);
#undef TETRAD_REQUIRE_OP
}

// ---- the registry -----------------------------------------------------------------------------
// One entry per backend compiled in; a GPU backend adds its entry here under its build option
// (e.g. #if TETRAD_WITH_CUDA ... cuda::backend_info() ... #endif), reporting available = false
// with the reason when this machine has no device for it.

std::vector<BackendInfo> backends() {
  std::vector<BackendInfo> list;
  BackendInfo c;
  c.name = "cpu";
  c.available = true;
  c.create = [](const std::string&) { return std::unique_ptr<Backend>(new cpu::CpuBackend()); };
  list.push_back(std::move(c));
#if TETRAD_HAVE_CUDA
  // Listed in every CUDA build; available only where a device answers (the conformance suite
  // then skips it with the runtime's reason on a machine without a GPU).
  list.push_back(cuda::backend_info());
#endif
  return list;
}

Backend& cpu_backend() {
  static cpu::CpuBackend b;
  return b;
}

std::unique_ptr<Backend> create(const std::string& name) {
  std::string known;
  const std::string family = name.substr(0, name.find(':'));
  for (BackendInfo& b : backends()) {
    known += (known.empty() ? "" : ", ") + b.name + (b.available ? "" : " (unavailable)");
    if (b.name != family) continue;
    if (!b.available) fail("backend \"", name, "\" cannot run here: ", b.why_not);
    if (family == "cpu" && name != "cpu") fail("backend \"", name, "\": the cpu backend takes no device index");
    return b.create(name);
  }
  fail("unknown backend \"", name, "\"; this build has: ", known);
}

}  // namespace tetrad::backend
