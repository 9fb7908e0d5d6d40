#include "tetrad/tools/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "tetrad/checkpoint/atomic_file.hpp"
#include "tetrad/core/error.hpp"

namespace tetrad {

namespace {

using Series = std::vector<std::pair<double, double>>;  // (step, value)

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '&': o += "&amp;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string num(double v, int prec = 4) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*g", prec, v);
  return b;
}

// A line chart: several series over the step axis, with axes, ticks and a legend.
std::string line_chart(const std::string& title, const std::string& id,
                       const std::vector<std::pair<std::string, Series>>& series,
                       const std::vector<std::string>& colors, const std::string& y_label) {
  const double W = 640, H = 300, L = 60, R = 20, T = 30, B = 40;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const auto& [name, s] : series)
    for (const auto& [x, y] : s) {
      if (!std::isfinite(y)) continue;
      x0 = std::min(x0, x); x1 = std::max(x1, x);
      y0 = std::min(y0, y); y1 = std::max(y1, y);
    }
  std::ostringstream o;
  o << "<svg id=\"" << id << "\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W
    << "\" height=\"" << H << "\" viewBox=\"0 0 " << W << " " << H << "\">\n"
    << "<text x=\"" << W / 2 << "\" y=\"18\" text-anchor=\"middle\" font-size=\"14\">"
    << html_escape(title) << "</text>\n";
  if (x0 > x1) {
    o << "<text x=\"" << W / 2 << "\" y=\"" << H / 2 << "\" text-anchor=\"middle\">no data</text></svg>\n";
    return o.str();
  }
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) { y1 += std::abs(y1) * 0.05 + 1e-9; y0 -= std::abs(y0) * 0.05 + 1e-9; }
  const double pad = (y1 - y0) * 0.05;
  y0 -= pad; y1 += pad;
  auto X = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto Y = [&](double y) { return H - B - (y - y0) / (y1 - y0) * (H - T - B); };
  o << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << W - L - R << "\" height=\""
    << H - T - B << "\" fill=\"none\" stroke=\"#999\"/>\n";
  for (int i = 0; i <= 4; ++i) {
    const double yv = y0 + (y1 - y0) * i / 4, xv = x0 + (x1 - x0) * i / 4;
    o << "<text x=\"" << L - 4 << "\" y=\"" << Y(yv) + 4 << "\" text-anchor=\"end\" font-size=\"10\">"
      << num(yv, 3) << "</text>\n";
    o << "<line x1=\"" << L << "\" x2=\"" << W - R << "\" y1=\"" << Y(yv) << "\" y2=\"" << Y(yv)
      << "\" stroke=\"#eee\"/>\n";
    o << "<text x=\"" << X(xv) << "\" y=\"" << H - B + 14 << "\" text-anchor=\"middle\" font-size=\"10\">"
      << num(std::round(xv), 6) << "</text>\n";
  }
  o << "<text x=\"" << W / 2 << "\" y=\"" << H - 6 << "\" text-anchor=\"middle\" font-size=\"11\">step</text>\n"
    << "<text x=\"12\" y=\"" << H / 2 << "\" text-anchor=\"middle\" font-size=\"11\" transform=\"rotate(-90 12 "
    << H / 2 << ")\">" << html_escape(y_label) << "</text>\n";
  for (size_t k = 0; k < series.size(); ++k) {
    const auto& [name, s] = series[k];
    const std::string& c = colors[k % colors.size()];
    o << "<polyline class=\"series\" data-name=\"" << html_escape(name) << "\" fill=\"none\" stroke=\""
      << c << "\" stroke-width=\"1.5\" points=\"";
    for (const auto& [x, y] : s)
      if (std::isfinite(y)) o << num(X(x), 6) << "," << num(Y(y), 6) << " ";
    o << "\"/>\n";
    if (s.size() <= 40)
      for (const auto& [x, y] : s)
        if (std::isfinite(y))
          o << "<circle cx=\"" << num(X(x), 6) << "\" cy=\"" << num(Y(y), 6) << "\" r=\"2.5\" fill=\""
            << c << "\"><title>" << html_escape(name) << " step " << x << ": " << num(y, 5)
            << "</title></circle>\n";
    o << "<rect x=\"" << W - R - 150 << "\" y=\"" << T + 8 + 16 * k << "\" width=\"10\" height=\"10\" fill=\""
      << c << "\"/><text x=\"" << W - R - 135 << "\" y=\"" << T + 17 + 16 * k
      << "\" font-size=\"11\">" << html_escape(name) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace

std::vector<ExposedComm> exposed_communication(const std::string& trace_path, int* ranks) {
  std::ifstream f(trace_path);
  if (!f) fail("cannot read the trace '", trace_path, "'");
  nlohmann::json j;
  try {
    f >> j;
  } catch (const std::exception& e) {
    fail("the trace '", trace_path, "' is not JSON: ", e.what());
  }
  const nlohmann::json& events = j.is_object() ? j.value("traceEvents", nlohmann::json()) : j;
  if (!events.is_array())
    fail("the trace '", trace_path, "' has no traceEvents array (expected Chrome trace-event JSON "
         "as `tetrad train --trace` writes)");
  std::vector<ExposedComm> rows;
  std::vector<int64_t> pids;
  double total = 0;
  static const std::string prefix = "communication";
  for (const auto& e : events) {
    if (!e.is_object() || e.value("ph", "") != "X" || e.value("tid", -1) != 0) continue;
    const int64_t pid = e.value("pid", int64_t(0));
    if (std::find(pids.begin(), pids.end(), pid) == pids.end()) pids.push_back(pid);
    std::string name = e.value("name", "");
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    // "communication reduce_scatter L3" -> "reduce_scatter"; "... top" (embedding/head) kept;
    // a wait the code did not name ("communication L3") -> "(unnamed)".
    const size_t l = name.rfind(" L");
    if (l != std::string::npos && l + 2 < name.size() &&
        name.find_first_not_of("0123456789", l + 2) == std::string::npos)
      name.erase(l);
    name = name.size() > prefix.size() + 1 ? name.substr(prefix.size() + 1) : "(unnamed)";
    const double s = e.value("dur", 0.0) * 1e-6;
    auto it = std::find_if(rows.begin(), rows.end(), [&](const ExposedComm& r) { return r.what == name; });
    if (it == rows.end()) {
      rows.push_back({name, 0, 0, 0});
      it = rows.end() - 1;
    }
    it->seconds += s;
    it->count += 1;
    total += s;
  }
  const double n = std::max<size_t>(pids.size(), 1);
  for (auto& r : rows) {
    r.share = total > 0 ? r.seconds / total : 0;
    r.seconds /= n;
    r.count /= n;
  }
  std::sort(rows.begin(), rows.end(), [](const ExposedComm& a, const ExposedComm& b) { return a.seconds > b.seconds; });
  if (ranks) *ranks = int(pids.size());
  return rows;
}

void write_run_report(const std::string& run_dir, const std::string& out_path,
                      const std::string& trace_path) {
  const std::string metrics_path = run_dir + "/metrics.jsonl";
  std::ifstream f(metrics_path);
  if (!f) fail("run folder '", run_dir, "' has no metrics.jsonl (is it a `tetrad train` run.dir?)");
  Series loss, val, tok_s, mfu, hfu;
  std::string mfu_peak = "FMA peak";  // what MFU is measured against (older runs: the FMA peak)
  std::string mfu_count = "attention counted in full";  // older runs' count (no mfu_attention)
  struct Part { const char* key; const char* label; const char* color; double sum = 0; };
  std::vector<Part> parts = {{"t_compute_s", "compute", "#4e79a7"},
                             {"t_comm_exposed_s", "exposed communication", "#e15759"},
                             {"t_wait_s", "waiting (imbalance)", "#f28e2b"},
                             {"t_optimizer_s", "optimizer", "#59a14f"},
                             {"t_data_s", "data", "#b07aa1"}};
  double step_sum = 0, issued_sum = 0;
  int timed_steps = 0, skipped = 0;
  std::string line;
  for (int ln = 1; std::getline(f, line); ++ln) {
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      fail("'", metrics_path, "' line ", ln, " is not JSON: ", e.what());
    }
    if (!j.contains("step")) continue;
    const double step = j["step"].get<double>();
    if (j.value("event", "") == "start") {
      // A (re)start from `step`: what an earlier timeline logged after it was abandoned.
      for (Series* s : {&loss, &val, &tok_s, &mfu})
        s->erase(std::remove_if(s->begin(), s->end(), [&](const auto& p) { return p.first > step; }),
                 s->end());
      continue;
    }
    if (j.contains("val_loss")) val.emplace_back(step, j["val_loss"].get<double>());
    if (j.value("skipped", false)) ++skipped;
    if (!j.contains("loss")) continue;
    loss.emplace_back(step, j["loss"].get<double>());
    if (j.contains("tokens_per_s")) tok_s.emplace_back(step, j["tokens_per_s"].get<double>());
    // Above 100% the peak was measured low: no fraction of it is drawn (the progress line's n/a).
    if (j.contains("mfu") && j["mfu"].get<double>() <= 1) mfu.emplace_back(step, 100 * j["mfu"].get<double>());
    if (j.contains("hfu") && j["hfu"].get<double>() <= 1) hfu.emplace_back(step, 100 * j["hfu"].get<double>());
    if (j.contains("mfu_peak") && j["mfu_peak"].is_string()) mfu_peak = j["mfu_peak"].get<std::string>();
    if (j.contains("mfu_attention")) mfu_count = j["mfu_attention"] == "causal" ? "causal attention counted as half"
                                                                                 : "attention counted in full";
    if (j.contains("t_compute_s") && j.contains("step_time_s")) {
      // The first step of a run carries one-off costs: left out of the average when there are more.
      if (loss.size() == 1) continue;
      ++timed_steps;
      step_sum += j["step_time_s"].get<double>();
      issued_sum += j.value("t_comm_issued_s", 0.0);
      for (auto& p : parts) p.sum += j.value(p.key, 0.0);
    }
  }
  if (loss.empty()) fail("'", metrics_path, "' holds no training step yet");

  std::string config_text, grid = "1,1,1,1";
  {
    std::ifstream c(run_dir + "/config.toml");
    if (c) {
      std::stringstream ss;
      ss << c.rdbuf();
      config_text = ss.str();
      std::istringstream lines(config_text);
      std::string section;
      for (std::string l; std::getline(lines, l);) {
        if (!l.empty() && l[0] == '[') section = l;
        if (section == "[parallel]" && l.rfind("grid", 0) == 0) {
          const auto q0 = l.find('"'), q1 = l.rfind('"');
          if (q0 != std::string::npos && q1 > q0) grid = l.substr(q0 + 1, q1 - q0 - 1);
        }
      }
    }
  }

  std::ostringstream o;
  const std::vector<std::string> colors = {"#4e79a7", "#e15759", "#59a14f", "#f28e2b"};
  o << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>tetrad run "
    << html_escape(run_dir) << "</title>\n<style>body{font-family:sans-serif;max-width:1340px;"
       "margin:20px auto;color:#222}h1{font-size:20px}h2{font-size:16px;margin-top:28px}"
       "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
       "th{background:#f4f4f4}pre{background:#f7f7f7;padding:10px;font-size:12px;overflow:auto}"
       ".charts svg{margin:4px;border:1px solid #eee}</style></head><body>\n";
  o << "<h1>tetrad run: " << html_escape(run_dir) << "</h1>\n";
  const double last_loss = loss.back().second;
  o << "<p>grid <b id=\"grid\">" << html_escape(grid) << "</b> (x,y,z,d) &middot; " << loss.size()
    << " steps logged (last step " << loss.back().first << ", loss " << num(last_loss, 5) << ")";
  if (!val.empty()) o << " &middot; last validation loss " << num(val.back().second, 5);
  if (skipped) o << " &middot; " << skipped << " skipped (non-finite) steps";
  o << "</p>\n<div class=\"charts\">\n";
  o << line_chart("loss", "loss-chart", {{"train loss", loss}, {"validation loss", val}}, colors, "loss");
  o << line_chart("tokens/s", "tokens-chart", {{"tokens/s", tok_s}}, {"#59a14f"}, "tokens/s");
  std::vector<std::pair<std::string, Series>> util = {{"MFU %", mfu}};
  if (!hfu.empty()) util.push_back({"HFU % (with recomputation)", hfu});
  o << line_chart("MFU (% of the " + mfu_peak + "; " + mfu_count + ")", "mfu-chart", util, {"#f28e2b", "#76b7b2"},
                  "MFU %");
  o << "</div>\n<h2>Where the step time goes</h2>\n";
  if (timed_steps == 0) {
    o << "<p>No time breakdown in this run's metrics (written by an older tetrad).</p>\n";
  } else {
    const double avg = step_sum / timed_steps;
    double accounted = 0;
    for (const auto& p : parts) accounted += p.sum;
    const double hidden = issued_sum > 0 ? std::max(0.0, 1 - parts[1].sum / issued_sum) : 0.0;
    o << "<p>Average over " << timed_steps << " steps (the first step left out): " << num(avg * 1e3, 4)
      << " ms per step; the parts account for " << num(100 * accounted / step_sum, 4)
      << "% of it. Communication issued " << num(issued_sum / timed_steps * 1e3, 4)
      << " ms per step, of which <b id=\"hidden\">" << num(100 * hidden, 3)
      << "%</b> was hidden behind compute.</p>\n";
    const double W = 900, H = 40;
    o << "<svg id=\"breakdown\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\""
      << H + 20 << "\">\n";
    double x = 0;
    for (const auto& p : parts) {
      const double w = W * p.sum / std::max(step_sum, accounted);
      o << "<rect x=\"" << num(x, 6) << "\" y=\"0\" width=\"" << num(w, 6) << "\" height=\"" << H
        << "\" fill=\"" << p.color << "\"><title>" << p.label << ": "
        << num(100 * p.sum / step_sum, 3) << "%</title></rect>\n";
      x += w;
    }
    o << "</svg>\n<table><tr><th style=\"text-align:left\">part</th><th>ms per step</th><th>share</th></tr>\n";
    for (const auto& p : parts)
      o << "<tr><td style=\"text-align:left\"><span style=\"color:" << p.color << "\">&#9632;</span> "
        << p.label << "</td><td>" << num(p.sum / timed_steps * 1e3, 4) << "</td><td>"
        << num(100 * p.sum / step_sum, 3) << "%</td></tr>\n";
    o << "<tr><td style=\"text-align:left\">step (measured)</td><td>" << num(avg * 1e3, 4)
      << "</td><td>100%</td></tr></table>\n";
  }
  std::string trace = trace_path;
  if (trace.empty() && std::filesystem::exists(run_dir + "/trace.json")) trace = run_dir + "/trace.json";
  if (!trace.empty()) {
    int ranks = 0;
    const std::vector<ExposedComm> rows = exposed_communication(trace, &ranks);
    o << "<h2>Exposed communication by collective</h2>\n<p>From the trace " << html_escape(trace)
      << " (" << ranks << " rank(s); time each rank's training thread was blocked in a collective, "
      << "per rank over the traced steps).</p>\n";
    if (rows.empty()) {
      o << "<p>No exposed communication in the trace.</p>\n";
    } else {
      o << "<table id=\"exposed\"><tr><th style=\"text-align:left\">collective</th><th>waits</th>"
        << "<th>ms</th><th>share</th></tr>\n";
      for (const auto& r : rows)
        o << "<tr><td style=\"text-align:left\">" << html_escape(r.what) << "</td><td>"
          << num(r.count, 4) << "</td><td>" << num(r.seconds * 1e3, 4) << "</td><td>"
          << num(100 * r.share, 3) << "%</td></tr>\n";
      o << "</table>\n";
    }
  }
  o << "<h2>Resolved configuration</h2>\n<pre id=\"config\">" << html_escape(config_text) << "</pre>\n";
  o << "</body></html>\n";
  write_file_atomic(out_path, o.str());
}

}  // namespace tetrad
