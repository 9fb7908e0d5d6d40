// The process grid (docs/parallel.md, shared/design/4d-parallelism.md): pure functions of
// (rank, shape), no MPI, so every layout question can be tested without launching a job.
//
// A job of G = Gx*Gy*Gz*Gc*Gp*Gd ranks is a grid with one extent per axis. Rank order is
// mixed-radix over the axes in enum order, x fastest:
//     x = r % Gx,  y = (r / Gx) % Gy,  z = (r / (Gx*Gy)) % Gz,  c = (r / (Gx*Gy*Gz)) % Gc,
//     p = (r / (Gx*Gy*Gz*Gc)) % Gp,  d = r / (Gx*Gy*Gz*Gc*Gp)
// so X groups (the chattiest) are neighbouring ranks, a pipeline stage's tensor-parallel and
// context-parallel groups are contiguous, and the data axis is outermost.
//
// Axes are data: GridShape and GridCoord hold one number per Axis, every function here loops
// over kAxesInRankOrder, and groups of several axes are an AxisSet. Adding an axis is an enum
// entry (and its name in axis_name) plus the code that uses it; parse_grid's named form
// ("d=2,x=2") takes it at once, and the positional forms ("x,y,z,d", "x,y,z,p,d") are axis lists
// (grid.cpp, kPositionalForms) read by the same parser.
//
// What this does not do: choose a grid (the planner does, from factorizations()), or talk MPI
// (parallel/process_groups.hpp builds the communicators from these functions).
//
// Failures: bad user input (parse_grid, validate_grid, factorizations(n <= 0)) throws
// tetrad::Error with what was expected; an out-of-range rank or coordinate passed by library code is
// a bug and fails TETRAD_CHECK.
#pragma once
#include <array>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace tetrad::parallel {

// The axes of the grid, in rank order (fastest-varying first). X: input features of normal
// layers, Y: output features, Z: tokens and the fully-sharded weight axis, C: context
// parallelism (each sequence cut into 2 Gc chunks, rank c holding chunks c and 2 Gc - 1 - c;
// parallel/context_split.hpp), P: pipeline stages, D: data-parallel replicas.
enum class Axis { X, Y, Z, C, P, D };
inline constexpr int kAxisCount = 6;

// The axes from fastest- to slowest-varying in rank order (the enum's order).
inline constexpr std::array<Axis, kAxisCount> kAxesInRankOrder = {Axis::X, Axis::Y, Axis::Z,
                                                                   Axis::C, Axis::P, Axis::D};

// "x", "y", "z", "c", "p", "d": the name used for the axis's communicator, in messages and in
// parse_grid's named form.
const char* axis_name(Axis axis);

// A set of axes: the axes of a process group, the axes that split a micro-batch's tokens.
class AxisSet {
 public:
  constexpr AxisSet() = default;
  constexpr AxisSet(Axis axis) : bits_(bit(axis)) {}  // NOLINT: one axis is a set of one
  constexpr AxisSet(std::initializer_list<Axis> axes) {
    for (Axis a : axes) bits_ |= bit(a);
  }
  constexpr bool contains(Axis axis) const { return (bits_ & bit(axis)) != 0; }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr AxisSet operator|(AxisSet other) const { return from_bits(bits_ | other.bits_); }
  constexpr unsigned bits() const { return bits_; }
  constexpr bool operator==(const AxisSet&) const = default;
  // The axes in rank order.
  std::vector<Axis> axes() const;
  // The axes' names in rank order: "z", "zd" (the communicator's name).
  std::string name() const;

 private:
  static constexpr unsigned bit(Axis axis) { return 1u << static_cast<unsigned>(axis); }
  static constexpr AxisSet from_bits(unsigned bits) {
    AxisSet s;
    s.bits_ = bits;
    return s;
  }
  unsigned bits_ = 0;
};

// The axes whose ranks each take a share of a micro-batch's sequences: Z and D. A micro-batch
// of B sequences gives each rank B / token_slots(shape) of them, its share being slot
// token_slot(coord, shape).
inline constexpr AxisSet token_axes() { return {Axis::Z, Axis::D}; }
// The axes whose ranks hold different tokens of a micro-batch: the sequence-dealing axes and C,
// which cuts each sequence into chunks. Loss sums, token counts and the gradients of replicated
// parameters (norm weights, biases) are summed over their group (ProcessGroups::tokens());
// without C (Gc = 1) its ranks are token_axes()'s.
inline constexpr AxisSet token_share_axes() { return {Axis::Z, Axis::C, Axis::D}; }
// The axes over which every parameter is replicated and its gradient summed after the Z
// reduce-scatter: D and C (ProcessGroups::replicas()). ZeRO deals its pieces over them (as
// TorchTitan's FSDP shards over data x context).
inline constexpr AxisSet replica_axes() { return {Axis::C, Axis::D}; }

// One number per axis, indexed by Axis: a grid's extents (GridShape) or a rank's coordinates
// (GridCoord). x() ... d() read one axis by name; [] reads or writes any.
template <int kUnset>
class PerAxis {
 public:
  constexpr PerAxis() { values_.fill(kUnset); }
  constexpr int operator[](Axis a) const { return values_[static_cast<size_t>(a)]; }
  constexpr int& operator[](Axis a) { return values_[static_cast<size_t>(a)]; }
  constexpr int x() const { return (*this)[Axis::X]; }
  constexpr int y() const { return (*this)[Axis::Y]; }
  constexpr int z() const { return (*this)[Axis::Z]; }
  constexpr int c() const { return (*this)[Axis::C]; }
  constexpr int p() const { return (*this)[Axis::P]; }
  constexpr int d() const { return (*this)[Axis::D]; }
  constexpr bool operator==(const PerAxis&) const = default;

 protected:
  // "x,y,z,d" in that order (the CLI's four-number form), every other axis unset.
  constexpr PerAxis(int x, int y, int z, int d) : PerAxis() {
    (*this)[Axis::X] = x, (*this)[Axis::Y] = y, (*this)[Axis::Z] = z, (*this)[Axis::D] = d;
  }
  // Named values, the others unset: {{Axis::P, 2}, {Axis::D, 4}}.
  constexpr PerAxis(std::initializer_list<std::pair<Axis, int>> named) : PerAxis() {
    for (const auto& [a, v] : named) (*this)[a] = v;
  }

 private:
  std::array<int, kAxisCount> values_{};
};

// The extents of a grid; axes not given are 1.
struct GridShape : PerAxis<1> {
  constexpr GridShape() = default;
  // The CLI's "x,y,z,d" (p = 1): GridShape{2, 1, 2, 1}.
  constexpr GridShape(int x, int y, int z, int d) : PerAxis(x, y, z, d) {}
  // By name, in any order: GridShape{{Axis::P, 2}, {Axis::D, 2}}.
  constexpr GridShape(std::initializer_list<std::pair<Axis, int>> named) : PerAxis(named) {}
  // The CLI's "x,y,z,p,d".
  static constexpr GridShape xyzpd(int x, int y, int z, int p, int d) {
    return {{Axis::X, x}, {Axis::Y, y}, {Axis::Z, z}, {Axis::P, p}, {Axis::D, d}};
  }
  int size() const;               // the product of every extent
  int size(AxisSet axes) const;   // the product of the extents of `axes` (a group's size)
  // "2x2x1x1" (x,y,z,d) when p = c = 1, "2x1x1x2x1" (x,y,z,p,d) when c = 1, else the axes other
  // than 1 by name, "x2.c2.d2" (c has no positional form).
  std::string to_string() const;
  // What parse_grid reads: "2,2,1,1", five numbers when p > 1, else named: "x=2,c=2,d=2"
  // (with E > 1 always named: "d=2,e=2").
  std::string to_arg() const;
  // E, the expert-parallel extent of a mixture-of-experts model: its experts split over E ranks
  // folded over the replica axes (C x D, Megatron's "parallel folding"), so it adds no ranks
  // (size() does not count it and it is no Axis of the rank order); E must divide Gc x Gd and
  // the number of experts. 1: every rank holds every expert. Given by name only: "d=2,e=2".
  constexpr int e() const { return e_; }
  constexpr GridShape& set_e(int e) {
    e_ = e;
    return *this;
  }
  constexpr bool operator==(const GridShape&) const = default;

 private:
  int e_ = 1;
};

// A rank's place in a grid; axes not given are 0.
struct GridCoord : PerAxis<0> {
  constexpr GridCoord() = default;
  constexpr GridCoord(int x, int y, int z, int d) : PerAxis(x, y, z, d) {}
  constexpr GridCoord(std::initializer_list<std::pair<Axis, int>> named) : PerAxis(named) {}
  static constexpr GridCoord xyzpd(int x, int y, int z, int p, int d) {
    return {{Axis::X, x}, {Axis::Y, y}, {Axis::Z, z}, {Axis::P, p}, {Axis::D, d}};
  }
  constexpr bool operator==(const GridCoord&) const = default;
};

// "(x1,y0,z1,d0)"; with a pipeline stage other than 0, "(x1,y0,z1,p2,d0)"; with a context
// coordinate other than 0, every axis: "(x1,y0,z1,c1,p0,d0)".
std::string to_string(const GridCoord& coord);

// Coordinates of `rank` (0 <= rank < shape.size()); inverse of rank_of.
GridCoord coord_of(int rank, const GridShape& shape);
// Rank of `coord` (every coordinate within its extent); inverse of coord_of.
int rank_of(const GridCoord& coord, const GridShape& shape);

// The position of `coord` in its group over `axes`: the mixed-radix index of its coordinates
// along those axes in rank order (z + Gz*d for {Z, D}; the coordinate itself for one axis),
// 0 <= position < shape.size(axes).
int position_in(const GridCoord& coord, const GridShape& shape, AxisSet axes);

// The ranks that differ from `rank` only in the given axes (e.g. Axis::Y, or token_axes()), in
// increasing rank order, which is the order of position_in (so `rank` itself is at
// position_in(coord_of(rank), shape, axes)).
std::vector<int> group_ranks(int rank, const GridShape& shape, AxisSet axes);

// The expert-parallel fold (GridShape::e()): a rank's place among the replica ranks (its C and D
// coordinates, position_in over replica_axes()) modulo E is its expert rank (which n_experts / E
// experts it holds: the E consecutive replica ranks of one expert group hold every expert), and
// divided by E its expert-data rank (its place among the ranks holding the same experts).
inline int expert_rank(const GridCoord& coord, const GridShape& shape) {
  return position_in(coord, shape, replica_axes()) % shape.e();
}
inline int expert_data_rank(const GridCoord& coord, const GridShape& shape) {
  return position_in(coord, shape, replica_axes()) / shape.e();
}

// The token split: the micro-batch's sequences are dealt over token_axes().
inline int token_slots(const GridShape& shape) { return shape.size(token_axes()); }
inline int token_slot(const GridCoord& coord, const GridShape& shape) {
  return position_in(coord, shape, token_axes());
}

// Parses "x,y,z,d" (e.g. "2,1,2,1"; p = 1), "x,y,z,p,d", or named extents "d=2,x=2" ("c=2" and the
// expert fold "e=2" only this way; axes not named are 1; an unknown or repeated axis is an error
// naming it); spaces allowed.
GridShape parse_grid(const std::string& text);

// Throws tetrad::Error unless every extent is >= 1, shape.size() == world_size, e.g.
// "grid 2x2x1x1 needs 4 ranks but mpirun started 2 (...)", and E divides Gc x Gd.
void validate_grid(const GridShape& shape, int world_size);

// Every shape with size() == n (n >= 1) whose axes outside `axes` are 1, ordered
// lexicographically by the extents in rank order. The default leaves out the pipeline axis
// (x, y, z, d: the number of ordered 4-tuples with product n, 20 for n = 8); the planner
// enumerates every axis.
std::vector<GridShape> factorizations(int n,
                                      AxisSet axes = {Axis::X, Axis::Y, Axis::Z, Axis::D});

}  // namespace tetrad::parallel
