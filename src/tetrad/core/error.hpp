// Two error channels (docs/style):
//  * tetrad::Error — something went wrong in the world (a file, a config value, a peer, a
//    checkpoint). Thrown; the CLI catches it at the top and prints the message. Messages name
//    what was wrong and what was expected.
//  * TETRAD_CHECK — a broken invariant inside the library (a bug). Prints file:line and aborts.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>

namespace tetrad {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void check_failed(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace detail

// Throws tetrad::Error with the concatenation of the arguments.
template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(detail::concat(args...));
}

}  // namespace tetrad

#define TETRAD_CHECK(cond, ...)                                                             \
  do {                                                                                      \
    if (!(cond)) ::tetrad::detail::check_failed(__FILE__, __LINE__, #cond,                  \
                                                ::tetrad::detail::concat("", ##__VA_ARGS__)); \
  } while (0)
