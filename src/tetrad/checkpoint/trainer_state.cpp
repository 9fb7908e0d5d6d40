#include "tetrad/checkpoint/trainer_state.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>

#include "tetrad/checkpoint/atomic_file.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/json.hpp"
#include "tetrad/core/hash.hpp"

namespace tetrad {
namespace {

constexpr char kMagic[8] = {'T', 'T', 'R', 'D', 'S', 'T', 'A', 'T'};
constexpr uint64_t kFixed = 8 + 4 + 8;          // magic, version, JSON length
constexpr uint64_t kMaxJson = 64u << 20;        // generous: the JSON is a few kilobytes
const char* const kArrayNames[2] = {"adam_m", "adam_v"};

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

// How read_state treats the arrays.
enum class Arrays { Drop, Keep, Sink };

struct SinkPlan {
  const std::vector<int64_t>* chunks = nullptr;
  const TensorSink* sinks[2] = {nullptr, nullptr};
};

uint64_t chunk_sum(const std::vector<int64_t>& chunks) {
  uint64_t total = 0;
  for (int64_t c : chunks) {
    TETRAD_CHECK(c >= 0, "negative chunk size ", c);
    total += uint64_t(c);
  }
  return total;
}

// Reads the file, hashing as it goes. Arrays::Drop streams the arrays through a small buffer
// and drops them; Arrays::Keep reads them into the state; Arrays::Sink reads them chunk by chunk
// (plan->chunks, which must sum to each array's length: checked before any sink is called) and
// hands each chunk to plan->sinks[array].
TrainerState read_state(const std::string& path, Arrays mode, const SinkPlan* plan = nullptr) {
  auto bad = [&](const auto&... what) {
    fail("trainer state '", path, "': ", what..., " (the file is damaged; resume from an "
         "earlier checkpoint)");
  };
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
  if (!f) fail("cannot open trainer state '", path, "': ", std::strerror(errno));
  if (std::fseek(f.get(), 0, SEEK_END) != 0) fail("cannot seek in '", path, "'");
  const long end = std::ftell(f.get());
  if (end < 0) fail("cannot tell the size of '", path, "'");
  std::rewind(f.get());
  const uint64_t size = uint64_t(end);

  Hasher64 h;
  auto read = [&](void* dst, size_t n, const char* what) {
    if (std::fread(dst, 1, n, f.get()) != n)
      bad("cannot read ", what, ": the file ends early (", size, " bytes)");
    h.update(dst, n);
  };

  if (size < kFixed + 8) bad("only ", size, " bytes long; truncated or not a trainer state");
  char magic[8];
  read(magic, 8, "the magic");
  if (std::memcmp(magic, kMagic, 8) != 0)
    fail("'", path, "' is not a tetrad trainer state file (it does not start with \"TTRDSTAT\")");
  uint32_t version;
  read(&version, 4, "the version");
  if (version != kTrainerStateVersion)
    fail("trainer state '", path, "' has format version ", version, "; this build reads version ",
         kTrainerStateVersion, (version > kTrainerStateVersion ? " (written by a newer tetrad)" : ""));
  uint64_t json_len;
  read(&json_len, 8, "the header length");
  if (json_len > kMaxJson || json_len > size - kFixed - 8)
    bad("header length ", json_len, " does not fit in the file (", size, " bytes)");
  std::string text(json_len, '\0');
  read(text.data(), json_len, "the JSON header");

  nlohmann::json j;
  check_json_depth(text, "'" + path + "' (its JSON header)");
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& ex) {
    bad("the JSON header does not parse (", ex.what(), ")");
  }
  TrainerState s;
  uint64_t numel[2] = {0, 0};
  try {
    s.step = j.at("step").get<int64_t>();
    s.rng_state = j.at("rng_state").get<std::vector<uint64_t>>();
    s.info = j.at("info");
    const auto& arrays = j.at("arrays");
    if (!arrays.is_array() || arrays.size() != 2) bad("'arrays' must list adam_m and adam_v");
    for (int k = 0; k < 2; ++k) {
      if (arrays[k].at("name") != kArrayNames[k] || arrays[k].at("dtype") != "F32")
        bad("array ", k, " must be ", kArrayNames[k], " (F32), found ", arrays[k].dump());
      numel[k] = arrays[k].at("numel").get<uint64_t>();
    }
  } catch (const nlohmann::json::exception& ex) {
    bad("the JSON header lacks a field or has a wrong type (", ex.what(), ")");
  }
  const uint64_t body = size - kFixed - json_len - 8;
  if (numel[0] > body / 4 || numel[1] > body / 4 || 4 * (numel[0] + numel[1]) != body)
    bad("the header describes arrays of ", numel[0], " + ", numel[1], " floats (",
        4 * (numel[0] + numel[1]), " bytes) but the file holds ", body,
        " bytes for them: truncated or corrupt");

  if (mode == Arrays::Sink) {
    const uint64_t want = chunk_sum(*plan->chunks);
    if (numel[0] != want || numel[1] != want)
      fail("trainer state '", path, "' holds Adam moments for ", numel[0],
           " parameters, but this model has ", want, " (a checkpoint of a different model?)");
  }
  std::vector<float>* dst[2] = {&s.adam_m, &s.adam_v};
  std::vector<float> scratch;
  if (mode == Arrays::Sink) {
    int64_t largest = 0;
    for (int64_t c : *plan->chunks) largest = std::max(largest, c);
    scratch.resize(size_t(largest));  // one chunk at a time
  }
  for (int k = 0; k < 2; ++k) {
    if (mode == Arrays::Keep) {
      dst[k]->resize(numel[k]);
      read(dst[k]->data(), numel[k] * 4, kArrayNames[k]);
    } else if (mode == Arrays::Sink) {
      for (size_t i = 0; i < plan->chunks->size(); ++i) {
        const size_t n = size_t((*plan->chunks)[i]);
        read(scratch.data(), n * 4, kArrayNames[k]);
        (*plan->sinks[k])(i, scratch.data());
      }
    } else {
      scratch.resize(1 << 18);
      for (uint64_t done = 0; done < numel[k];) {
        const uint64_t n = std::min<uint64_t>(scratch.size(), numel[k] - done);
        read(scratch.data(), n * 4, kArrayNames[k]);
        done += n;
      }
    }
  }
  const uint64_t computed = h.digest();
  uint64_t stored;
  if (std::fread(&stored, 1, 8, f.get()) != 8) bad("the checksum is missing");
  if (stored != computed)
    bad("checksum mismatch (stored ", hex64(stored), ", computed ", hex64(computed), ")");
  return s;
}

}  // namespace

void save_trainer_state(const std::string& path, const TrainerState& s) {
  TETRAD_CHECK(s.adam_m.size() == s.adam_v.size(), "adam_m has ", s.adam_m.size(),
               " floats, adam_v ", s.adam_v.size());
  save_trainer_state(path, s.step, s.rng_state, s.info, s.adam_m.data(), s.adam_v.data(),
                     s.adam_m.size());
}

namespace {

// The writer behind both save forms. chunk(k, i, buf) returns the data of chunk i of array k
// (k = 0 adam_m, 1 adam_v): a pointer into the caller's memory, or `buf` (room for the largest
// chunk) after filling it.
using ChunkFn = std::function<const float*(int k, size_t i, float* buf)>;

void write_state(const std::string& path, int64_t step, const std::vector<uint64_t>& rng,
                 const nlohmann::json& info, const std::vector<int64_t>& chunks,
                 size_t buf_numel, const ChunkFn& chunk) {
  const uint64_t numel = chunk_sum(chunks);
  nlohmann::json j = {
      {"step", step},
      {"rng_state", rng},
      {"info", info},
      {"arrays",
       {{{"name", "adam_m"}, {"dtype", "F32"}, {"numel", numel}},
        {{"name", "adam_v"}, {"dtype", "F32"}, {"numel", numel}}}}};
  std::string text;
  try {
    text = j.dump();
  } catch (const nlohmann::json::exception& ex) {
    fail("trainer state '", path, "': cannot encode the info as JSON (", ex.what(), ")");
  }
  AtomicFile out(path);
  Hasher64 h;
  auto put = [&](const void* p, size_t n) {
    out.write(p, n);
    h.update(p, n);
  };
  const uint32_t version = kTrainerStateVersion;
  const uint64_t len = text.size();
  put(kMagic, 8);
  put(&version, 4);
  put(&len, 8);
  put(text.data(), text.size());
  std::vector<float> buf(buf_numel);
  for (int k = 0; k < 2; ++k)
    for (size_t i = 0; i < chunks.size(); ++i) put(chunk(k, i, buf.data()), size_t(chunks[i]) * 4);
  const uint64_t sum = h.digest();
  out.write(&sum, 8);
  out.commit();
}

}  // namespace

void save_trainer_state(const std::string& path, int64_t step, const std::vector<uint64_t>& rng,
                        const nlohmann::json& info, const float* adam_m, const float* adam_v,
                        size_t numel) {
  const float* arrays[2] = {adam_m, adam_v};
  write_state(path, step, rng, info, {int64_t(numel)}, 0,
              [&](int k, size_t, float*) { return arrays[k]; });
}

void save_trainer_state_streamed(const std::string& path, int64_t step,
                                 const std::vector<uint64_t>& rng, const nlohmann::json& info,
                                 const std::vector<int64_t>& chunks, const TensorSource& adam_m,
                                 const TensorSource& adam_v) {
  TETRAD_CHECK(adam_m && adam_v, "save_trainer_state_streamed: missing source");
  int64_t largest = 0;
  for (int64_t c : chunks) largest = std::max(largest, c);
  const TensorSource* sources[2] = {&adam_m, &adam_v};
  write_state(path, step, rng, info, chunks, size_t(largest), [&](int k, size_t i, float* buf) {
    (*sources[k])(i, buf);
    return static_cast<const float*>(buf);
  });
}

TrainerState load_trainer_state(const std::string& path, int64_t expected_numel) {
  TrainerState s = read_state(path, Arrays::Keep);
  if (int64_t(s.adam_m.size()) != expected_numel)
    fail("trainer state '", path, "' holds Adam moments for ", s.adam_m.size(),
         " parameters, but this model has ", expected_numel,
         " (a checkpoint of a different model?)");
  return s;
}

TrainerState verify_trainer_state(const std::string& path) { return read_state(path, Arrays::Drop); }

TrainerState load_trainer_state_streamed(const std::string& path,
                                         const std::vector<int64_t>& chunk_numel,
                                         const TensorSink& adam_m, const TensorSink& adam_v,
                                         bool already_verified) {
  TETRAD_CHECK(adam_m && adam_v, "load_trainer_state_streamed: missing sink");
  if (!already_verified) read_state(path, Arrays::Drop);
  SinkPlan plan;
  plan.chunks = &chunk_numel;
  plan.sinks[0] = &adam_m;
  plan.sinks[1] = &adam_v;
  return read_state(path, Arrays::Sink, &plan);
}

}  // namespace tetrad
