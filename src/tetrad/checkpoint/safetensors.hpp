// The safetensors file format (Hugging Face): reader and writer.
//
//   bytes [0, 8)        N: u64 little-endian, the length of the JSON header
//   bytes [8, 8+N)      JSON object, UTF-8, padded with spaces so 8+N is a multiple of 8:
//                         "<tensor name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]}
//                         "__metadata__": {"<key>": "<string value>", ...}   (optional)
//   bytes [8+N, end)    the data section; a tensor's bytes are [8+N+b, 8+N+e), row-major,
//                       little-endian. Tensors cover the data section exactly (no gaps, no
//                       overlaps, no trailing bytes), as the reference implementation requires.
//
// The reader maps the file and validates the whole header up front, so every later read is
// in range. Tensors are read as float (from F32, BF16 or F16); other dtypes are listed but
// cannot be read. The writer takes float data and stores it as F32, BF16 or F16
// (round-to-nearest-even), optionally transposing 2-D tensors on the way out.
//
// Not done here: integer tensors, big-endian hosts, writing more than one file (sharding).
// Errors in the world (unreadable, truncated or malformed files) throw tetrad::Error naming the
// file and the tensor. A reader is safe to use from several threads at once.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace tetrad {

// The dtypes the writer produces (and the reader converts to float).
enum class StoreDtype { F32, BF16, F16 };
const char* dtype_name(StoreDtype d);  // "F32" | "BF16" | "F16"

// Scalar conversions used by the reader and writer (exposed for tests).
uint16_t float_to_bf16(float f);  // round to nearest even; NaN stays NaN
float bf16_to_float(uint16_t h);
uint16_t float_to_f16(float f);   // IEEE binary16, round to nearest even, overflow -> inf
float f16_to_float(uint16_t h);

class SafetensorsWriter {
 public:
  // Registers a tensor of `shape` (file layout). The data is NOT copied: `data` must stay valid
  // until write() returns. If `transpose` is true the tensor must be 2-D [r, c] and `data` holds
  // its transpose ([c, r] row-major); the file receives [r, c]. Throws Error on a duplicate
  // name or a name reserved by the format.
  void add(const std::string& name, std::vector<int64_t> shape, const float* data,
           StoreDtype dtype = StoreDtype::F32, bool transpose = false);
  // Registers a tensor whose data is not held by the writer: write_streamed asks for it.
  // `transpose` as for add() (the data handed over is then [c, r]).
  void declare(const std::string& name, std::vector<int64_t> shape,
               StoreDtype dtype = StoreDtype::F32, bool transpose = false);
  // A `__metadata__` entry (the format allows string values only).
  void set_metadata(const std::string& key, const std::string& value);

  // Writes the file atomically (temporary file, fsync, rename). Tensors are laid out by
  // decreasing element size (so every tensor is aligned to its element size), then in the
  // order they were added.
  void write(const std::string& path) const;
  // The same, into a new file at `path` without a temporary name (for a folder that is renamed
  // into place as a whole); still fsync'ed.
  void write_direct(const std::string& path) const;

  // fetch(k, out): fill `out` (numel floats, in the layout add() would take) with the k-th
  // tensor registered (counting add() and declare() alike, from 0).
  using Fetch = std::function<void(size_t k, float* out)>;
  // Writes the file like write() / write_direct() (same bytes), calling fetch once for each
  // declare()d tensor in data order (decreasing element size, then registration order; for
  // tensors of one dtype that is registration order). Holds one tensor in memory at a time:
  // one buffer of the largest declared tensor's size.
  void write_streamed(const std::string& path, bool direct, const Fetch& fetch) const;

 private:
  struct Entry {
    std::string name;
    std::vector<int64_t> shape;
    int64_t numel = 0;
    const float* data = nullptr;
    StoreDtype dtype = StoreDtype::F32;
    bool transpose = false;
    bool declared = false;  // data comes from write_streamed's fetch
  };
  void add_entry(const std::string& name, std::vector<int64_t> shape, const float* data,
                 StoreDtype dtype, bool transpose, bool declared);
  void write_impl(const std::string& path, bool direct, const Fetch* fetch) const;
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

struct TensorInfo {
  std::string name;
  std::string dtype;           // as in the file: "F32", "BF16", "I64", ...
  std::vector<int64_t> shape;
  int64_t numel = 0;
  uint64_t begin = 0, end = 0;  // byte range within the data section
};

class SafetensorsReader {
 public:
  // Maps and validates `path`; throws Error naming the file and the first problem found.
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in data order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(const std::string& name) const;  // nullptr if absent
  const TensorInfo& at(const std::string& name) const;    // throws Error naming file and tensor

  // Converts the tensor to float into `out` (numel floats). With `transpose` the tensor must be
  // 2-D [r, c] and `out` receives [c, r]. Throws Error for dtypes other than F32/BF16/F16.
  void read_float(const std::string& name, float* out, bool transpose = false) const;
  void read_float(const TensorInfo& t, float* out, bool transpose = false) const;
  std::vector<float> read_float(const std::string& name) const;

  // The tensor's raw bytes inside the mapping (valid while the reader lives).
  const uint8_t* raw(const TensorInfo& t) const { return data_ + t.begin; }

 private:
  std::string path_;
  const uint8_t* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// "[64, 128]"
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace tetrad
