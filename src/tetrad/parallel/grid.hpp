// The process grid (docs/parallel.md, shared/design/4d-parallelism.md): pure functions of
// (rank, shape), no MPI, so every layout question can be tested without launching a job.
//
// A job of G = Gx*Gy*Gz*Gp*Gd ranks is a 5D grid. Rank order is mixed-radix with x fastest:
//     x = r % Gx,  y = (r / Gx) % Gy,  z = (r / (Gx*Gy)) % Gz,  p = (r / (Gx*Gy*Gz)) % Gp,
//     d = r / (Gx*Gy*Gz*Gp)
// so X groups (the chattiest) are neighbouring ranks, a pipeline stage's tensor-parallel group
// is contiguous, and the data axis is outermost.
//
// Every axis-dependent function goes through kAxesInRankOrder / extent() / coordinate(). The
// pipeline axis P sits between Z and D in rank order; in GridShape and GridCoord its field comes
// last, so the four-number brace forms ({x, y, z, d}) keep their meaning with p = 1.
//
// What this does not do: choose a grid (the planner does, from factorizations()), or talk MPI
// (parallel/process_groups.hpp builds the communicators from these functions).
//
// Failures: bad user input (parse_grid, validate_grid, factorizations(n <= 0)) throws
// tetrad::Error with what was expected; an out-of-range rank or coordinate passed by library code is
// a bug and fails TETRAD_CHECK.
#pragma once
#include <array>
#include <span>
#include <string>
#include <vector>

namespace tetrad::parallel {

// The axes of the grid. X: input features of normal layers, Y: output features, Z: tokens and the
// fully-sharded weight axis, P: pipeline stages, D: data-parallel replicas.
enum class Axis { X, Y, Z, P, D };

// The axes from fastest- to slowest-varying in rank order.
inline constexpr std::array<Axis, 5> kAxesInRankOrder = {Axis::X, Axis::Y, Axis::Z, Axis::P,
                                                          Axis::D};

// "x", "y", "z", "p", "d": the name used for the axis's communicator and in messages.
const char* axis_name(Axis axis);

struct GridShape {
  int x = 1, y = 1, z = 1, d = 1;
  int p = 1;                      // pipeline stages (last field: see above)
  int size() const;               // x*y*z*p*d
  std::string to_string() const;  // "2x2x1x1" (x,y,z,d) when p = 1, else "2x1x1x2x1" (x,y,z,p,d)
  bool operator==(const GridShape&) const = default;
};

struct GridCoord {
  int x = 0, y = 0, z = 0, d = 0;
  int p = 0;
  bool operator==(const GridCoord&) const = default;
};

// Axis accessors, so code can loop over axes instead of naming fields.
int extent(const GridShape& shape, Axis axis);
int& extent(GridShape& shape, Axis axis);
int coordinate(const GridCoord& coord, Axis axis);
int& coordinate(GridCoord& coord, Axis axis);

// "(x1,y0,z1,d0)"; with a pipeline stage other than 0, "(x1,y0,z1,p2,d0)".
std::string to_string(const GridCoord& coord);

// Coordinates of `rank` (0 <= rank < shape.size()); inverse of rank_of.
GridCoord coord_of(int rank, const GridShape& shape);
// Rank of `coord` (every coordinate within its extent); inverse of coord_of.
int rank_of(const GridCoord& coord, const GridShape& shape);

// The ranks that differ from `rank` only in `axis`, ordered by that coordinate (so position i of
// the result has coordinate i; `rank` itself is at position coordinate(coord_of(rank), axis)).
std::vector<int> group_ranks(int rank, const GridShape& shape, Axis axis);
// The ranks that differ from `rank` only in the given axes (e.g. {Z, D}: the token-splitting
// group), in increasing rank order, i.e. ordered by the mixed-radix index of those coordinates.
std::vector<int> group_ranks(int rank, const GridShape& shape, std::span<const Axis> axes);

// Parses "x,y,z,d" (e.g. "2,1,2,1"; p = 1), "x,y,z,p,d", or named extents "d=2,x=2" (axes not
// named are 1; an unknown or repeated axis is an error naming it); spaces allowed.
GridShape parse_grid(const std::string& text);

// Throws tetrad::Error unless every extent is >= 1 and shape.size() == world_size, e.g.
// "grid 2x2x1x1 needs 4 ranks but mpirun started 2 (...)".
void validate_grid(const GridShape& shape, int world_size);

// Every shape with size() == n (n >= 1) and no pipeline axis (p = 1), ordered lexicographically
// by (x, y, z, d). The count is the number of ordered 4-tuples with product n (20 for n = 8).
std::vector<GridShape> factorizations(int n);

}  // namespace tetrad::parallel
