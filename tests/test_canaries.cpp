// Canary injection in `prepare` (memorization experiments): each canary lands in the training
// split exactly R times, at the recorded token offsets, never in validation.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tetrad/core/error.hpp"
#include "tetrad/data/prepare.hpp"
#include "tetrad/data/shards.hpp"
#include "tetrad/data/tokenizer.hpp"

namespace fs = std::filesystem;
using namespace tetrad;

TEST(Canaries, InsertedRTimesAtTheRecordedOffsets) {
  const fs::path dir = fs::temp_directory_path() / ("tetrad_canary_" + std::to_string(getpid()));
  fs::create_directories(dir);
  {
    std::ofstream f(dir / "corpus.txt");
    for (int i = 0; i < 300; ++i) {
      f << "the shepherd " << i << " went up to the mountain and spake unto the people.\n";
      if (i % 3 == 2) f << "\n";
    }
  }
  std::ofstream(dir / "c1.txt") << "zebra quartz vowel jinx: a canary nobody would write twice.";
  std::ofstream(dir / "c2.txt") << "another rare sentence, with odd words like fjord and glyph.";
  data::PrepareOptions o;
  o.inputs = {(dir / "corpus.txt").string()};
  o.out_dir = (dir / "data").string();
  o.vocab_size = 300;
  o.val_fraction = 0.1;
  o.canaries = {(dir / "c1.txt").string(), (dir / "c2.txt").string()};
  o.canary_repeats = {1, 7};
  std::ostringstream log;
  data::prepare_data(o, log);

  nlohmann::json meta;
  std::ifstream(dir / "data" / "meta.json") >> meta;
  ASSERT_EQ(meta["canaries"].size(), 2u);
  auto tok = data::Tokenizer::load((dir / "data" / "tokenizer.model").string());
  data::ShardReader train((dir / "data" / "train_000000.bin").string());
  data::ShardReader val((dir / "data" / "val_000000.bin").string());
  for (size_t c = 0; c < 2; ++c) {
    const auto& k = meta["canaries"][c];
    EXPECT_EQ(k["repeats"].get<int>(), c == 0 ? 1 : 7);
    ASSERT_EQ(k["offsets"].size(), size_t(k["repeats"].get<int>()));
    std::ifstream cf(o.canaries[c]);
    std::string text((std::istreambuf_iterator<char>(cf)), {});
    std::vector<int32_t> want = tok.encode(text);
    for (uint64_t off : k["offsets"].get<std::vector<uint64_t>>()) {
      std::vector<int32_t> got(want.size());
      train.copy(off, want.size(), got.data());
      EXPECT_EQ(got, want) << "canary " << c << " at offset " << off;
    }
    // Never in validation.
    std::vector<int32_t> v(val.num_tokens());
    val.copy(0, v.size(), v.data());
    EXPECT_EQ(std::search(v.begin(), v.end(), want.begin(), want.end()), v.end());
  }
  o.canary_repeats = {1, 2, 3};
  EXPECT_THROW(data::prepare_data(o, log), Error);
  fs::remove_all(dir);
}
