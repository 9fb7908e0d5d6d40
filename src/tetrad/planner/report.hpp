// The planner's report of a plan, apart from its cost model (planner.hpp): `tetrad plan`'s text
// table and its JSON (Estimate::to_json for each grid, defined here too), and the rank agreement
// that planner/validate reports between predicted and measured step times.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tetrad/planner/machine.hpp"
#include "tetrad/planner/planner.hpp"

namespace tetrad::planner {

// The run, the machine and the FLOPs, then the valid grids fastest first (the first `top`; 0:
// all) and up to `show_rejected` rejected ones with the reason (-1: all).
std::string plan_text(const PlanInput& in, const Machine& m, const std::vector<Estimate>& plan,
                      int show_rejected = 20, int top = 0);
// Why the plan's first choice has a context axis (C > 1), "" when it has none: the fastest grid
// with C = 1 and how much slower it is, or the closest C = 1 grid that does not fit.
std::string context_choice_text(const std::vector<Estimate>& plan);
// The micro-batch an estimate runs, per (z, d) replica x micro-batches per step ("4 x 16"):
// the plan's and the scaling table's column ("-" for a rejected grid).
std::string micro_label(const Estimate& e);
// One grid, term by term (`tetrad plan --why GRID`): why it was rejected, its memory items
// against the machine's, the micro-batch, the step's terms (compute: GEMMs, attention, the
// rest; exposed communication by axis; bubble; contention; optimizer) and every collective.
std::string why_text(const PlanInput& in, const Machine& m, const Estimate& e);
// The same as JSON: model, run, machine, the FLOPs formula and every grid's Estimate::to_json.
nlohmann::json plan_json(const PlanInput& in, const Machine& m, const std::vector<Estimate>& plan);

// Spearman rank correlation of two equally long samples (average ranks for ties).
double spearman(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace tetrad::planner
