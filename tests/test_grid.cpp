// The process grid (parallel/grid.hpp): pure arithmetic, no MPI. Also the serial ProcessGroups,
// which needs no MPI either.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "tetrad/comm/communicator.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/parallel/grid.hpp"
#include "tetrad/parallel/process_groups.hpp"

using namespace tetrad;
using namespace tetrad::parallel;

namespace {
// Shapes of many sizes, including every factorisation of a few rank counts and odd extents.
std::vector<GridShape> many_shapes() {
  std::vector<GridShape> shapes;
  for (int n : {1, 2, 3, 4, 6, 8, 12, 16, 30})
    for (const GridShape& s : factorizations(n)) shapes.push_back(s);
  shapes.push_back({5, 3, 2, 7});
  return shapes;
}

std::string parse_error(const std::string& text) {
  try {
    parse_grid(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }
}  // namespace

TEST(Grid, SizeAndToString) {
  const GridShape s{2, 3, 4, 5};
  EXPECT_EQ(s.size(), 120);
  EXPECT_EQ(s.to_string(), "2x3x4x5");
  EXPECT_EQ(GridShape{}.size(), 1);
  EXPECT_EQ(GridShape{}.to_string(), "1x1x1x1");
  EXPECT_EQ(to_string(GridCoord{1, 0, 2, 3}), "(x1,y0,z2,d3)");
}

// One number per axis: named or positional construction, [] by Axis, sizes over axis sets.
TEST(Grid, ShapesAreIndexedByAxis) {
  GridShape s{{Axis::D, 4}, {Axis::P, 2}};
  EXPECT_EQ(s, GridShape::xyzpd(1, 1, 1, 2, 4));
  EXPECT_EQ(s, parse_grid("d=4,p=2"));
  EXPECT_EQ(s[Axis::D], 4);
  EXPECT_EQ(s.x(), 1);
  s[Axis::X] = 3;
  EXPECT_EQ(s.x(), 3);
  EXPECT_EQ(s.size(), 24);
  EXPECT_EQ(s.size({Axis::X, Axis::D}), 12);
  EXPECT_EQ(s.size(AxisSet()), 1);
  EXPECT_EQ(s.to_arg(), "3,1,1,2,4");
  EXPECT_EQ(parse_grid(s.to_arg()), s);
  EXPECT_EQ((GridShape{2, 1, 2, 1}).to_arg(), "2,1,2,1");
  EXPECT_EQ((GridShape{2, 1, 2, 1}), GridShape::xyzpd(2, 1, 2, 1, 1));
  EXPECT_EQ((GridCoord{{Axis::P, 1}}), GridCoord::xyzpd(0, 0, 0, 1, 0));
  EXPECT_TRUE(AxisSet(Axis::Z).contains(Axis::Z));
  EXPECT_FALSE(token_axes().contains(Axis::X));
  EXPECT_EQ(AxisSet(Axis::Z) | AxisSet(Axis::D), token_axes());
  EXPECT_EQ(token_axes().axes(), (std::vector<Axis>{Axis::Z, Axis::D}));
  // Every axis, the planner's enumeration: lexicographic in rank order.
  const std::vector<GridShape> all = factorizations(8, {Axis::X, Axis::Y, Axis::Z, Axis::P, Axis::D});
  EXPECT_EQ(all.size(), 35u);  // C(3+4, 4) ways to share three factors of 2 among five axes
  EXPECT_EQ(all.front(), GridShape::xyzpd(1, 1, 1, 1, 8));
  EXPECT_EQ(all[1], GridShape::xyzpd(1, 1, 1, 2, 4));
  EXPECT_EQ(all.back(), GridShape::xyzpd(8, 1, 1, 1, 1));
  EXPECT_EQ(factorizations(8, Axis::Y), (std::vector<GridShape>{GridShape::xyzpd(1, 8, 1, 1, 1)}));
}

TEST(Grid, CoordinatesFollowTheDocumentedFormula) {
  for (const GridShape& s : many_shapes()) {
    for (int r = 0; r < s.size(); ++r) {
      const GridCoord c = coord_of(r, s);
      EXPECT_EQ(c.x(), r % s.x());
      EXPECT_EQ(c.y(), (r / s.x()) % s.y());
      EXPECT_EQ(c.z(), (r / (s.x() * s.y())) % s.z());
      EXPECT_EQ(c.d(), r / (s.x() * s.y() * s.z()));
    }
  }
}

TEST(Grid, RankOfInvertsCoordOf) {
  for (const GridShape& s : many_shapes()) {
    std::set<int> seen;
    for (int r = 0; r < s.size(); ++r) {
      EXPECT_EQ(rank_of(coord_of(r, s), s), r) << s.to_string();
      seen.insert(r);
    }
    // And the other way: every coordinate maps to a distinct rank that maps back.
    std::set<int> ranks;
    for (int d = 0; d < s.d(); ++d)
      for (int z = 0; z < s.z(); ++z)
        for (int y = 0; y < s.y(); ++y)
          for (int x = 0; x < s.x(); ++x) {
            const GridCoord c{x, y, z, d};
            const int r = rank_of(c, s);
            EXPECT_EQ(coord_of(r, s), c);
            ranks.insert(r);
          }
    EXPECT_EQ(ranks, seen) << s.to_string();
  }
}

TEST(Grid, XVariesFastest) {
  const GridShape s{2, 2, 2, 2};
  EXPECT_EQ(coord_of(1, s), (GridCoord{1, 0, 0, 0}));
  EXPECT_EQ(coord_of(2, s), (GridCoord{0, 1, 0, 0}));
  EXPECT_EQ(coord_of(4, s), (GridCoord{0, 0, 1, 0}));
  EXPECT_EQ(coord_of(8, s), (GridCoord{0, 0, 0, 1}));
  EXPECT_EQ(coord_of(15, s), (GridCoord{1, 1, 1, 1}));
}

TEST(Grid, GroupRanksDifferOnlyInTheirAxisAndAreOrderedByIt) {
  for (const GridShape& s : many_shapes()) {
    for (Axis a : kAxesInRankOrder) {
      for (int r = 0; r < s.size(); ++r) {
        const std::vector<int> g = group_ranks(r, s, a);
        ASSERT_EQ(static_cast<int>(g.size()), s[a]) << s.to_string() << " " << axis_name(a);
        const GridCoord me = coord_of(r, s);
        // r is in its own group, at the position of its coordinate.
        EXPECT_EQ(g[me[a]], r);
        EXPECT_EQ(position_in(me, s, a), me[a]);
        for (int i = 0; i < static_cast<int>(g.size()); ++i) {
          GridCoord c = coord_of(g[i], s);
          EXPECT_EQ(c[a], i);
          c[a] = me[a];
          EXPECT_EQ(c, me) << "rank " << g[i] << " differs from " << r << " outside axis "
                           << axis_name(a);
        }
        // Consistent: every member computes the same group.
        for (int member : g) EXPECT_EQ(group_ranks(member, s, a), g);
      }
    }
  }
}

TEST(Grid, GroupsOfEachAxisPartitionTheWorld) {
  for (const GridShape& s : many_shapes()) {
    for (Axis a : kAxesInRankOrder) {
      std::set<std::vector<int>> groups;
      for (int r = 0; r < s.size(); ++r) groups.insert(group_ranks(r, s, a));
      EXPECT_EQ(static_cast<int>(groups.size()), s.size() / s[a]);
      std::vector<int> all;
      for (const auto& g : groups) all.insert(all.end(), g.begin(), g.end());
      std::sort(all.begin(), all.end());
      ASSERT_EQ(static_cast<int>(all.size()), s.size()) << s.to_string() << " " << axis_name(a);
      for (int r = 0; r < s.size(); ++r) EXPECT_EQ(all[r], r);
    }
  }
}

TEST(Grid, MultiAxisGroups) {
  const GridShape s{2, 3, 2, 2};
  const AxisSet zd = {Axis::Z, Axis::D};
  EXPECT_EQ(zd, token_axes());
  EXPECT_EQ(zd.name(), "zd");
  EXPECT_EQ(s.size(zd), 4);
  for (int r = 0; r < s.size(); ++r) {
    const std::vector<int> g = group_ranks(r, s, zd);
    ASSERT_EQ(g.size(), 4u);
    EXPECT_TRUE(std::is_sorted(g.begin(), g.end()));
    const GridCoord me = coord_of(r, s);
    for (int i = 0; i < 4; ++i) {
      const GridCoord c = coord_of(g[i], s);
      EXPECT_EQ(c.x(), me.x());
      EXPECT_EQ(c.y(), me.y());
      EXPECT_EQ(c.z() + s.z() * c.d(), i);  // the order ProcessGroups' zd key uses
      EXPECT_EQ(position_in(c, s, zd), i);
      EXPECT_EQ(token_slot(c, s), i);
    }
    EXPECT_EQ(g[position_in(me, s, zd)], r);
  }
  EXPECT_EQ(token_slots(s), 4);
  // All axes: the whole world, in rank order.
  const AxisSet all = {Axis::X, Axis::Y, Axis::Z, Axis::P, Axis::D};
  std::vector<int> world(s.size());
  for (int r = 0; r < s.size(); ++r) world[r] = r;
  EXPECT_EQ(group_ranks(5, s, all), world);
  EXPECT_EQ(all.name(), "xyzpd");
  EXPECT_EQ(AxisSet().name(), "");
  EXPECT_EQ(group_ranks(5, s, AxisSet()), std::vector<int>{5});
}

TEST(Grid, ParseAcceptsFourPositiveIntegers) {
  EXPECT_EQ(parse_grid("2,1,2,1"), (GridShape{2, 1, 2, 1}));
  EXPECT_EQ(parse_grid("1,1,1,1"), GridShape{});
  EXPECT_EQ(parse_grid(" 4, 2 ,1,3"), (GridShape{4, 2, 1, 3}));
}

TEST(Grid, ParseErrorsSayWhatWasExpected) {
  for (const char* bad : {"", "2,2", "2,2,2", "2,2,2,2,2,2", "2x2x1x1", "a,1,1,1", "1,0,1,1",
                          "1,1,-2,1", "1,1,1,2.5", "1,,1,1", "99999999999,1,1,1",
                          "65536,65536,1,1"}) {
    const std::string msg = parse_error(bad);
    ASSERT_FALSE(msg.empty()) << "'" << bad << "' was accepted";
    EXPECT_TRUE(contains(msg, std::string("\"") + bad + "\"")) << msg;
    if (std::string(bad) != "65536,65536,1,1") {
      EXPECT_TRUE(contains(msg, "x,y,z,d")) << msg;
    }
  }
  EXPECT_TRUE(contains(parse_error("2,2,2"), "got 3 numbers")) << parse_error("2,2,2");
  EXPECT_TRUE(contains(parse_error("1,0,1,1"), "got \"0\" for y")) << parse_error("1,0,1,1");
  EXPECT_TRUE(contains(parse_error("1,1,1,x"), "for d")) << parse_error("1,1,1,x");
}

// The named form: any order, axes not named are 1; the form new axes are given in.
TEST(Grid, ParseAcceptsNamedExtents) {
  EXPECT_EQ(parse_grid("d=2,x=2"), parse_grid("2,1,1,2"));
  EXPECT_EQ(parse_grid("x=2,d=2"), parse_grid("2,1,1,2"));
  EXPECT_EQ(parse_grid(" z = 4 "), parse_grid("1,1,4,1"));
  EXPECT_EQ(parse_grid("p=3,y=2"), parse_grid("1,2,1,3,1"));
  EXPECT_EQ(parse_grid("x=1"), GridShape{});
  EXPECT_EQ(parse_grid("d=2,p=2,z=2,y=2,x=2").size(), 32);
}

TEST(Grid, NamedExtentErrorsNameTheAxis) {
  EXPECT_TRUE(contains(parse_error("d=2,q=2"), "unknown axis \"q\"")) << parse_error("d=2,q=2");
  EXPECT_TRUE(contains(parse_error("d=2,q=2"), "x, y, z, c, p, d")) << parse_error("d=2,q=2");
  EXPECT_TRUE(contains(parse_error("X=2"), "unknown axis \"X\"")) << parse_error("X=2");
  EXPECT_TRUE(contains(parse_error("d=2,x=1,d=4"), "axis d is named twice"))
      << parse_error("d=2,x=1,d=4");
  EXPECT_TRUE(contains(parse_error("d=0"), "got \"0\" for d")) << parse_error("d=0");
  EXPECT_TRUE(contains(parse_error("x=two"), "got \"two\" for x")) << parse_error("x=two");
  EXPECT_TRUE(contains(parse_error("x=2,2"), "\"2\" names no axis")) << parse_error("x=2,2");
  for (const char* bad : {"=2", "x=", "x=2,", "x=2;d=2", "x=65536,y=65536",
                          "x=2147483647,y=2147483647,z=2147483647,p=2147483647,d=2147483647"}) {
    const std::string msg = parse_error(bad);
    ASSERT_FALSE(msg.empty()) << "'" << bad << "' was accepted";
    EXPECT_TRUE(contains(msg, std::string("\"") + bad + "\"")) << msg;
  }
}

TEST(Grid, ValidateChecksTheRankCount) {
  EXPECT_NO_THROW(validate_grid({2, 2, 1, 1}, 4));
  EXPECT_NO_THROW(validate_grid({}, 1));
  try {
    validate_grid({2, 2, 1, 1}, 2);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "grid 2x2x1x1 needs 4 ranks but mpirun started 2")) << e.what();
  }
  try {
    validate_grid({1, 0, 1, 1}, 0);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "y extent must be at least 1")) << e.what();
  }
}

TEST(Grid, FactorizationsListEveryOrderedFactorisationOnce) {
  const std::vector<GridShape> f8 = factorizations(8);
  EXPECT_EQ(f8.size(), 20u);  // C(3+3, 3) ways to share three factors of 2 among four axes
  std::set<std::string> distinct;
  for (const GridShape& s : f8) {
    EXPECT_EQ(s.size(), 8) << s.to_string();
    distinct.insert(s.to_string());
  }
  EXPECT_EQ(distinct.size(), f8.size());
  EXPECT_EQ(f8.front(), (GridShape{1, 1, 1, 8}));
  EXPECT_EQ(f8.back(), (GridShape{8, 1, 1, 1}));
  EXPECT_EQ(factorizations(1).size(), 1u);
  EXPECT_EQ(factorizations(2).size(), 4u);
  EXPECT_EQ(factorizations(4).size(), 10u);
  EXPECT_EQ(factorizations(6).size(), 16u);   // 4 * 4 (two distinct primes)
  EXPECT_EQ(factorizations(12).size(), 40u);  // C(5,3) * 4
  // Brute force for a few n.
  for (int n : {1, 6, 12, 16, 30}) {
    size_t count = 0;
    for (int x = 1; x <= n; ++x)
      for (int y = 1; y <= n; ++y)
        for (int z = 1; z <= n; ++z)
          for (int d = 1; d <= n; ++d) count += (x * y * z * d == n);
    EXPECT_EQ(factorizations(n).size(), count) << n;
  }
  EXPECT_THROW(factorizations(0), Error);
}

TEST(Grid, SerialProcessGroupsNeedNoMpi) {
  const ProcessGroups g;
  EXPECT_EQ(g.shape, GridShape{});
  EXPECT_EQ(g.coord, GridCoord{});
  for (const comm::Communicator* c : {&g.world, &g.x(), &g.y(), &g.z(), &g.d(), &g.tokens()}) {
    EXPECT_TRUE(c->is_self());
    EXPECT_EQ(c->size(), 1);
    EXPECT_EQ(c->rank(), 0);
  }
  EXPECT_EQ(g.x().name(), "x");
  EXPECT_EQ(g.tokens().name(), "zd");
  EXPECT_EQ(&g.group(Axis::Z), &g.z());
  EXPECT_EQ(g.summary(), "rank 0 = (x0,y0,z0,d0) of 1x1x1x1: x [0] y [0] z [0] d [0] zd [0]");
}

// The pipeline axis sits between Z and D in rank order; the four-number forms mean p = 1.
TEST(Grid, PipelineAxisBetweenZAndD) {
  const GridShape s = parse_grid("2,1,1,3,2");
  EXPECT_EQ(s.x(), 2);
  EXPECT_EQ(s.p(), 3);
  EXPECT_EQ(s.d(), 2);
  EXPECT_EQ(s.size(), 12);
  EXPECT_EQ(s.to_string(), "2x1x1x3x2");
  EXPECT_EQ(parse_grid("2,1,1,2").p(), 1);
  EXPECT_EQ((GridShape{2, 1, 1, 2}).to_string(), "2x1x1x2");
  // x fastest, then y, z, p, d.
  EXPECT_EQ(coord_of(2, s), GridCoord::xyzpd(0, 0, 0, 1, 0));
  EXPECT_EQ(coord_of(6, s), GridCoord::xyzpd(0, 0, 0, 0, 1));
  EXPECT_EQ(coord_of(11, s), GridCoord::xyzpd(1, 0, 0, 2, 1));
  EXPECT_EQ(to_string(coord_of(11, s)), "(x1,y0,z0,p2,d1)");
  EXPECT_EQ(group_ranks(3, s, Axis::P), (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(group_ranks(3, s, token_axes()), (std::vector<int>{3, 9}));  // same stage only
  EXPECT_TRUE(contains(parse_error("1,2,3,4,5,6"), "or five \"x,y,z,p,d\""));
  for (const GridShape& f : factorizations(8)) EXPECT_EQ(f.p(), 1);
}

// The context axis C (issue 28): between Z and P in rank order, by name only in --grid, written
// by name where it is not 1, its groups (C, Z x C x D for tokens, C x D for replicas).
TEST(Grid, ContextAxis) {
  const GridShape s = parse_grid("c=2,x=2,d=2");
  EXPECT_EQ(s.c(), 2);
  EXPECT_EQ(s.size(), 8);
  EXPECT_EQ(s.to_string(), "x2.c2.d2");
  EXPECT_EQ(s.to_arg(), "x=2,c=2,d=2");
  EXPECT_EQ(parse_grid(s.to_arg()), s);
  EXPECT_EQ(GridShape(2, 1, 1, 2).to_arg(), "2,1,1,2");  // no c: the positional forms as before
  // Rank order x, y, z, c, p, d: rank 2 is c = 1 of x = 0.
  EXPECT_EQ(coord_of(2, s), (GridCoord{{Axis::C, 1}}));
  EXPECT_EQ(to_string(coord_of(3, s)), "(x1,y0,z0,c1,p0,d0)");
  EXPECT_EQ(group_ranks(5, s, Axis::C), (std::vector<int>{5, 7}));
  EXPECT_EQ(group_ranks(5, s, replica_axes()), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(group_ranks(0, s, token_share_axes()), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(token_slots(s), 2);  // C cuts sequences, it does not deal them
  EXPECT_TRUE(contains(parse_error("2,1,1,1,1,2"), "c=2"));
}

// The expert fold E: named only ("e=2"), no ranks of its own (size() does not count it), written
// back by name; expert_rank / expert_data_rank split the replica ranks (C x D) into E consecutive
// expert ranks; validate_grid wants E to divide Gc x Gd, naming the numbers.
TEST(Grid, ExpertFold) {
  const GridShape s = parse_grid("d=4,e=2");
  EXPECT_EQ(s.e(), 2);
  EXPECT_EQ(s.d(), 4);
  EXPECT_EQ(s.size(), 4);
  EXPECT_EQ(s.to_string(), "d4.e2");
  EXPECT_EQ(s.to_arg(), "d=4,e=2");
  EXPECT_EQ(parse_grid(s.to_arg()), s);
  EXPECT_NE(s, parse_grid("d=4"));
  EXPECT_EQ(parse_grid("d=4").e(), 1);
  EXPECT_EQ(parse_grid("d=4").to_arg(), "1,1,1,4");  // E = 1: the positional form as before
  // Replica position c + Gc d: expert rank = position % E, expert-data rank = position / E.
  const GridShape cd = parse_grid("x=2,c=2,d=2,e=4");
  const int er[] = {0, 0, 1, 1, 2, 2, 3, 3}, edr[] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(expert_rank(coord_of(r, cd), cd), er[r]) << "rank " << r;
    EXPECT_EQ(expert_data_rank(coord_of(r, cd), cd), edr[r]) << "rank " << r;
  }
  EXPECT_EQ(expert_rank(coord_of(3, s), s), 1);
  EXPECT_EQ(expert_data_rank(coord_of(3, s), s), 1);
  EXPECT_NO_THROW(validate_grid(s, 4));
  try {
    validate_grid(parse_grid("d=2,e=4"), 2);
    FAIL() << "E = 4 over D = 2 was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "E = 4 must divide the data x context ranks Gd x Gc = 2 x 1 = 2"))
        << e.what();
  }
  EXPECT_TRUE(contains(parse_error("d=2,e=2,e=2"), "e is named twice"));
  EXPECT_TRUE(contains(parse_error("d=2,e=0"), "got \"0\" for e"));
  EXPECT_TRUE(contains(parse_error("d=2,f=2"), "e, the expert fold")) << parse_error("d=2,f=2");
}
