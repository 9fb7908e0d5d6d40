#include "tetrad/parallel/grid.hpp"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <optional>
#include <span>

#include "tetrad/core/error.hpp"

namespace tetrad::parallel {

const char* axis_name(Axis axis) {
  switch (axis) {
    case Axis::X: return "x";
    case Axis::Y: return "y";
    case Axis::Z: return "z";
    case Axis::C: return "c";
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
// The positional forms of a grid, as parse_grid reads them and to_arg, to_string write them: the
// axes their numbers give, in order; an axis a form leaves out is 1 (its coordinate 0). "x,y,z,d"
// is the form of grids without a pipeline, "x,y,z,p,d" of grids with one. The context axis C has
// none (a sixth number would be ambiguous to read): a grid with Gc > 1 is written by name.
constexpr Axis kFourAxes[] = {Axis::X, Axis::Y, Axis::Z, Axis::D};
constexpr Axis kFiveAxes[] = {Axis::X, Axis::Y, Axis::Z, Axis::P, Axis::D};
constexpr std::span<const Axis> kPositionalForms[] = {kFourAxes, kFiveAxes};
static_assert(kAxisCount == 6 && std::ranges::equal(kFiveAxes, std::array{Axis::X, Axis::Y, Axis::Z,
                                                                        Axis::P, Axis::D}),
              "a new axis: say which positional forms give it (the named form takes it already)");

// The shortest positional form that holds every axis of `v` not at its unset value; empty when
// none does (an axis outside every positional form is set).
template <int kUnset>
std::span<const Axis> shortest_form(const PerAxis<kUnset>& v) {
  for (std::span<const Axis> form : kPositionalForms) {
    bool holds = true;
    for (Axis a : kAxesInRankOrder)
      holds = holds && (v[a] == kUnset || std::ranges::find(form, a) != form.end());
    if (holds) return form;
  }
  return {};
}

// The extents in their shortest positional form joined by `sep`, or, where no positional form
// holds them, the axes other than 1 as name, `named_sep`, extent, joined by `named_join`.
std::string joined(const GridShape& shape, const char* sep, const char* named_sep,
                   const char* named_join) {
  std::string s;
  // The expert fold has no positional form either.
  const std::span<const Axis> form =
      shape.e() > 1 ? std::span<const Axis>{} : shortest_form(shape);
  if (form.empty()) {
    for (Axis a : kAxesInRankOrder)
      if (shape[a] != 1)
        s += (s.empty() ? "" : named_join) + std::string(axis_name(a)) + named_sep +
             std::to_string(shape[a]);
    if (shape.e() != 1) s += (s.empty() ? "" : named_join) + std::string("e") + named_sep +
                             std::to_string(shape.e());
    return s;
  }
  for (Axis a : form) s += (s.empty() ? "" : sep) + std::to_string(shape[a]);
  return s;
}
}  // namespace

std::string GridShape::to_string() const { return joined(*this, "x", "", "."); }
std::string GridShape::to_arg() const { return joined(*this, ",", "=", ","); }

std::string to_string(const GridCoord& coord) {
  std::span<const Axis> form = shortest_form(coord);
  if (form.empty()) form = kAxesInRankOrder;
  std::string s;
  for (Axis a : form)
    s.append(s.empty() ? "(" : ",").append(axis_name(a)).append(std::to_string(coord[a]));
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
      "named extents \"d=2,x=2\" (the context axis and the expert fold only by name: \"c=2\", "
      "\"d=2,e=2\")";
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    parts.push_back(trimmed(text.substr(
        start, comma == std::string::npos ? std::string::npos : comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  // Every part gives one axis its extent, by name or by position; axes not given are 1.
  GridShape shape;
  AxisSet given;
  bool e_given = false;
  auto assign = [&](Axis axis, const std::string& value) {
    if (given.contains(axis)) fail("grid \"", text, "\": axis ", axis_name(axis), " is named twice");
    given = given | axis;
    const std::optional<int> v = parse_extent(value);
    if (!v) fail("grid \"", text, "\": ", expected, ", got \"", value, "\" for ", axis_name(axis));
    shape[axis] = *v;
  };
  if (text.find('=') != std::string::npos) {
    // "d=2,x=2"
    for (const std::string& part : parts) {
      const size_t eq = part.find('=');
      if (eq == std::string::npos)
        fail("grid \"", text, "\": \"", part, "\" names no axis; ", expected);
      const std::string name = trimmed(part.substr(0, eq)), value = trimmed(part.substr(eq + 1));
      if (name == "e") {  // the expert fold: no axis of the rank order (GridShape::e())
        if (e_given) fail("grid \"", text, "\": e is named twice");
        e_given = true;
        const std::optional<int> v = parse_extent(value);
        if (!v) fail("grid \"", text, "\": ", expected, ", got \"", value, "\" for e");
        shape.set_e(*v);
        continue;
      }
      std::optional<Axis> axis;
      for (Axis a : kAxesInRankOrder)
        if (name == axis_name(a)) axis = a;
      if (!axis)
        fail("grid \"", text, "\": unknown axis \"", name, "\" (the axes are ", axis_list(),
             ", and e, the expert fold over c and d)");
      assign(*axis, value);
    }
  } else {
    // "2,1,2,1": the positional form with as many axes as there are numbers.
    const std::span<const Axis>* form = std::ranges::find_if(
        kPositionalForms, [&](std::span<const Axis> f) { return f.size() == parts.size(); });
    if (form == std::ranges::end(kPositionalForms))
      fail("grid \"", text, "\": ", expected, ", got ", parts.size(),
           parts.size() == 1 ? " number" : " numbers");
    for (size_t i = 0; i < parts.size(); ++i) assign((*form)[i], parts[i]);
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
  const int replicas = shape.size(replica_axes());
  if (shape.e() < 1 || replicas % shape.e() != 0)
    fail("grid ", shape.to_string(), ": the expert-parallel extent E = ", shape.e(),
         " must divide the data x context ranks Gd x Gc = ", shape.d(), " x ", shape.c(), " = ",
         replicas, " (E folds over them and adds no ranks; e.g. d=", shape.e(), ",e=", shape.e(),
         ")");
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
