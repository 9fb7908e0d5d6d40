#include "tetrad/backend/backend.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>

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

// ---- host memory ------------------------------------------------------------------------------

namespace {

// The first whitespace-separated number of a file (0 where it is missing or not a number, such as
// cgroup v2's "max").
double read_number(const char* path) {
  std::ifstream f(path);
  std::string v;
  if (!(f >> v) || v.empty() || !std::isdigit(static_cast<unsigned char>(v[0]))) return 0;
  return std::strtod(v.c_str(), nullptr);
}

// `key value` lines (/proc/meminfo, memory.stat): the value of key, scaled; 0 when absent.
double read_keyed(const char* path, const std::string& key, double scale) {
  std::ifstream f(path);
  std::string k, rest;
  double v = 0;
  while (f >> k >> v) {
    std::getline(f, rest);
    if (k == key) return v * scale;
  }
  return 0;
}

}  // namespace

MemoryAvailable host_memory_available() {
  MemoryAvailable m;
  m.host_shared = true;
  m.available = uint64_t(read_keyed("/proc/meminfo", "MemAvailable:", 1024));
  m.total = uint64_t(read_keyed("/proc/meminfo", "MemTotal:", 1024));
  m.source = "MemAvailable";
  // A cgroup's limit less its working set (usage without the inactive file cache, which the kernel
  // reclaims before it counts against the limit), where that is lower: a container's share.
  struct Cgroup { const char *limit, *usage, *stat, *inactive, *name; };
  for (const Cgroup& c : {Cgroup{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current",
                                 "/sys/fs/cgroup/memory.stat", "inactive_file", "cgroup memory.max"},
                          Cgroup{"/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                 "/sys/fs/cgroup/memory/memory.usage_in_bytes",
                                 "/sys/fs/cgroup/memory/memory.stat", "total_inactive_file",
                                 "cgroup memory.limit_in_bytes"}}) {
    const double limit = read_number(c.limit);
    if (!(limit > 0 && limit < 1e18)) continue;  // none, "max", or v1's "unlimited" 2^63
    const double used = std::max(0.0, read_number(c.usage) - read_keyed(c.stat, c.inactive, 1));
    const double avail = std::max(0.0, limit - used);
    if (m.available == 0 || avail < double(m.available)) {
      m.available = uint64_t(avail);
      m.source = c.name;
    }
    if (m.total == 0 || limit < double(m.total)) m.total = uint64_t(limit);
    break;
  }
  return m;
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

PrecisionChoice resolve_precision(const std::string& setting, const Backend& device) {
  if (setting == "auto") return device.auto_precision();
  if (setting == "fp32" || setting == "bf16") return {parse_precision(setting), ""};
  fail("precision must be \"fp32\", \"bf16\" or \"auto\", got \"", setting, "\"");
}

Bf16Status Backend::bf16_status() const {
  const Capabilities& c = capabilities();
  return {c.gemm_bf16_native, c.gemm_bf16_path, "", ""};
}

PrecisionChoice Backend::auto_precision() const {
  const Capabilities& c = capabilities();
  if (c.gemm_bf16_native) return {Precision::BF16, "bf16 GEMMs here: " + c.gemm_bf16_path};
  return {Precision::FP32, c.gemm_bf16 ? "bf16 would be " + c.gemm_bf16_path
                                       : "bf16 GEMMs do not run here"};
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
  TETRAD_REQUIRE_OP(grouped_gemm);
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
  TETRAD_REQUIRE_OP(attention_merge);
  TETRAD_REQUIRE_OP(rope_forward);
  TETRAD_REQUIRE_OP(rope_backward);
  TETRAD_REQUIRE_OP(head_norm_forward);
  TETRAD_REQUIRE_OP(head_norm_backward);
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
  TETRAD_REQUIRE_OP(moe_permute);
  TETRAD_REQUIRE_OP(moe_permute_backward);
  TETRAD_REQUIRE_OP(moe_unpermute);
  TETRAD_REQUIRE_OP(moe_unpermute_backward);
#undef TETRAD_REQUIRE_OP
}

}  // namespace tetrad::backend
