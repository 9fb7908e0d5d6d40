#include "tetrad/checkpoint/trainer_state.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "tetrad/checkpoint/atomic_file.hpp"
#include "tetrad/core/error.hpp"
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

// Reads the file, hashing as it goes. With keep_arrays=false the arrays are streamed through a
// small buffer and dropped.
TrainerState read_state(const std::string& path, bool keep_arrays) {
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

  std::vector<float>* dst[2] = {&s.adam_m, &s.adam_v};
  std::vector<float> scratch;
  for (int k = 0; k < 2; ++k) {
    if (keep_arrays) {
      dst[k]->resize(numel[k]);
      read(dst[k]->data(), numel[k] * 4, kArrayNames[k]);
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

void save_trainer_state(const std::string& path, int64_t step, const std::vector<uint64_t>& rng,
                        const nlohmann::json& info, const float* adam_m, const float* adam_v,
                        size_t numel) {
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
  put(adam_m, numel * 4);
  put(adam_v, numel * 4);
  const uint64_t sum = h.digest();
  out.write(&sum, 8);
  out.commit();
}

TrainerState load_trainer_state(const std::string& path, int64_t expected_numel) {
  TrainerState s = read_state(path, true);
  if (int64_t(s.adam_m.size()) != expected_numel)
    fail("trainer state '", path, "' holds Adam moments for ", s.adam_m.size(),
         " parameters, but this model has ", expected_numel,
         " (a checkpoint of a different model?)");
  return s;
}

TrainerState verify_trainer_state(const std::string& path) { return read_state(path, false); }

}  // namespace tetrad
