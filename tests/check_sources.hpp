// What the source checks share (tests/check_layering.cpp, tests/check_sizes.cpp): the src/ folder
// named on the command line and the source files below it. Header-only: the checks are programs
// of one file each, linking nothing of tetrad.
#pragma once
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

namespace check_sources {

struct SourceTree {
  std::filesystem::path root;       // the src/ folder
  std::vector<std::string> files;   // relative to root, '/'-separated, sorted
};

// `tool SRC_DIR`: the tree below SRC_DIR's tetrad/ and cli/ folders, every
// .hpp/.h/.cpp/.cu/.cuh file. Exits with status 2 and a usage line when argv is not one folder
// holding tetrad/.
inline SourceTree source_tree(int argc, char** argv, const char* tool) {
  namespace fs = std::filesystem;
  if (argc != 2) {
    std::cerr << "usage: " << tool << " SRC_DIR   (the folder holding tetrad/ and cli/)\n";
    std::exit(2);
  }
  SourceTree t{argv[1], {}};
  if (!fs::is_directory(t.root / "tetrad")) {
    std::cerr << tool << ": " << t.root << " has no tetrad/ folder: expected the src/ folder\n";
    std::exit(2);
  }
  for (const char* top : {"tetrad", "cli"}) {
    if (!fs::is_directory(t.root / top)) continue;
    for (const auto& e : fs::recursive_directory_iterator(t.root / top)) {
      const auto ext = e.path().extension();
      if (e.is_regular_file() &&
          (ext == ".hpp" || ext == ".cpp" || ext == ".h" || ext == ".cu" || ext == ".cuh"))
        t.files.push_back(fs::relative(e.path(), t.root).generic_string());
    }
  }
  std::sort(t.files.begin(), t.files.end());
  return t;
}

}  // namespace check_sources
