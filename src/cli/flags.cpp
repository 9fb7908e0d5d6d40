// Flag checks shared by the commands (cli/command.hpp).
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "cli/command.hpp"

namespace tetrad::cli {

namespace {
std::string number_text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}
}  // namespace

CLI::Validator finite_at_least(double lo, const std::string& what) {
  return CLI::Validator(
      [lo, what](std::string& in) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(in.c_str(), &end);
        if (end == in.c_str() || *end != '\0' || !std::isfinite(v) || !(v >= lo))
          return what + " must be a finite number >= " + number_text(lo) + ", got '" + in + "'";
        return std::string();
      },
      ">= " + number_text(lo));
}

CLI::Validator int_in(long long lo, long long hi, const std::string& what) {
  return CLI::Validator(
      [lo, hi, what](std::string& in) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(in.c_str(), &end, 10);
        if (end == in.c_str() || *end != '\0' || errno == ERANGE || v < lo || v > hi)
          return what + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                 "], got '" + in + "'";
        return std::string();
      },
      "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

CLI::Validator probability_mass(const std::string& what) {
  return CLI::Validator(
      [what](std::string& in) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(in.c_str(), &end);
        if (end == in.c_str() || *end != '\0' || !(v > 0 && v <= 1))
          return what + " must be a number in (0, 1], got '" + in + "'";
        return std::string();
      },
      "(0, 1]");
}

}  // namespace tetrad::cli
