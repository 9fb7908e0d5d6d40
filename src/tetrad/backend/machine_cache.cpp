#include "tetrad/backend/machine_cache.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <oneapi/dnnl/dnnl.h>
#include <sstream>

#include "tetrad/core/cpu.hpp"

namespace tetrad::backend {

namespace {
const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

// Closes the lock file (releasing the flock) on every path out.
struct LockFile {
  int fd = -1;
  ~LockFile() {
    if (fd >= 0) ::close(fd);
  }
};
}  // namespace

std::string machine_cache_path(std::string* why) {
  std::string dir;
  if (const char* d = env("TETRAD_CACHE_DIR")) {
    if (std::string(d) == "off") {
      if (why) *why = "TETRAD_CACHE_DIR=off";
      return "";
    }
    dir = d;
  } else if (const char* x = env("XDG_CACHE_HOME")) {
    dir = std::string(x) + "/tetrad";
  } else if (const char* h = env("HOME")) {
    dir = std::string(h) + "/.cache/tetrad";
  } else {
    if (why) *why = "neither TETRAD_CACHE_DIR, XDG_CACHE_HOME nor HOME is set";
    return "";
  }
  return dir + "/machine.json";
}

std::string machine_key(int threads) {
  const dnnl_version_t* v = dnnl_version();
  std::ostringstream os;
  os << cpu_features().summary() << "; oneDNN " << v->major << "." << v->minor << "." << v->patch
     << "; " << threads << " thread(s)";
  return os.str();
}

nlohmann::json machine_cache_update(const std::string& path, const std::string& entry,
                                    const std::function<nlohmann::json(const nlohmann::json&)>& update,
                                    std::string* note) {
  if (path.empty()) return update(nullptr);
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  LockFile lock;
  lock.fd = ::open((path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock.fd < 0 || ::flock(lock.fd, LOCK_EX) != 0) {
    if (note) *note = "cache " + path + " not used: cannot lock it (" + std::strerror(errno) + ")";
    return update(nullptr);
  }
  nlohmann::json all = nlohmann::json::object();
  if (std::ifstream in(path); in) {
    try {
      in >> all;
      if (!all.is_object()) all = nlohmann::json::object();
    } catch (const nlohmann::json::exception&) {
      all = nlohmann::json::object();  // unreadable: rewritten below
    }
  }
  const nlohmann::json cached = all.contains(entry) ? all[entry] : nlohmann::json();
  nlohmann::json fresh = update(cached);
  if (fresh.is_null()) return cached;
  all[entry] = fresh;
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << all.dump(1) << "\n";
    if (!out) {
      if (note) *note = "cache " + path + " not written (" + std::strerror(errno) + ")";
      fs::remove(tmp, ec);
      return fresh;
    }
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    if (note) *note = "cache " + path + " not written (" + ec.message() + ")";
    fs::remove(tmp, ec);
  }
  return fresh;
}

}  // namespace tetrad::backend
