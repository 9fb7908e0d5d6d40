// `tetrad prepare`: text files -> tokenizer + token shards (data/prepare).
#include <iostream>
#include <memory>

#include "cli/command.hpp"
#include "tetrad/data/prepare.hpp"

namespace tetrad::cli {

namespace {

Runner setup(CLI::App& sub) {
  auto prep = std::make_shared<data::PrepareOptions>();
  sub.add_option("-i,--input", prep->inputs,
                 "text or JSON-lines files (*.jsonl, one document per line), or folders of "
                 "them")->required();
  sub.add_option("--text-field", prep->text_field,
                 "JSON lines: the field holding each document's text")->capture_default_str();
  sub.add_flag("--skip-bad-lines", prep->skip_bad_lines,
               "JSON lines: skip lines that are not JSON objects with the text field (counted) "
               "instead of failing on the first");
  sub.add_option("-o,--out", prep->out_dir, "output folder")->required();
  sub.add_option("--tokenizer", prep->tokenizer_model,
                 "the model's tokenizer: a tokenizer.json, a SentencePiece .model, or a model folder "
                 "holding either (default: train a SentencePiece BPE model)");
  sub.add_option("--vocab-size", prep->vocab_size, "vocabulary of the trained tokenizer")
      ->capture_default_str();
  sub.add_option("--val-fraction", prep->val_fraction, "documents held out for validation")
      ->capture_default_str();
  sub.add_option("--doc-split", prep->doc_split,
                 "auto | file | blank-line | line | kjv-chapter")->capture_default_str();
  sub.add_option("--seed", prep->seed)->capture_default_str();
  sub.add_option("--canary", prep->canaries,
                 "a document to insert into the training split (repeatable; memorization "
                 "experiments)");
  sub.add_option("--canary-repeats", prep->canary_repeats,
                 "copies of each canary: one count for all, or one per --canary")
      ->delimiter(',');
  return [prep](Context&) { data::prepare_data(*prep, std::cout); };
}

}  // namespace

const Command prepare_command{"prepare", "text files -> tokenizer + token shards", false, &setup};

}  // namespace tetrad::cli
