// check_layering SRC_DIR: fails (exit 1) when a source file includes one from a folder above its
// own, or from another folder of its own level, or when modules include each other in a circle.
// CTest runs it over src/ (test Layering); tests/layering_planted.sh proves that it catches a
// planted upward include and a planted circle.
//
// The order of the folders, top to bottom (docs/layout.md explains each): a folder may include
// only from itself and from folders of a lower level. Folders of one level are independent of
// each other.
//
//   7  cli                          src/cli: the `tetrad` binary
//   6  tools                        bench, report, memorization, checkpoint bench
//   5  train                        run config, optimizer, the training loop
//   4  planner | checkpoint         the cost model; checkpoint formats and their I/O
//   3  parallel                     grid, groups, sharding, the parallel model, pipeline
//   2  model                        model configs, parameter table and initial values, sampling
//   1  backend | comm | data        compute backends (cpu/); communicators; tokenizer, shards
//   0  core                         errors, buffers, RNG, hashing, profiling, CPU features
//
// Files: src/tetrad/<folder>/**.{hpp,h,cpp,cu,cuh} and src/cli/**. Includes: the quoted ones,
// which must be spelled from src/ ("tetrad/<folder>/<file>", or "cli/<file>" for the commands'
// shared header, which only cli/ may include: it is the top level); angle-bracket includes are system
// and third-party headers and are not checked. A module is a header and its source file
// (folder/name.hpp + folder/name.cpp); a circle is a set of modules that reach each other
// through their includes (checkpoint/hf.cpp including sharded.hpp while sharded.cpp includes
// hf.hpp is one), which #pragma once hides from the compiler but not from a reader.
//
// Output: the order, then per folder its files and its includes of other folders (how many
// include lines), then every problem with file:line, then a verdict line.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "check_sources.hpp"

namespace fs = std::filesystem;

namespace {

struct Layer {
  const char* folder;
  int level;
};

// Top to bottom; see the table above.
constexpr Layer kLayers[] = {
    {"cli", 7},     {"tools", 6},   {"train", 5}, {"planner", 4}, {"checkpoint", 4},
    {"parallel", 3}, {"model", 2},  {"backend", 1}, {"comm", 1},  {"data", 1},
    {"core", 0},
};

// Include circles that exist today and are still to be broken, each a whole strongly connected
// set of modules. A listed circle is reported as known, not as a failure; any other circle fails,
// and so does a listed one that no longer exists, so the list can only shrink. None today (the
// last one, checkpoint/hf -> sharded -> run_checkpoint -> hf, went when sharded checkpoints'
// run-folder writers moved to checkpoint/sharded_saver, above run_checkpoint).
const std::vector<std::set<std::string>> kKnownCircles = {};

int level_of(const std::string& folder) {
  for (const auto& l : kLayers)
    if (folder == l.folder) return l.level;
  return -1;
}

struct Include {
  std::string file;    // including file, relative to src/ ("tetrad/train/trainer.cpp")
  int line = 0;
  std::string target;  // as written ("tetrad/tools/ceilings.hpp")
};

std::string module_of(const std::string& rel) {  // "tetrad/checkpoint/hf.cpp" -> ".../hf"
  const auto dot = rel.rfind('.');
  return dot == std::string::npos ? rel : rel.substr(0, dot);
}

// "cli" for src/cli/..., "<folder>" for src/tetrad/<folder>/..., "" otherwise.
std::string folder_of(const std::string& rel) {
  if (rel.rfind("cli/", 0) == 0) return "cli";
  if (rel.rfind("tetrad/", 0) != 0) return "";
  const auto rest = rel.substr(7);
  const auto slash = rest.find('/');
  return slash == std::string::npos ? "" : rest.substr(0, slash);
}

}  // namespace

int main(int argc, char** argv) {
  const check_sources::SourceTree tree = check_sources::source_tree(argc, argv, "check_layering");
  const fs::path& root = tree.root;
  const std::vector<std::string>& files = tree.files;

  std::vector<std::string> problems;
  std::vector<Include> includes;
  const std::regex quoted(R"(^\s*#\s*include\s*"([^"]+)\")");
  for (const auto& f : files) {
    std::ifstream in(root / f);
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      std::smatch m;
      if (!std::regex_search(line, m, quoted)) continue;
      const std::string target = m[1];
      if (folder_of(target).empty()) {
        std::ostringstream os;
        os << "unrooted include: " << f << ":" << n << " includes \"" << target
           << "\" (expected \"tetrad/<folder>/<file>\", spelled from src/)";
        problems.push_back(os.str());
        continue;
      }
      includes.push_back({f, n, target});
    }
  }

  // Folders: files, and include lines into other folders.
  std::map<std::string, int> file_count;
  std::map<std::string, std::map<std::string, int>> edges;
  for (const auto& f : files) {
    const std::string folder = folder_of(f);
    if (level_of(folder) < 0) {
      problems.push_back("unplaced folder: " + f + " is in folder \"" + folder +
                         "\", which has no level in the layer order (tests/check_layering.cpp, "
                         "kLayers; docs/layout.md)");
      continue;
    }
    ++file_count[folder];
  }
  for (const auto& inc : includes) {
    const std::string from = folder_of(inc.file), to = folder_of(inc.target);
    const int lf = level_of(from), lt = level_of(to);
    if (lf < 0) continue;  // reported above
    if (from != to) ++edges[from][to];
    std::ostringstream os;
    if (lt < 0) {
      os << "unplaced folder: " << inc.file << ":" << inc.line << " includes \"" << inc.target
         << "\" from folder \"" << to << "\", which has no level in the layer order";
    } else if (lt > lf) {
      os << "upward include: " << inc.file << ":" << inc.line << " includes \"" << inc.target
         << "\" (" << from << ", level " << lf << ", may not include " << to << ", level " << lt
         << ")";
    } else if (lt == lf && from != to) {
      os << "sideways include: " << inc.file << ":" << inc.line << " includes \"" << inc.target
         << "\" (" << from << " and " << to << " share level " << lf
         << " and must not depend on each other)";
    } else {
      continue;
    }
    problems.push_back(os.str());
  }

  // Circles between modules: strongly connected components of the module graph (Tarjan).
  std::map<std::string, std::map<std::string, std::string>> graph;  // module -> module -> why
  for (const auto& f : files) graph[module_of(f)];
  for (const auto& inc : includes) {
    const std::string a = module_of(inc.file), b = module_of(inc.target);
    if (a == b || !graph.count(b)) continue;
    auto& why = graph[a][b];
    if (why.empty()) why = inc.file + ":" + std::to_string(inc.line);
  }
  std::map<std::string, int> index, low;
  std::set<std::string> on_stack;
  std::vector<std::string> stack;
  std::vector<std::vector<std::string>> circles;
  std::vector<std::string> known_circles;
  std::vector<std::set<std::string>> found_known;
  int counter = 0;
  std::function<void(const std::string&)> visit = [&](const std::string& v) {
    index[v] = low[v] = counter++;
    stack.push_back(v);
    on_stack.insert(v);
    for (const auto& [w, why] : graph[v]) {
      if (!index.count(w)) {
        visit(w);
        low[v] = std::min(low[v], low[w]);
      } else if (on_stack.count(w)) {
        low[v] = std::min(low[v], index[w]);
      }
    }
    if (low[v] != index[v]) return;
    std::vector<std::string> scc;
    std::string w;
    do {
      w = stack.back();
      stack.pop_back();
      on_stack.erase(w);
      scc.push_back(w);
    } while (w != v);
    if (scc.size() > 1) circles.push_back(scc);
  };
  for (const auto& [v, out] : graph)
    if (!index.count(v)) visit(v);
  for (auto& scc : circles) {
    // One concrete cycle through the component's smallest module (breadth-first, inside it).
    std::sort(scc.begin(), scc.end());
    const std::set<std::string> in(scc.begin(), scc.end());
    const std::string start = scc.front();
    std::map<std::string, std::string> parent;
    std::vector<std::string> queue = {start};
    std::string last;
    for (size_t q = 0; q < queue.size() && last.empty(); ++q)
      for (const auto& [w, why] : graph[queue[q]]) {
        if (!in.count(w)) continue;
        if (w == start) {
          last = queue[q];
          break;
        }
        if (!parent.count(w)) {
          parent[w] = queue[q];
          queue.push_back(w);
        }
      }
    std::vector<std::string> path = {last};
    while (path.back() != start) path.push_back(parent[path.back()]);
    std::reverse(path.begin(), path.end());
    path.push_back(start);
    std::ostringstream os;
    os << "include circle among " << scc.size() << " modules (";
    for (size_t i = 0; i < scc.size(); ++i) os << (i ? ", " : "") << scc[i];
    os << "), e.g.:";
    for (size_t i = 0; i + 1 < path.size(); ++i)
      os << (i ? " -> " : " ") << path[i];
    os << " -> " << start << " (";
    for (size_t i = 0; i + 1 < path.size(); ++i)
      os << (i ? "; " : "") << graph[path[i]][path[i + 1]] << " includes " << path[i + 1] << ".hpp";
    os << ")";
    const bool known = std::find(kKnownCircles.begin(), kKnownCircles.end(), in) != kKnownCircles.end();
    (known ? known_circles : problems).push_back((known ? "known " : "") + os.str());
    if (known) found_known.push_back(in);
  }
  for (const auto& k : kKnownCircles)
    if (std::find(found_known.begin(), found_known.end(), k) == found_known.end())
      problems.push_back("stale known circle: " + *k.begin() +
                         " ... is no longer a circle: remove it from kKnownCircles");

  std::cout << "layer order, top to bottom (a folder includes only from lower levels):\n ";
  for (size_t i = 0; i < std::size(kLayers); ++i) {
    const bool same = i > 0 && kLayers[i].level == kLayers[i - 1].level;
    std::cout << (i == 0 ? " " : same ? " | " : " > ") << kLayers[i].folder;
  }
  std::cout << "\n\nfolder      level  files  includes of other folders (include lines)\n";
  for (const auto& l : kLayers) {
    char head[64];
    std::snprintf(head, sizeof head, "%-11s %5d  %5d  ", l.folder, l.level, file_count[l.folder]);
    std::cout << head;
    const auto& out = edges[l.folder];
    if (out.empty()) std::cout << "-";
    bool first = true;
    for (const auto& t : kLayers) {
      const auto it = out.find(t.folder);
      if (it == out.end()) continue;
      std::cout << (first ? "" : ", ") << t.folder << " " << it->second;
      first = false;
    }
    std::cout << "\n";
  }
  size_t module_edges = 0;
  for (const auto& [m, out] : graph) module_edges += out.size();
  std::cout << "\n" << files.size() << " files, " << includes.size() << " includes of tetrad files, "
            << graph.size() << " modules, " << module_edges << " module dependencies\n";
  for (const auto& k : known_circles) std::cout << k << "\n";
  for (const auto& p : problems) std::cout << p << "\n";
  if (!problems.empty()) {
    std::cout << "FAILED: " << problems.size() << " layering problem(s)\n";
    return 1;
  }
  std::cout << "ok: no upward or sideways include, no include circle"
            << (known_circles.empty() ? "" : " but the known ones above") << "\n";
  return 0;
}
