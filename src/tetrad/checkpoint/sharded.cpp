#include "tetrad/data/tokenizer.hpp"
#include "tetrad/checkpoint/sharded.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "tetrad/checkpoint/atomic_file.hpp"
#include "tetrad/checkpoint/hf_config.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/json.hpp"
#include "tetrad/core/hash.hpp"

namespace fs = std::filesystem;

namespace tetrad {

using parallel::GridCoord;
using parallel::GridShape;
using parallel::ShardLayout;
using parallel::ShardPlan;
using parallel::TensorShard;

namespace {

// The saving grid's layer split: the recorded counts, or (none recorded: one chunk list from
// before uneven splits existed) the even split over Gp x virtual_stages.
parallel::LayerSplit saving_split(const ModelConfig& model, const ShardedCheckpointInfo& info) {
  if (info.grid.p() == 1) return {};
  if (info.pipeline_layers.empty())
    return parallel::LayerSplit::even(model.n_layer, info.grid.p() * info.virtual_stages);
  const parallel::LayerSplit split = parallel::LayerSplit::from_counts(info.pipeline_layers,
                                                                       model.n_layer);
  if (split.virtual_stages() != info.grid.p() * info.virtual_stages)
    fail("checkpoint: pipeline_layers ", split.to_string(), " has ", split.virtual_stages(),
         " virtual stages, expected Gp x virtual_stages = ", info.grid.p(), " x ",
         info.virtual_stages);
  return split;
}

constexpr char kShardFileMagic[8] = {'T', 'T', 'R', 'D', 'S', 'H', 'R', 'D'};

void put_u32(char* p, uint32_t v) { std::memcpy(p, &v, 4); }  // little-endian hosts only (x86)
void put_u64(char* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint32_t get_u32(const char* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
uint64_t get_u64(const char* p) { uint64_t v; std::memcpy(&v, p, 8); return v; }

std::string errno_text() { return std::strerror(errno); }

uint64_t parse_hex(const nlohmann::json& j, const std::string& what) {
  if (!j.is_string()) fail(what, ": expected a hex string, got ", j.dump());
  try {
    size_t used = 0;
    const std::string s = j.get<std::string>();
    const uint64_t v = std::stoull(s, &used, 16);
    if (used != s.size()) throw std::invalid_argument(s);
    return v;
  } catch (const std::exception&) {
    fail(what, ": '", j.get<std::string>(), "' is not a hex number");
  }
}

int64_t elems_of(const TensorShard& t) {
  return t.spec->shape.size() == 2 ? t.spec->shape[1] : t.spec->shape[0];
}

// A segment of consecutive global indices, before run compression.
struct Seg {
  int64_t start, len;
};

// Global segments of a rank's shard in local order, contiguous ones merged.
std::vector<Seg> shard_segments(const TensorShard& t, const GridShape& grid, const GridCoord& c) {
  const int64_t b0 = t.z_sharded ? t.shard_numel * c.z() : 0;
  const int64_t b1 = b0 + t.shard_numel;
  (void)grid;
  std::vector<Seg> segs;
  auto push = [&](int64_t start, int64_t len) {
    if (len <= 0) return;
    if (!segs.empty() && segs.back().start + segs.back().len == start) {
      segs.back().len += len;
    } else {
      segs.push_back({start, len});
    }
  };
  if (t.col0 < 0) {  // 1-D entry list: block element i is element rows[i]
    for (int64_t i = b0; i < b1; ++i) push(t.rows[size_t(i)], 1);
    return segs;
  }
  const int64_t K = elems_of(t);
  if (t.cols == 0) return segs;
  for (int64_t r = b0 / t.cols; r * t.cols < b1 && r < int64_t(t.rows.size()); ++r) {
    const int64_t lo = std::max(b0, r * t.cols), hi = std::min(b1, (r + 1) * t.cols);
    push(t.rows[size_t(r)] * K + t.col0 + (lo - r * t.cols), hi - lo);
  }
  return segs;
}

std::vector<IndexRun> compress(const std::vector<Seg>& segs) {
  std::vector<IndexRun> runs;
  for (const Seg& s : segs) {
    if (!runs.empty()) {
      IndexRun& r = runs.back();
      if (r.len == s.len && r.count == 1 && s.start > r.start) {
        r.stride = s.start - r.start;
        r.count = 2;
        continue;
      }
      if (r.len == s.len && r.count > 1 && s.start == r.start + r.count * r.stride) {
        ++r.count;
        continue;
      }
    }
    runs.push_back({s.start, s.len, s.len, 1});
  }
  return runs;
}

template <typename F>
void for_each_segment(const std::vector<IndexRun>& runs, F&& f) {
  for (const IndexRun& r : runs)
    for (int64_t k = 0; k < r.count; ++k) f(r.start + k * r.stride, r.len);
}

nlohmann::json runs_json(const std::vector<IndexRun>& runs) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& r : runs) a.push_back({r.start, r.len, r.stride, r.count});
  return a;
}

std::string meta_path(const std::string& dir) { return (fs::path(dir) / kShardedMetaFile).string(); }

uint64_t meta_checksum(nlohmann::json meta) {
  meta.erase("checksum");
  const std::string text = meta.dump();
  return hash64(text.data(), text.size());
}

// A piece as read from the metadata.
struct SavedPiece {
  int array;
  size_t tensor;
  int64_t offset, numel;
  std::vector<IndexRun> runs;
};
struct SavedFile {
  std::string name;
  int rank = 0;
  int64_t data_bytes = 0;
  std::vector<uint64_t> chunk_hashes;
  std::vector<SavedPiece> pieces;
};
struct TensorMeta {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
};
struct ParsedMeta {
  nlohmann::json json;
  uint64_t id = 0;
  int64_t step = 0;
  bool has_moments = true;
  std::vector<TensorMeta> tensors;
  std::vector<SavedFile> files;
};

ParsedMeta parse_meta(const std::string& dir) {
  const std::string path = meta_path(dir);
  std::error_code ec;
  if (!fs::exists(path, ec))
    fail("checkpoint ", dir, ": ", kShardedMetaFile, " is missing (an incomplete or damaged "
         "checkpoint)");
  ParsedMeta m;
  const std::string text = read_small_file(path);
  check_json_depth(text, path);
  try {
    m.json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": not valid JSON (damaged or truncated): ", e.what());
  }
  const nlohmann::json& j = m.json;
  if (!j.is_object() || !j.contains("magic") || j["magic"] != kShardedMagic)
    fail(path, ": not a tetrad sharded checkpoint (magic '", kShardedMagic, "' missing)");
  try {
    const int version = j.at("version").get<int>();
    if (version > kShardedVersion)
      fail(path, ": format version ", version, " is newer than this tetrad reads (", kShardedVersion,
           "); update tetrad");
    if (version != kShardedVersion)
      fail(path, ": unknown format version ", version, " (expected ", kShardedVersion, ")");
    const uint64_t recorded = parse_hex(j.at("checksum"), path + " checksum");
    const uint64_t actual = meta_checksum(j);
    if (recorded != actual)
      fail(path, ": checksum ", hex64(actual), " differs from the recorded ", hex64(recorded),
           " (the metadata was modified or damaged)");
    m.id = parse_hex(j.at("checkpoint_id"), path + " checkpoint_id");
    m.step = j.at("step").get<int64_t>();
    m.has_moments = j.at("has_moments").get<bool>();
    for (const auto& t : j.at("tensors")) {
      TensorMeta tm;
      tm.name = t.at("name").get<std::string>();
      tm.shape = t.at("shape").get<std::vector<int64_t>>();
      if (t.at("dtype") != "F32") fail(path, ": tensor '", tm.name, "' has dtype ", t["dtype"].dump(), "; only F32 is written");
      tm.numel = 1;
      for (int64_t d : tm.shape) tm.numel *= d;
      m.tensors.push_back(std::move(tm));
    }
    for (const auto& f : j.at("files")) {
      SavedFile sf;
      sf.name = f.at("name").get<std::string>();
      if (sf.name.find('/') != std::string::npos || sf.name.empty() || sf.name[0] == '.')
        fail(path, ": bad shard file name '", sf.name, "'");
      sf.rank = f.at("rank").get<int>();
      sf.data_bytes = f.at("data_bytes").get<int64_t>();
      for (const auto& h : f.at("chunk_xxh64")) sf.chunk_hashes.push_back(parse_hex(h, path + " chunk_xxh64"));
      const int64_t chunks = (sf.data_bytes + kShardChunkBytes - 1) / kShardChunkBytes;
      if (int64_t(sf.chunk_hashes.size()) != chunks)
        fail(path, ": ", sf.name, " has ", sf.chunk_hashes.size(), " chunk checksums for ",
             sf.data_bytes, " bytes (expected ", chunks, ")");
      for (const auto& p : f.at("pieces")) {
        SavedPiece sp;
        sp.array = p.at("array").get<int>();
        sp.tensor = p.at("tensor").get<size_t>();
        sp.offset = p.at("offset").get<int64_t>();
        sp.numel = p.at("numel").get<int64_t>();
        for (const auto& r : p.at("runs")) {
          IndexRun ir{r.at(0).get<int64_t>(), r.at(1).get<int64_t>(), r.at(2).get<int64_t>(),
                      r.at(3).get<int64_t>()};
          if (ir.len <= 0 || ir.count <= 0 || ir.start < 0) fail(path, ": bad index run in ", sf.name);
          sp.runs.push_back(ir);
        }
        if (sp.array < 0 || sp.array >= kShardedArrays || sp.tensor >= m.tensors.size())
          fail(path, ": piece of ", sf.name, " names array ", sp.array, " / tensor ", sp.tensor,
               ", which do not exist");
        if (sp.offset < 0 || sp.offset + sp.numel * 4 > sf.data_bytes)
          fail(path, ": piece of ", sf.name, " lies outside its ", sf.data_bytes, " data bytes");
        sf.pieces.push_back(std::move(sp));
      }
      m.files.push_back(std::move(sf));
    }
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": missing or mistyped field: ", e.what());
  }
  return m;
}

// Saved segments of one (array, tensor), sorted by global start.
struct SavedSeg {
  int64_t start, len;
  int file;
  int64_t byte;  // data-section byte of element `start`
};
using SegIndex = std::vector<std::vector<std::vector<SavedSeg>>>;  // [array][tensor]

// Builds the index and checks that each array's tensors are covered exactly once.
SegIndex build_index(const ParsedMeta& m, const std::string& dir) {
  SegIndex idx(kShardedArrays, std::vector<std::vector<SavedSeg>>(m.tensors.size()));
  for (size_t f = 0; f < m.files.size(); ++f)
    for (const SavedPiece& p : m.files[f].pieces) {
      int64_t byte = p.offset, n = 0;
      for_each_segment(p.runs, [&](int64_t start, int64_t len) {
        idx[size_t(p.array)][p.tensor].push_back({start, len, int(f), byte});
        byte += len * 4;
        n += len;
      });
      if (n != p.numel)
        fail("checkpoint ", dir, ": a piece of ", m.files[f].name, " lists ", n,
             " elements but records numel ", p.numel);
    }
  for (int a = 0; a < (m.has_moments ? kShardedArrays : 1); ++a)
    for (size_t t = 0; t < m.tensors.size(); ++t) {
      auto& v = idx[size_t(a)][t];
      std::sort(v.begin(), v.end(), [](const SavedSeg& x, const SavedSeg& y) { return x.start < y.start; });
      int64_t next = 0;
      for (const SavedSeg& s : v) {
        if (s.start != next)
          fail("checkpoint ", dir, ": ", sharded_array_name(a), " of tensor '", m.tensors[t].name,
               "' ", s.start < next ? "has overlapping pieces" : "is missing elements", " at index ",
               std::min(s.start, next));
        next = s.start + s.len;
      }
      if (next != m.tensors[t].numel)
        fail("checkpoint ", dir, ": ", sharded_array_name(a), " of tensor '", m.tensors[t].name,
             "' covers ", next, " of its ", m.tensors[t].numel, " elements");
    }
  return idx;
}

// An open shard file with its header checked.
class ShardReader {
 public:
  ShardReader(const std::string& dir, const SavedFile& f, const ParsedMeta& m) : f_(f) {
    path_ = (fs::path(dir) / f.name).string();
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail("checkpoint ", dir, ": cannot open shard ", f.name, ": ", errno_text());
    struct stat st{};
    if (::fstat(fd_, &st) != 0) fail("cannot stat '", path_, "': ", errno_text());
    const int64_t expect = kShardHeaderBytes + f.data_bytes;
    if (st.st_size != expect)
      fail("checkpoint ", dir, ": shard ", f.name, " has ", int64_t(st.st_size), " bytes but the "
           "metadata records ", expect, st.st_size < expect ? " (truncated)" : "");
    char h[kShardHeaderBytes];
    read_exact(h, kShardHeaderBytes, 0);
    if (std::memcmp(h, kShardFileMagic, 8) != 0)
      fail("checkpoint ", dir, ": shard ", f.name, " does not start with the magic TTRDSHRD");
    if (get_u32(h + 8) != uint32_t(kShardedVersion))
      fail("checkpoint ", dir, ": shard ", f.name, " has format version ", get_u32(h + 8));
    if (get_u64(h + 24) != m.id || int64_t(get_u64(h + 16)) != m.step ||
        int64_t(get_u64(h + 32)) != f.data_bytes || int(get_u32(h + 12)) != f.rank)
      fail("checkpoint ", dir, ": shard ", f.name, " belongs to another checkpoint (its header's "
           "step, id, rank or size differ from the metadata)");
  }
  ~ShardReader() {
    if (fd_ >= 0) ::close(fd_);
  }
  ShardReader(ShardReader&& o) noexcept : f_(o.f_), path_(std::move(o.path_)), fd_(o.fd_) { o.fd_ = -1; }

  void read_exact(char* out, int64_t n, int64_t pos) const {
    while (n > 0) {
      const ssize_t r = ::pread(fd_, out, size_t(n), pos);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) fail("cannot read '", path_, "': ", errno_text());
      if (r == 0) fail("'", path_, "' is shorter than recorded (truncated)");
      out += r;
      n -= r;
      pos += r;
    }
  }
  // Reads data chunks [c0, c1) into buf and verifies each.
  void read_chunks(int64_t c0, int64_t c1, std::vector<char>& buf) const {
    const int64_t b0 = c0 * kShardChunkBytes, b1 = std::min(f_.data_bytes, c1 * kShardChunkBytes);
    buf.resize(size_t(b1 - b0));
    read_exact(buf.data(), b1 - b0, kShardHeaderBytes + b0);
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t lo = c * kShardChunkBytes - b0;
      const int64_t hi = std::min(b1, (c + 1) * kShardChunkBytes) - b0;
      const uint64_t h = hash64(buf.data() + lo, size_t(hi - lo));
      if (h != f_.chunk_hashes[size_t(c)])
        fail("checkpoint shard '", path_, "': checksum of chunk ", c, " (bytes ",
             kShardHeaderBytes + c * kShardChunkBytes, "..", kShardHeaderBytes + b0 + hi,
             ") is ", hex64(h), ", expected ", hex64(f_.chunk_hashes[size_t(c)]),
             " (the file is damaged)");
    }
  }
  const SavedFile& file() const { return f_; }

 private:
  const SavedFile& f_;
  std::string path_;
  int fd_ = -1;
};

ModelConfig model_of(const ParsedMeta& m, const std::string& dir) {
  try {
    return parse_hf_config(m.json.at("model"), meta_path(dir) + " (model)");
  } catch (const nlohmann::json::exception& e) {
    fail(meta_path(dir), ": no model config: ", e.what());
  }
}

void check_model(const ModelConfig& saved, const ModelConfig& want, const std::string& dir) {
  std::ostringstream diff;
  auto cmp = [&](const char* name, auto a, auto b) {
    if (a != b) diff << "\n  " << name << ": checkpoint " << a << ", config " << b;
  };
  cmp("family", family_name(saved.family), family_name(want.family));
  cmp("model.n_layer", saved.n_layer, want.n_layer);
  cmp("model.n_embd", saved.n_embd, want.n_embd);
  cmp("model.n_head", saved.n_head, want.n_head);
  cmp("model.n_kv_head", saved.n_kv_head, want.n_kv_head);
  cmp("model.head_dim", saved.head_dim(), want.head_dim());
  cmp("model.ffn", saved.ffn, want.ffn);
  cmp("model.vocab_size", saved.vocab_size, want.vocab_size);
  cmp("model.max_seq", saved.max_seq, want.max_seq);
  cmp("model.norm_eps", saved.norm_eps, want.norm_eps);
  cmp("model.tie_embeddings", saved.tie_embeddings, want.tie_embeddings);
  if (want.desc().positions == Positions::Rope) {
    cmp("model.rope_theta", saved.rope_theta, want.rope_theta);
    cmp("model.rope_type", saved.rope_type, want.rope_type);
    if (want.rope_llama3() && saved.rope_llama3()) {
      cmp("model.rope_factor", saved.rope_factor, want.rope_factor);
      cmp("model.rope_low_freq_factor", saved.rope_low_freq_factor, want.rope_low_freq_factor);
      cmp("model.rope_high_freq_factor", saved.rope_high_freq_factor, want.rope_high_freq_factor);
      cmp("model.rope_original_max_position", saved.rope_original_max_position,
          want.rope_original_max_position);
    }
  }
  if (!diff.str().empty())
    fail("checkpoint ", dir, " was saved for another model than the config describes:", diff.str(),
         "\n(resume with the model settings it was trained with, or start a new run.dir)");
}

ShardedCheckpointInfo info_of(const ParsedMeta& m) {
  ShardedCheckpointInfo info;
  const auto& j = m.json;
  info.step = m.step;
  const auto& g = j.at("grid");
  info.grid = GridShape{g.at("x").get<int>(), g.at("y").get<int>(), g.at("z").get<int>(),
                        g.at("d").get<int>()};
  // A pipeline grid also records p and the chunks per stage (absent: p = 1, written before the
  // pipeline existed).
  info.grid[parallel::Axis::P] = g.value("p", 1);
  // A context-parallel grid records c (absent: 1).
  info.grid[parallel::Axis::C] = g.value("c", 1);
  // The expert fold (absent: 1); whole tensors are written, so any other E reads them.
  info.grid.set_e(g.value("e", 1));
  info.virtual_stages = g.value("virtual_stages", 1);
  info.pipeline_layers = g.value("pipeline_layers", std::vector<int>{});
  info.tokenizer_identity = j.at("tokenizer_identity").is_null()
                                ? 0
                                : parse_hex(j["tokenizer_identity"], "tokenizer_identity");
  info.data = j.value("data", nlohmann::json::object());
  info.rng = j.value("rng", nlohmann::json::object());
  info.extra = j.value("extra", nlohmann::json::object());
  info.has_moments = m.has_moments;
  return info;
}

}  // namespace

const char* sharded_array_name(int array) {
  static const char* names[] = {"params", "adam_m", "adam_v"};
  TETRAD_CHECK(array >= 0 && array < kShardedArrays);
  return names[array];
}

std::vector<IndexRun> shard_index_runs(const TensorShard& t, const GridShape& grid,
                                       const GridCoord& coord) {
  return compress(shard_segments(t, grid, coord));
}

bool writes_shard(const TensorShard& t, const GridCoord& c) {
  // Data and context replicas hold the same shards (an expert tensor's: its expert-data group).
  if (!t.first_replica) return false;
  // Top-level tensors: every pipeline stage keeps the same copy; the first stage writes it.
  // (A layer's tensors are stored, hence written, by its stage alone: shard_numel = 0 elsewhere.)
  if (t.spec->layer < 0 && c.p() != 0) return false;
  if (!t.z_sharded && c.z() != 0) return false;
  if (t.layout == ShardLayout::ColsX && c.y() != 0) return false;
  if (t.layout == ShardLayout::RowsY && c.x() != 0) return false;
  if (t.layout == ShardLayout::Replicated && (c.x() != 0 || c.y() != 0)) return false;
  return true;
}

std::vector<ShardPiece> shard_file_pieces(const ShardPlan& plan, int64_t* data_bytes) {
  std::vector<ShardPiece> pieces;
  int64_t off = 0;
  for (int a = 0; a < kShardedArrays; ++a)
    for (size_t i = 0; i < plan.tensors.size(); ++i) {
      const TensorShard& t = plan.tensors[i];
      if (!writes_shard(t, plan.coord) || t.shard_numel == 0) continue;
      ShardPiece p;
      p.array = a;
      p.tensor = i;
      p.offset = off;
      p.numel = t.shard_numel;
      p.local_offset = t.offset;
      p.runs = shard_index_runs(t, plan.grid, plan.coord);
      off += p.numel * 4;
      pieces.push_back(std::move(p));
    }
  if (data_bytes) *data_bytes = off;
  return pieces;
}

std::string shard_file_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "shard_%05d.bin", rank);
  return buf;
}

ShardSnapshot snapshot_shards(const ShardPlan& plan, const float* params, const float* adam_m,
                              const float* adam_v, bool with_moments) {
  ShardSnapshot s;
  int64_t bytes = 0;
  s.pieces = shard_file_pieces(plan, &bytes);
  if (!with_moments) {
    s.pieces.erase(std::remove_if(s.pieces.begin(), s.pieces.end(),
                                  [](const ShardPiece& p) { return p.array != 0; }),
                   s.pieces.end());
    bytes = s.pieces.empty() ? 0 : s.pieces.back().offset + s.pieces.back().numel * 4;
  }
  s.data.resize(size_t(bytes));
  const float* src[kShardedArrays] = {params, adam_m, adam_v};
  for (const ShardPiece& p : s.pieces) {
    TETRAD_CHECK(src[p.array] != nullptr, "snapshot_shards: missing ", sharded_array_name(p.array));
    std::memcpy(s.data.data() + p.offset, src[p.array] + p.local_offset, size_t(p.numel) * 4);
  }
  return s;
}

std::vector<uint64_t> write_shard_file(const std::string& path,
                                       const std::vector<std::pair<const char*, size_t>>& parts,
                                       int rank, int64_t step, uint64_t checkpoint_id) {
  size_t n = 0;
  for (const auto& part : parts) n += part.second;
  char h[kShardHeaderBytes] = {};
  std::memcpy(h, kShardFileMagic, 8);
  put_u32(h + 8, kShardedVersion);
  put_u32(h + 12, uint32_t(rank));
  put_u64(h + 16, uint64_t(step));
  put_u64(h + 24, checkpoint_id);
  put_u64(h + 32, uint64_t(n));
  AtomicFile f(path, /*direct=*/true);
  f.write(h, sizeof h);
  std::vector<uint64_t> hashes;
  // Chunks may span parts: hash incrementally, each piece just before writing it (in cache).
  std::unique_ptr<Hasher64> chunk;
  size_t in_chunk = 0;
  int64_t written = kShardHeaderBytes;
  constexpr size_t kWrite = 8 * size_t(kShardChunkBytes);
  for (const auto& [ptr, size] : parts)
    for (size_t w = 0; w < size; w += kWrite) {
      const size_t len = std::min(size - w, kWrite);
      for (size_t o = 0; o < len;) {
        if (!chunk) chunk = std::make_unique<Hasher64>(0);
        const size_t take = std::min(len - o, size_t(kShardChunkBytes) - in_chunk);
        chunk->update(ptr + w + o, take);
        in_chunk += take;
        o += take;
        if (in_chunk == size_t(kShardChunkBytes)) {
          hashes.push_back(chunk->digest());
          chunk.reset();
          in_chunk = 0;
        }
      }
      f.write(ptr + w, len);
      // Keep the disk busy while the next pieces are hashed and copied.
      f.start_writeback(written, int64_t(len));
      written += int64_t(len);
    }
  if (chunk) hashes.push_back(chunk->digest());
  f.commit();
  return hashes;
}

std::vector<uint64_t> write_shard_file(const std::string& path, const ShardSnapshot& s, int rank,
                                       int64_t step, uint64_t checkpoint_id) {
  return write_shard_file(path, {{s.data.data(), s.data.size()}}, rank, step, checkpoint_id);
}

nlohmann::json build_sharded_meta(const ModelConfig& model, const ParamTable& table,
                                  const ShardedCheckpointInfo& info, uint64_t checkpoint_id,
                                  const std::vector<int64_t>& data_bytes,
                                  const std::vector<std::vector<uint64_t>>& chunk_hashes) {
  const GridShape& g = info.grid;
  TETRAD_CHECK(int(data_bytes.size()) == g.size() && int(chunk_hashes.size()) == g.size());
  nlohmann::json j;
  j["magic"] = kShardedMagic;
  j["version"] = kShardedVersion;
  j["checkpoint_id"] = hex64(checkpoint_id);
  j["step"] = info.step;
  j["grid"] = {{"x", g.x()}, {"y", g.y()}, {"z", g.z()}, {"d", g.d()}};
  if (g.c() > 1) j["grid"]["c"] = g.c();
  if (g.e() > 1) j["grid"]["e"] = g.e();  // the expert fold (absent: 1)
  if (g.p() > 1) {
    j["grid"]["p"] = g.p();
    j["grid"]["virtual_stages"] = info.virtual_stages;
    j["grid"]["pipeline_layers"] = saving_split(model, info).counts();
  }
  j["model"] = hf_config_json(model);
  j["tokenizer_identity"] = info.tokenizer_identity ? nlohmann::json(hex64(info.tokenizer_identity))
                                                    : nlohmann::json(nullptr);
  j["data"] = info.data;
  j["rng"] = info.rng;
  j["extra"] = info.extra;
  j["has_moments"] = info.has_moments;
  j["arrays"] = info.has_moments ? nlohmann::json{"params", "adam_m", "adam_v"}
                                 : nlohmann::json{"params"};
  j["chunk_bytes"] = kShardChunkBytes;
  j["header_bytes"] = kShardHeaderBytes;
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& s : table.specs)
    tensors.push_back({{"name", s.name}, {"shape", s.shape}, {"dtype", "F32"}});
  j["tensors"] = tensors;
  nlohmann::json files = nlohmann::json::array();
  for (int r = 0; r < g.size(); ++r) {
    const GridCoord c = parallel::coord_of(r, g);
    const ShardPlan plan = ShardPlan::build(model, table, g, c, saving_split(model, info));
    int64_t bytes = 0;
    std::vector<ShardPiece> pieces = shard_file_pieces(plan, &bytes);
    if (!info.has_moments) {
      pieces.erase(std::remove_if(pieces.begin(), pieces.end(),
                                  [](const ShardPiece& p) { return p.array != 0; }),
                   pieces.end());
      bytes = pieces.empty() ? 0 : pieces.back().offset + pieces.back().numel * 4;
    }
    if (pieces.empty()) continue;
    TETRAD_CHECK(bytes == data_bytes[size_t(r)], "rank ", r, " wrote ", data_bytes[size_t(r)],
                 " bytes, expected ", bytes);
    nlohmann::json jp = nlohmann::json::array();
    for (const auto& p : pieces)
      jp.push_back({{"array", p.array}, {"tensor", p.tensor}, {"offset", p.offset},
                    {"numel", p.numel}, {"runs", runs_json(p.runs)}});
    nlohmann::json hashes = nlohmann::json::array();
    for (uint64_t h : chunk_hashes[size_t(r)]) hashes.push_back(hex64(h));
    files.push_back({{"name", shard_file_name(r)}, {"rank", r},
                     {"coord", {c.x(), c.y(), c.z(), c.d()}}, {"data_bytes", bytes},
                     {"chunk_xxh64", hashes}, {"pieces", jp}});
  }
  j["files"] = files;
  j["checksum"] = hex64(meta_checksum(j));
  return j;
}

void write_sharded_meta_files(const std::string& dir, const nlohmann::json& meta,
                              const ModelConfig& model, const std::string& tokenizer_path) {
  write_file_synced((fs::path(dir) / "config.json").string(), hf_config_json(model).dump(2) + "\n");
  if (!tokenizer_path.empty())  // under its own name, tokenizer_config.json and all
    data::copy_tokenizer_files(tokenizer_path, dir, [](const std::string& a, const std::string& b) {
      copy_file_synced(a, b);
    });
  write_file_synced(meta_path(dir), meta.dump() + "\n");
}

bool is_sharded_checkpoint(const std::string& dir) {
  std::error_code ec;
  return fs::exists(meta_path(dir), ec);
}

nlohmann::json read_sharded_meta(const std::string& dir) { return parse_meta(dir).json; }

std::optional<std::string> sharded_checkpoint_problem(const std::string& dir) {
  try {
    const ParsedMeta m = parse_meta(dir);
    build_index(m, dir);
    for (const SavedFile& f : m.files) ShardReader check(dir, f, m);
    model_of(m, dir);
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

void verify_sharded_checkpoint(const std::string& dir) {
  const ParsedMeta m = parse_meta(dir);
  build_index(m, dir);
  model_of(m, dir);
  std::vector<char> buf;
  for (const SavedFile& f : m.files) {
    ShardReader r(dir, f, m);
    const int64_t chunks = int64_t(f.chunk_hashes.size());
    for (int64_t c = 0; c < chunks; c += 16) r.read_chunks(c, std::min(chunks, c + 16), buf);
  }
}

ModelConfig sharded_model_config(const std::string& dir) {
  const ParsedMeta m = parse_meta(dir);
  return model_of(m, dir);
}

ShardedCheckpointInfo load_sharded_checkpoint(const std::string& dir, const ModelConfig& expected,
                                              uint64_t tokenizer_identity, const ShardPlan& plan,
                                              float* params, float* adam_m, float* adam_v) {
  const ParsedMeta m = parse_meta(dir);
  check_model(model_of(m, dir), expected, dir);
  ShardedCheckpointInfo info = info_of(m);
  if (tokenizer_identity && info.tokenizer_identity && tokenizer_identity != info.tokenizer_identity)
    fail("checkpoint ", dir, " was trained with tokenizer ", hex64(info.tokenizer_identity),
         " but this run's data uses tokenizer ", hex64(tokenizer_identity));
  if (m.tensors.size() != plan.tensors.size())
    fail("checkpoint ", dir, " has ", m.tensors.size(), " tensors, the model ", plan.tensors.size());
  for (size_t i = 0; i < m.tensors.size(); ++i)
    if (m.tensors[i].name != plan.tensors[i].spec->name || m.tensors[i].shape != plan.tensors[i].spec->shape)
      fail("checkpoint ", dir, ": tensor ", i, " is '", m.tensors[i].name, "', the model expects '",
           plan.tensors[i].spec->name, "' of the same shape");
  const SegIndex idx = build_index(m, dir);

  float* dst[kShardedArrays] = {params, adam_m, adam_v};
  if (!m.has_moments) {
    for (int a = 1; a < kShardedArrays; ++a)
      if (dst[a]) std::fill(dst[a], dst[a] + plan.local_total, 0.0f);
    dst[1] = dst[2] = nullptr;
  }
  // Copy operations: bytes of a file into a local buffer.
  struct Op {
    int64_t byte, nbytes;
    char* dest;
  };
  std::vector<std::vector<Op>> ops(m.files.size());
  for (int a = 0; a < kShardedArrays; ++a) {
    if (!dst[a]) continue;
    for (size_t i = 0; i < plan.tensors.size(); ++i) {
      const TensorShard& t = plan.tensors[i];
      const auto& saved = idx[size_t(a)][i];
      int64_t local = t.offset;
      for_each_segment(shard_index_runs(t, plan.grid, plan.coord), [&](int64_t start, int64_t len) {
        auto it = std::upper_bound(saved.begin(), saved.end(), start,
                                   [](int64_t v, const SavedSeg& s) { return v < s.start; });
        TETRAD_CHECK(it != saved.begin());
        --it;
        for (; it != saved.end() && it->start < start + len; ++it) {
          const int64_t lo = std::max(start, it->start);
          const int64_t hi = std::min(start + len, it->start + it->len);
          if (hi <= lo) continue;
          ops[size_t(it->file)].push_back(
              {it->byte + (lo - it->start) * 4, (hi - lo) * 4,
               reinterpret_cast<char*>(dst[a] + local + (lo - start))});
        }
        local += len;
      });
    }
  }
  // Per file: the chunks the operations touch, read in runs of consecutive chunks (at most 16
  // MiB a read), each chunk verified before anything is copied out of it.
  std::vector<char> buf;
  constexpr int64_t kMaxChunksPerRead = 16;
  for (size_t f = 0; f < m.files.size(); ++f) {
    auto& fo = ops[f];
    if (fo.empty()) continue;
    std::sort(fo.begin(), fo.end(), [](const Op& x, const Op& y) { return x.byte < y.byte; });
    ShardReader r(dir, m.files[f], m);
    size_t first = 0;
    while (first < fo.size()) {
      // The next window: from the first pending op's chunk, extended over consecutive chunks
      // that pending ops need.
      const int64_t c0 = fo[first].byte / kShardChunkBytes;
      int64_t c1 = (fo[first].byte + fo[first].nbytes - 1) / kShardChunkBytes + 1;
      for (size_t k = first + 1; k < fo.size() && c1 - c0 < kMaxChunksPerRead; ++k) {
        const int64_t kc0 = fo[k].byte / kShardChunkBytes;
        if (kc0 > c1) break;
        c1 = std::max(c1, (fo[k].byte + fo[k].nbytes - 1) / kShardChunkBytes + 1);
      }
      c1 = std::min(c1, c0 + std::max<int64_t>(kMaxChunksPerRead, 1));
      r.read_chunks(c0, c1, buf);
      const int64_t w0 = c0 * kShardChunkBytes, w1 = w0 + int64_t(buf.size());
      for (size_t k = first; k < fo.size() && fo[k].byte < w1; ++k) {
        const int64_t lo = std::max(fo[k].byte, w0), hi = std::min(fo[k].byte + fo[k].nbytes, w1);
        if (hi > lo) std::memcpy(fo[k].dest + (lo - fo[k].byte), buf.data() + (lo - w0), size_t(hi - lo));
      }
      while (first < fo.size() && fo[first].byte + fo[first].nbytes <= w1) ++first;
      if (first < fo.size() && fo[first].byte < w1) {
        // An op continues past the window: shift it to start at the window's end.
        const int64_t done = w1 - fo[first].byte;
        fo[first].byte += done;
        fo[first].nbytes -= done;
        fo[first].dest += done;
      }
    }
  }
  return info;
}

ShardedCheckpointInfo load_sharded_params(const std::string& dir, const ModelConfig& expected,
                                          const ParamTable& table, float* params) {
  const ShardPlan plan = ShardPlan::build(expected, table, GridShape{}, GridCoord{});
  for (size_t i = 0; i < plan.tensors.size(); ++i)
    TETRAD_CHECK(plan.tensors[i].offset == table.specs[i].offset);
  return load_sharded_checkpoint(dir, expected, 0, plan, params, nullptr, nullptr);
}

}  // namespace tetrad
