// An owning, 64-byte aligned, zero-initialised array: the one allocation behind each role
// (parameters, gradients, optimizer moments, activations). Views are plain pointers into it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace tetrad {

template <typename T>
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t n) : n_(n) {
    if (n == 0) return;
    const size_t bytes = ((n * sizeof(T) + 63) / 64) * 64;
    data_ = static_cast<T*>(std::aligned_alloc(64, bytes));
    if (!data_) throw std::bad_alloc();
    std::memset(static_cast<void*>(data_), 0, bytes);
  }
  ~Buffer() { std::free(data_); }
  Buffer(Buffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      std::free(data_);
      data_ = std::exchange(o.data_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return n_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  void zero() {
    if (n_) std::memset(static_cast<void*>(data_), 0, n_ * sizeof(T));
  }

 private:
  T* data_ = nullptr;
  size_t n_ = 0;
};

}  // namespace tetrad
