// `tetrad config-doc`: the reference of every config key (docs/config.md is generated from it).
#include <iostream>

#include "cli/command.hpp"
#include "tetrad/train/config.hpp"

namespace tetrad::cli {

namespace {

Runner setup(CLI::App&) {
  return [](Context&) { std::cout << config_reference_markdown(); };
}

}  // namespace

const Command config_doc_command{"config-doc", "print the reference of every config key", false,
                                 &setup};

}  // namespace tetrad::cli
