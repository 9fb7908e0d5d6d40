#include "tetrad/parallel/grid.hpp"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <optional>

#include "tetrad/core/error.hpp"

namespace tetrad::parallel {

const char* axis_name(Axis axis) {
  switch (axis) {
    case Axis::X: return "x";
    case Axis::Y: return "y";
    case Axis::Z: return "z";
    case Axis::P: return "p";
    case Axis::D: return "d";
  }
  TETRAD_CHECK(false, "unknown axis ", static_cast<int>(axis));
  return "";
}

int GridShape::size() const { return x * y * z * p * d; }

std::string GridShape::to_string() const {
  if (p == 1) return detail::concat(x, "x", y, "x", z, "x", d);
  return detail::concat(x, "x", y, "x", z, "x", p, "x", d);
}

int& extent(GridShape& shape, Axis axis) {
  switch (axis) {
    case Axis::X: return shape.x;
    case Axis::Y: return shape.y;
    case Axis::Z: return shape.z;
    case Axis::P: return shape.p;
    case Axis::D: return shape.d;
  }
  TETRAD_CHECK(false, "unknown axis ", static_cast<int>(axis));
  return shape.x;
}

int extent(const GridShape& shape, Axis axis) { return extent(const_cast<GridShape&>(shape), axis); }

int& coordinate(GridCoord& coord, Axis axis) {
  switch (axis) {
    case Axis::X: return coord.x;
    case Axis::Y: return coord.y;
    case Axis::Z: return coord.z;
    case Axis::P: return coord.p;
    case Axis::D: return coord.d;
  }
  TETRAD_CHECK(false, "unknown axis ", static_cast<int>(axis));
  return coord.x;
}

int coordinate(const GridCoord& coord, Axis axis) {
  return coordinate(const_cast<GridCoord&>(coord), axis);
}

std::string to_string(const GridCoord& coord) {
  std::string s = "(";
  for (Axis a : kAxesInRankOrder) {
    if (a == Axis::P && coord.p == 0) continue;  // grids without a pipeline read as before
    if (a != kAxesInRankOrder.front()) s += ",";
    s += axis_name(a);
    s += std::to_string(coordinate(coord, a));
  }
  return s + ")";
}

namespace {
void check_shape(const GridShape& shape) {
  for (Axis a : kAxesInRankOrder)
    TETRAD_CHECK(extent(shape, a) >= 1, "grid ", shape.to_string(), " has a non-positive extent");
}
}  // namespace

GridCoord coord_of(int rank, const GridShape& shape) {
  check_shape(shape);
  TETRAD_CHECK(rank >= 0 && rank < shape.size(), "rank ", rank, " is outside grid ",
               shape.to_string());
  GridCoord c;
  int rest = rank;
  for (Axis a : kAxesInRankOrder) {
    coordinate(c, a) = rest % extent(shape, a);
    rest /= extent(shape, a);
  }
  return c;
}

int rank_of(const GridCoord& coord, const GridShape& shape) {
  check_shape(shape);
  int rank = 0, stride = 1;
  for (Axis a : kAxesInRankOrder) {
    const int c = coordinate(coord, a), n = extent(shape, a);
    TETRAD_CHECK(c >= 0 && c < n, "coordinate ", to_string(coord), " is outside grid ",
                 shape.to_string());
    rank += c * stride;
    stride *= n;
  }
  return rank;
}

std::vector<int> group_ranks(int rank, const GridShape& shape, Axis axis) {
  GridCoord c = coord_of(rank, shape);
  std::vector<int> ranks;
  ranks.reserve(extent(shape, axis));
  for (int i = 0; i < extent(shape, axis); ++i) {
    coordinate(c, axis) = i;
    ranks.push_back(rank_of(c, shape));
  }
  return ranks;
}

std::vector<int> group_ranks(int rank, const GridShape& shape, std::span<const Axis> axes) {
  const GridCoord mine = coord_of(rank, shape);
  // Walk every rank and keep those that agree with `mine` outside `axes`: increasing rank order.
  std::vector<int> ranks;
  for (int r = 0; r < shape.size(); ++r) {
    const GridCoord c = coord_of(r, shape);
    bool same = true;
    for (Axis a : kAxesInRankOrder) {
      bool in_group = false;
      for (Axis g : axes) in_group = in_group || g == a;
      if (!in_group && coordinate(c, a) != coordinate(mine, a)) same = false;
    }
    if (same) ranks.push_back(r);
  }
  return ranks;
}

namespace {
std::string trimmed(std::string s) {
  while (!s.empty() && s.front() == ' ') s.erase(s.begin());
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

// One extent: a positive integer that fits an int, or nullopt.
std::optional<int> parse_extent(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (*end != '\0' || errno == ERANGE || v < 1 || v > INT_MAX) return std::nullopt;
  return static_cast<int>(v);
}

std::string axis_list() {
  std::string s;
  for (Axis a : kAxesInRankOrder) s += std::string(s.empty() ? "" : ", ") + axis_name(a);
  return s;
}
}  // namespace

GridShape parse_grid(const std::string& text) {
  const char* expected =
      "expected four positive integers \"x,y,z,d\" (e.g. \"2,1,2,1\") or five \"x,y,z,p,d\", or "
      "named extents \"d=2,x=2\"";
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    parts.push_back(trimmed(text.substr(
        start, comma == std::string::npos ? std::string::npos : comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  GridShape shape;
  const bool named = text.find('=') != std::string::npos;
  if (named) {
    // "d=2,x=2": every part names one axis; axes not named are 1.
    std::vector<Axis> seen;
    for (const std::string& part : parts) {
      const size_t eq = part.find('=');
      if (eq == std::string::npos)
        fail("grid \"", text, "\": \"", part, "\" names no axis; ", expected);
      const std::string name = trimmed(part.substr(0, eq)), value = trimmed(part.substr(eq + 1));
      std::optional<Axis> axis;
      for (Axis a : kAxesInRankOrder)
        if (name == axis_name(a)) axis = a;
      if (!axis)
        fail("grid \"", text, "\": unknown axis \"", name, "\" (the axes are ", axis_list(), ")");
      if (std::find(seen.begin(), seen.end(), *axis) != seen.end())
        fail("grid \"", text, "\": axis ", name, " is named twice");
      seen.push_back(*axis);
      const std::optional<int> v = parse_extent(value);
      if (!v) fail("grid \"", text, "\": ", expected, ", got \"", value, "\" for ", name);
      extent(shape, *axis) = *v;
    }
  } else {
    if (parts.size() != 4 && parts.size() != 5)
      fail("grid \"", text, "\": ", expected, ", got ", parts.size(),
           parts.size() == 1 ? " number" : " numbers");
    const Axis four[] = {Axis::X, Axis::Y, Axis::Z, Axis::D};
    for (size_t i = 0; i < parts.size(); ++i) {
      const Axis a = parts.size() == 5 ? kAxesInRankOrder[i] : four[i];
      const std::optional<int> v = parse_extent(parts[i]);
      if (!v) fail("grid \"", text, "\": ", expected, ", got \"", parts[i], "\" for ", axis_name(a));
      extent(shape, a) = *v;
    }
  }
  // The product must fit an int too (it is a rank count).
  long long product = 1;
  for (Axis a : kAxesInRankOrder)
    if (product <= INT_MAX) product *= extent(shape, a);
  if (product > INT_MAX) fail("grid \"", text, "\": ", product, " ranks is too many");
  return shape;
}

void validate_grid(const GridShape& shape, int world_size) {
  for (Axis a : kAxesInRankOrder)
    if (extent(shape, a) < 1)
      fail("grid ", shape.to_string(), ": the ", axis_name(a), " extent must be at least 1, got ",
           extent(shape, a));
  if (shape.size() != world_size)
    fail("grid ", shape.to_string(), " needs ", shape.size(), " ranks but mpirun started ",
         world_size, " (launch with mpirun -n ", shape.size(),
         " or choose a grid whose product is ", world_size, ")");
}

namespace {
// Fills the axes from position `i` of kAxesInRankOrder on with every split of `rest`; the last
// axis takes what is left.
void factor_axes(size_t i, int rest, GridShape& shape, std::vector<GridShape>& out) {
  const Axis a = kAxesInRankOrder[i];
  if (a == Axis::P) {  // pipeline grids are not enumerated: p = 1
    extent(shape, a) = 1;
    factor_axes(i + 1, rest, shape, out);
    return;
  }
  if (i + 1 == kAxesInRankOrder.size()) {
    extent(shape, a) = rest;
    out.push_back(shape);
    return;
  }
  for (int f = 1; f <= rest; ++f) {
    if (rest % f) continue;
    extent(shape, a) = f;
    factor_axes(i + 1, rest / f, shape, out);
  }
}
}  // namespace

std::vector<GridShape> factorizations(int n) {
  if (n < 1) fail("factorizations: the rank count must be at least 1, got ", n);
  std::vector<GridShape> out;
  GridShape shape;
  factor_axes(0, n, shape, out);
  return out;
}

}  // namespace tetrad::parallel
