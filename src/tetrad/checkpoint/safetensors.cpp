#include "tetrad/checkpoint/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "tetrad/checkpoint/atomic_file.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/json.hpp"

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this code reads it in place");

namespace tetrad {
namespace {

constexpr uint64_t kMaxHeader = 100u << 20;  // the reference implementation's limit

uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }
float float_of(uint32_t u) { return std::bit_cast<float>(u); }

size_t store_size(StoreDtype d) { return d == StoreDtype::F32 ? 4 : 2; }

// Element sizes of the dtypes the format defines (the reader accepts all, converts three).
int64_t dtype_size(const std::string& d) {
  static const std::map<std::string, int64_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},   {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2},
      {"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},     {"U32", 4},     {"F32", 4},
      {"F64", 8},  {"I64", 8}, {"U64", 8}};
  auto it = sizes.find(d);
  return it == sizes.end() ? -1 : it->second;
}

}  // namespace

const char* dtype_name(StoreDtype d) {
  switch (d) {
    case StoreDtype::F32: return "F32";
    case StoreDtype::BF16: return "BF16";
    case StoreDtype::F16: return "F16";
  }
  return "?";
}

uint16_t float_to_bf16(float f) {
  uint32_t x = bits_of(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((x >> 16) | 0x0040u);  // quiet NaN
  x += 0x7FFFu + ((x >> 16) & 1u);  // round to nearest even; overflows to inf correctly
  return uint16_t(x >> 16);
}

float bf16_to_float(uint16_t h) { return float_of(uint32_t(h) << 16); }

uint16_t float_to_f16(float f) {
  const uint32_t x = bits_of(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7E00u | uint16_t((a >> 13) & 0x3FFu);  // NaN
  if (a >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 rounds to inf (and inf itself)
  if (a >= 0x38800000u) {                       // normal in binary16: >= 2^-14
    uint32_t h = (a - 0x38000000u) >> 13;       // rebias exponent 127 -> 15, drop 13 bits
    const uint32_t rem = a & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // carry into exponent is right
    return sign | uint16_t(h);
  }
  // Subnormal binary16: the value in units of 2^-24, rounded to nearest even.
  const int e = int(a >> 23);
  const int shift = 126 - e;  // mant * 2^(e-150) / 2^-24 = mant >> (126 - e)
  if (shift > 24) return sign;
  const uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;
  uint32_t h = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (h & 1u))) ++h;
  return sign | uint16_t(h);
}

float f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0) {
    const float v = float(m) * 0x1p-24f;  // exact: m < 2^10
    return float_of(bits_of(v) | sign);
  }
  if (e == 31) return float_of(sign | 0x7F800000u | (m << 13));
  return float_of(sign | ((e + 112u) << 23) | (m << 13));
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ------------------------------------------------------------------------------------------
// Writer

void SafetensorsWriter::add(const std::string& name, std::vector<int64_t> shape,
                            const float* data, StoreDtype dtype, bool transpose) {
  add_entry(name, std::move(shape), data, dtype, transpose, false);
}

void SafetensorsWriter::declare(const std::string& name, std::vector<int64_t> shape,
                                StoreDtype dtype, bool transpose) {
  add_entry(name, std::move(shape), nullptr, dtype, transpose, true);
}

void SafetensorsWriter::add_entry(const std::string& name, std::vector<int64_t> shape,
                                  const float* data, StoreDtype dtype, bool transpose,
                                  bool declared) {
  if (name.empty() || name == "__metadata__")
    fail("safetensors: '", name, "' cannot be used as a tensor name");
  for (const auto& e : entries_)
    if (e.name == name) fail("safetensors: tensor '", name, "' added twice");
  if (transpose && shape.size() != 2)
    fail("safetensors: tensor '", name, "' has shape ", shape_string(shape),
         "; only 2-D tensors can be transposed");
  Entry e;
  e.name = name;
  e.numel = 1;
  for (int64_t d : shape) {
    TETRAD_CHECK(d >= 0, "negative dimension in tensor ", name);
    e.numel *= d;
  }
  TETRAD_CHECK(declared || data != nullptr || e.numel == 0, "null data for tensor ", name);
  e.shape = std::move(shape);
  e.data = data;
  e.dtype = dtype;
  e.transpose = transpose;
  e.declared = declared;
  entries_.push_back(std::move(e));
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

void SafetensorsWriter::write(const std::string& path) const { write_impl(path, false, nullptr); }
void SafetensorsWriter::write_direct(const std::string& path) const {
  write_impl(path, true, nullptr);
}
void SafetensorsWriter::write_streamed(const std::string& path, bool direct,
                                       const Fetch& fetch) const {
  TETRAD_CHECK(bool(fetch), "write_streamed without a fetch function");
  write_impl(path, direct, &fetch);
}

void SafetensorsWriter::write_impl(const std::string& path, bool direct, const Fetch* fetch) const {
  for (const auto& e : entries_)
    if (e.declared && !fetch)
      fail("safetensors file '", path, "': tensor '", e.name,
           "' was declared without data; write it with write_streamed");
  // Data order: larger elements first (keeps every tensor aligned), then insertion order.
  std::vector<const Entry*> order;
  for (const auto& e : entries_) order.push_back(&e);
  std::stable_sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return store_size(a->dtype) > store_size(b->dtype);
  });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    auto& m = header["__metadata__"];
    for (const auto& [k, v] : metadata_) m[k] = v;
  }
  uint64_t offset = 0;
  for (const Entry* e : order) {
    const uint64_t bytes = uint64_t(e->numel) * store_size(e->dtype);
    header[e->name] = {{"dtype", dtype_name(e->dtype)},
                       {"shape", e->shape},
                       {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& ex) {
    fail("safetensors file '", path, "': cannot encode the header (", ex.what(), ")");
  }
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');

  AtomicFile out(path, direct);
  const uint64_t n = text.size();
  out.write(&n, 8);
  out.write(text.data(), text.size());

  constexpr int64_t kChunk = 1 << 16;  // elements per staging chunk
  std::vector<float> stage(kChunk);
  std::vector<uint16_t> half(kChunk);
  int64_t max_declared = 0;  // one buffer for the streamed tensors, the largest one's size
  for (const auto& e : entries_)
    if (e.declared) max_declared = std::max(max_declared, e.numel);
  std::vector<float> fetched(static_cast<size_t>(max_declared));
  for (const Entry* e : order) {
    const float* data = e->data;
    if (e->declared) {
      (*fetch)(size_t(e - entries_.data()), fetched.data());
      data = fetched.data();
    }
    const int64_t rows = e->transpose ? e->shape[0] : 0, cols = e->transpose ? e->shape[1] : 0;
    for (int64_t i0 = 0; i0 < e->numel; i0 += kChunk) {
      const int64_t n_el = std::min(kChunk, e->numel - i0);
      const float* src = data + i0;
      if (e->transpose) {  // file element i = (r, c) comes from data[c * rows + r]
        for (int64_t k = 0; k < n_el; ++k) {
          const int64_t i = i0 + k, r = i / cols, c = i % cols;
          stage[k] = data[c * rows + r];
        }
        src = stage.data();
      }
      switch (e->dtype) {
        case StoreDtype::F32: out.write(src, size_t(n_el) * 4); break;
        case StoreDtype::BF16:
          for (int64_t k = 0; k < n_el; ++k) half[k] = float_to_bf16(src[k]);
          out.write(half.data(), size_t(n_el) * 2);
          break;
        case StoreDtype::F16:
          for (int64_t k = 0; k < n_el; ++k) half[k] = float_to_f16(src[k]);
          out.write(half.data(), size_t(n_el) * 2);
          break;
      }
    }
  }
  out.commit();
}

// ------------------------------------------------------------------------------------------
// Reader

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  auto bad = [&](const auto&... what) { fail("safetensors file '", path_, "': ", what...); };

  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open safetensors file '", path, "': ", std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail("cannot stat '", path, "': ", std::strerror(err));
  }
  const uint64_t file_size = uint64_t(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    bad("only ", file_size, " bytes long; a safetensors file starts with an 8-byte header length");
  }
  void* m = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_err = errno;
  ::close(fd);
  if (m == MAP_FAILED) fail("cannot map '", path, "': ", std::strerror(map_err));
  map_ = static_cast<const uint8_t*>(m);
  map_size_ = file_size;

  try {
    uint64_t n;
    std::memcpy(&n, map_, 8);
    if (n > kMaxHeader)
      bad("header length ", n, " is larger than the format's 100 MB limit (not a safetensors "
          "file, or a corrupt one)");
    if (n > file_size - 8)
      bad("header length ", n, " runs past the end of the file (", file_size,
          " bytes): truncated or not a safetensors file");
    if (n == 0 || map_[8] != '{') bad("the header does not start with '{'");
    const char* hb = reinterpret_cast<const char*>(map_ + 8);
    nlohmann::json h;
    check_json_depth(std::string_view(hb, size_t(n)), "'" + path + "' (its header)");
    try {
      h = nlohmann::json::parse(hb, hb + n);
    } catch (const nlohmann::json::exception& ex) {
      bad("the header is not valid JSON (", ex.what(), ")");
    }
    if (!h.is_object()) bad("the header is not a JSON object");
    data_ = map_ + 8 + n;
    const uint64_t data_size = file_size - 8 - n;

    for (auto it = h.begin(); it != h.end(); ++it) {
      const std::string& name = it.key();
      const nlohmann::json& v = it.value();
      if (name == "__metadata__") {
        if (!v.is_object()) bad("__metadata__ must be an object of strings");
        for (auto mi = v.begin(); mi != v.end(); ++mi) {
          if (!mi.value().is_string())
            bad("__metadata__ entry '", mi.key(), "' is not a string");
          metadata_[mi.key()] = mi.value().get<std::string>();
        }
        continue;
      }
      auto bad_t = [&](const auto&... what) { bad("tensor '", name, "': ", what...); };
      if (!v.is_object()) bad_t("entry is not an object");
      if (!v.contains("dtype") || !v["dtype"].is_string()) bad_t("missing string field 'dtype'");
      if (!v.contains("shape") || !v["shape"].is_array()) bad_t("missing array field 'shape'");
      if (!v.contains("data_offsets") || !v["data_offsets"].is_array() ||
          v["data_offsets"].size() != 2)
        bad_t("missing field 'data_offsets' (an array [begin, end])");
      TensorInfo t;
      t.name = name;
      t.dtype = v["dtype"].get<std::string>();
      const int64_t esize = dtype_size(t.dtype);
      if (esize < 0) bad_t("unknown dtype '", t.dtype, "'");
      t.numel = 1;
      for (const auto& d : v["shape"]) {
        if (!d.is_number_unsigned()) bad_t("shape ", v["shape"].dump(), " is not a list of sizes");
        const uint64_t dim = d.get<uint64_t>();
        if (dim > (uint64_t(1) << 48) ||
            __builtin_mul_overflow(t.numel, int64_t(dim), &t.numel) || t.numel > (int64_t(1) << 56))
          bad_t("shape ", v["shape"].dump(), " is implausibly large");
        t.shape.push_back(int64_t(dim));
      }
      for (const auto& o : v["data_offsets"])
        if (!o.is_number_unsigned()) bad_t("data_offsets ", v["data_offsets"].dump(),
                                           " are not two non-negative integers");
      t.begin = v["data_offsets"][0].get<uint64_t>();
      t.end = v["data_offsets"][1].get<uint64_t>();
      if (t.end < t.begin)
        bad_t("data_offsets [", t.begin, ", ", t.end, "] end before they begin");
      const uint64_t need = uint64_t(t.numel) * uint64_t(esize);
      if (t.end - t.begin != need)
        bad_t("data_offsets [", t.begin, ", ", t.end, "] hold ", t.end - t.begin,
              " bytes, but dtype ", t.dtype, " and shape ", shape_string(t.shape), " need ", need);
      if (t.end > data_size)
        bad_t("data_offsets [", t.begin, ", ", t.end, "] run past the end of the data (",
              data_size, " bytes): the file is truncated or the header is wrong");
      tensors_.push_back(std::move(t));
    }

    std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    uint64_t pos = 0;
    const TensorInfo* prev = nullptr;
    for (const auto& t : tensors_) {
      if (t.begin < pos)
        bad("tensors '", prev->name, "' [", prev->begin, ", ", prev->end, ") and '", t.name,
            "' [", t.begin, ", ", t.end, ") overlap");
      if (t.begin > pos) bad("no tensor covers data bytes [", pos, ", ", t.begin, ")");
      pos = t.end;
      if (t.end > t.begin || !prev) prev = &t;
    }
    if (pos != data_size)
      bad("the tensors end at data byte ", pos, " but the file holds ", data_size,
          " data bytes (trailing bytes after the last tensor)");
    for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
  } catch (...) {
    ::munmap(const_cast<uint8_t*>(map_), map_size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), map_size_);
}

const TensorInfo* SafetensorsReader::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& SafetensorsReader::at(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (!t) fail("safetensors file '", path_, "' has no tensor '", name, "'");
  return *t;
}

void SafetensorsReader::read_float(const std::string& name, float* out, bool transpose) const {
  read_float(at(name), out, transpose);
}

std::vector<float> SafetensorsReader::read_float(const std::string& name) const {
  const TensorInfo& t = at(name);
  std::vector<float> v(size_t(t.numel));
  read_float(t, v.data());
  return v;
}

void SafetensorsReader::read_float(const TensorInfo& t, float* out, bool transpose) const {
  if (transpose && t.shape.size() != 2)
    fail("safetensors file '", path_, "': tensor '", t.name, "' has shape ",
         shape_string(t.shape), "; only 2-D tensors can be read transposed");
  int kind;  // 0 F32, 1 BF16, 2 F16
  if (t.dtype == "F32") kind = 0;
  else if (t.dtype == "BF16") kind = 1;
  else if (t.dtype == "F16") kind = 2;
  else
    fail("safetensors file '", path_, "': tensor '", t.name, "' has dtype ", t.dtype,
         "; only F32, BF16 and F16 tensors can be read as float");
  const uint8_t* src = raw(t);
  const int64_t rows = transpose ? t.shape[0] : 1, cols = transpose ? t.shape[1] : t.numel;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      float v;
      if (kind == 0) {
        std::memcpy(&v, src + 4 * i, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        v = kind == 1 ? bf16_to_float(h) : f16_to_float(h);
      }
      out[transpose ? c * rows + r : i] = v;
    }
  }
}

}  // namespace tetrad
