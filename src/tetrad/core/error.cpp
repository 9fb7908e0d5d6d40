#include "tetrad/core/error.hpp"

namespace tetrad::detail {
void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  std::fprintf(stderr, "tetrad: internal invariant failed at %s:%d: %s %s\n", file, line, cond,
               msg.c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace tetrad::detail
