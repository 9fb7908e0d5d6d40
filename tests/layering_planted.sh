#!/usr/bin/env bash
# The layering check (tests/check_layering.cpp) must catch what it exists to catch: on a copy of
# src/ it passes as the tree is, then fails naming the file and the edge for a planted upward
# include (core including train), a planted sideways include (comm including data) and a planted
# include circle (two model headers including each other), and each failure goes away with the
# plant. Usage: layering_planted.sh CHECK_LAYERING_BINARY SRC_DIR
source "$(dirname "$0")/planted_common.sh" "$1" "$2"

# include_caught NAME FILE TARGET PATTERN: plant `#include "TARGET"` in FILE (expect_caught).
include_caught() { printf '#include "%s"\n' "$3" | expect_caught "$1" "$2" "$4"; }

include_caught upward tetrad/core/error.cpp tetrad/train/trainer.hpp \
  'upward include: tetrad/core/error.cpp:'
include_caught upward_from_backend tetrad/backend/cpu/ops.cpp tetrad/parallel/grid.hpp \
  '(backend, level 1, may not include parallel, level 3)'
include_caught sideways tetrad/comm/communicator.cpp tetrad/data/shards.hpp \
  'sideways include: tetrad/comm/communicator.cpp:'
include_caught unrooted tetrad/model/params.cpp model_config.hpp \
  'unrooted include: tetrad/model/params.cpp:'

# A circle needs two plants: model/params.hpp already includes model_config.hpp; make
# model_config.hpp include params.hpp back.
cp "$work/src/tetrad/model/model_config.hpp" "$work/saved_mc"
printf '%s\n' '#include "tetrad/model/params.hpp"' >> "$work/src/tetrad/model/model_config.hpp"
caught circle 'include circle among 2 modules (tetrad/model/model_config, tetrad/model/params)'
cp "$work/saved_mc" "$work/src/tetrad/model/model_config.hpp"

# A folder with no level is refused, not silently skipped.
mkdir -p "$work/src/tetrad/extra"
printf '%s\n' '#include "tetrad/core/error.hpp"' > "$work/src/tetrad/extra/thing.cpp"
caught unplaced 'unplaced folder: tetrad/extra/thing.cpp'

finish "the layering check catches every planted problem"
