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

std::vector<Axis> AxisSet::axes() const {
  std::vector<Axis> out;
  for (Axis a : kAxesInRankOrder)
    if (contains(a)) out.push_back(a);
  return out;
}

std::string AxisSet::name() const {
  std::string s;
  for (Axis a : axes()) s += axis_name(a);
  return s;
}

int GridShape::size() const {
  int n = 1;
  for (Axis a : kAxesInRankOrder) n *= (*this)[a];
  return n;
}

int GridShape::size(AxisSet axes) const {
  int n = 1;
  for (Axis a : kAxesInRankOrder)
    if (axes.contains(a)) n *= (*this)[a];
  return n;
}

namespace {
// The extents in rank order joined by `sep`, the pipeline's left out when it is 1 (grids
// without a pipeline read "x,y,z,d").
std::string joined(const GridShape& shape, const char* sep) {
  std::string s;
  for (Axis a : kAxesInRankOrder) {
    if (a == Axis::P && shape.p() == 1) continue;
    s += (s.empty() ? "" : sep) + std::to_string(shape[a]);
  }
  return s;
}
}  // namespace

std::string GridShape::to_string() const { return joined(*this, "x"); }
std::string GridShape::to_arg() const { return joined(*this, ","); }

std::string to_string(const GridCoord& coord) {
  std::string s = "(";
  for (Axis a : kAxesInRankOrder) {
    if (a == Axis::P && coord.p() == 0) continue;  // grids without a pipeline read as before
    if (a != kAxesInRankOrder.front()) s += ",";
    s += axis_name(a);
    s += std::to_string(coord[a]);
  }
  return s + ")";
}

namespace {
void check_shape(const GridShape& shape) {
  for (Axis a : kAxesInRankOrder)
    TETRAD_CHECK(shape[a] >= 1, "grid ", shape.to_string(), " has a non-positive extent");
}
}  // namespace

GridCoord coord_of(int rank, const GridShape& shape) {
  check_shape(shape);
  TETRAD_CHECK(rank >= 0 && rank < shape.size(), "rank ", rank, " is outside grid ",
               shape.to_string());
  GridCoord c;
  int rest = rank;
  for (Axis a : kAxesInRankOrder) {
    c[a] = rest % shape[a];
    rest /= shape[a];
  }
  return c;
}

int rank_of(const GridCoord& coord, const GridShape& shape) {
  check_shape(shape);
  int rank = 0, stride = 1;
  for (Axis a : kAxesInRankOrder) {
    const int c = coord[a], n = shape[a];
    TETRAD_CHECK(c >= 0 && c < n, "coordinate ", to_string(coord), " is outside grid ",
                 shape.to_string());
    rank += c * stride;
    stride *= n;
  }
  return rank;
}

int position_in(const GridCoord& coord, const GridShape& shape, AxisSet axes) {
  int position = 0, stride = 1;
  for (Axis a : kAxesInRankOrder) {
    if (!axes.contains(a)) continue;
    TETRAD_CHECK(coord[a] >= 0 && coord[a] < shape[a], "coordinate ", to_string(coord),
                 " is outside grid ", shape.to_string());
    position += coord[a] * stride;
    stride *= shape[a];
  }
  return position;
}

std::vector<int> group_ranks(int rank, const GridShape& shape, AxisSet axes) {
  const GridCoord mine = coord_of(rank, shape);
  const std::vector<Axis> along = axes.axes();
  const int n = shape.size(axes);
  // Position i of the group: i's mixed-radix digits along `along` (fastest first), the other
  // coordinates mine. Strides grow in rank order, so positions and ranks increase together.
  std::vector<int> ranks;
  ranks.reserve(n);
  for (int i = 0; i < n; ++i) {
    GridCoord c = mine;
    int rest = i;
    for (Axis a : along) {
      c[a] = rest % shape[a];
      rest /= shape[a];
    }
    ranks.push_back(rank_of(c, shape));
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
      shape[*axis] = *v;
    }
  } else {
    if (parts.size() != 4 && parts.size() != 5)
      fail("grid \"", text, "\": ", expected, ", got ", parts.size(),
           parts.size() == 1 ? " number" : " numbers");
    const Axis four[] = {Axis::X, Axis::Y, Axis::Z, Axis::D};
    const Axis five[] = {Axis::X, Axis::Y, Axis::Z, Axis::P, Axis::D};
    for (size_t i = 0; i < parts.size(); ++i) {
      const Axis a = parts.size() == 5 ? five[i] : four[i];
      const std::optional<int> v = parse_extent(parts[i]);
      if (!v) fail("grid \"", text, "\": ", expected, ", got \"", parts[i], "\" for ", axis_name(a));
      shape[a] = *v;
    }
  }
  // The product must fit an int too (it is a rank count).
  long long product = 1;
  for (Axis a : kAxesInRankOrder)
    if (product <= INT_MAX) product *= shape[a];
  if (product > INT_MAX) fail("grid \"", text, "\": ", product, " ranks is too many");
  return shape;
}

void validate_grid(const GridShape& shape, int world_size) {
  for (Axis a : kAxesInRankOrder)
    if (shape[a] < 1)
      fail("grid ", shape.to_string(), ": the ", axis_name(a), " extent must be at least 1, got ",
           shape[a]);
  if (shape.size() != world_size)
    fail("grid ", shape.to_string(), " needs ", shape.size(), " ranks but mpirun started ",
         world_size, " (launch with mpirun -n ", shape.size(),
         " or choose a grid whose product is ", world_size, ")");
}

namespace {
// Fills the axes from position `i` of kAxesInRankOrder on with every split of `rest` (divisors
// in increasing order: lexicographic); the last of `axes` takes what is left, the others are 1.
void factor_axes(size_t i, int rest, AxisSet axes, GridShape& shape, std::vector<GridShape>& out) {
  if (i == kAxesInRankOrder.size()) {
    if (rest == 1) out.push_back(shape);
    return;
  }
  const Axis a = kAxesInRankOrder[i];
  if (!axes.contains(a)) {
    shape[a] = 1;
    factor_axes(i + 1, rest, axes, shape, out);
    return;
  }
  bool last = true;  // the last of `axes` takes what is left
  for (size_t j = i + 1; j < kAxesInRankOrder.size(); ++j) last = last && !axes.contains(kAxesInRankOrder[j]);
  for (int f = last ? rest : 1; f <= rest; ++f) {
    if (rest % f) continue;
    shape[a] = f;
    factor_axes(i + 1, rest / f, axes, shape, out);
  }
}
}  // namespace

std::vector<GridShape> factorizations(int n, AxisSet axes) {
  if (n < 1) fail("factorizations: the rank count must be at least 1, got ", n);
  std::vector<GridShape> out;
  GridShape shape;
  factor_axes(0, n, axes, shape, out);
  return out;
}

}  // namespace tetrad::parallel
