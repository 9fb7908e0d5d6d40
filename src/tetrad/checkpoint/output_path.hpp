// Where a command may write: the rule every `tetrad` command that writes obeys.
//
// A run folder belongs to its trainer (RunLock, run_lock.hpp): readers never write inside one,
// and a command that writes somewhere never replaces what is already there unless the user said
// `--overwrite`. Commands build what they write beside its destination (a temporary sibling,
// `DEST.tmp-XXXXXX`) and publish it with one rename, so a destination holds the old complete
// content or the new complete content, never a mixture.
//
// A run folder here is a folder holding `checkpoints/`, `train.lock` or `metrics.jsonl` (what
// `tetrad train` puts there first).
//
// Every refusal throws tetrad::Error naming the destination, what is there and the way out.
#pragma once
#include <string>

namespace tetrad {

// The run folder `path` is, or is inside of (symbolic links resolved), or "" when none.
std::string enclosing_run_folder(const std::string& path);

// The checks for a reader's output (`export --out`, `report -o`): refuses a destination that is
// a run folder or inside one (even with overwrite), and an existing one unless `overwrite`. An
// empty folder counts as not there. `is_folder`: the output is a folder (export), else a file
// (report); an existing destination of the other kind is refused, and so is an existing folder
// that is not a model folder (no config.json or model.safetensors), even with overwrite.
// `command` and `flag` name the command and its option in messages.
void check_reader_output(const std::string& path, bool overwrite, bool is_folder,
                         const std::string& command, const std::string& flag);

// A new folder beside `dest` (`dest.tmp-XXXXXX`, mode 0755) to build it in, marked unfinished
// (atomic_file.hpp's kUnfinishedMarker, naming `command` and this process; readers refuse it)
// and locked (flock on the marker, held until seal_temp_sibling or the process ends). First,
// what interrupted commands left beside `dest` (marked, their lock free: the writer is gone) is
// removed, and said on stderr.
std::string make_temp_sibling(const std::string& dest, const std::string& command = "");

// In the clean-up of a command that failed while building `tmp_dir` (make_temp_sibling's) for
// `dest` (call it in a catch block): removes tmp_dir, then rethrows the error; a stop by a signal
// (core/signals.hpp's Interrupted) gets what was removed and that `dest` was not touched added to
// its message.
[[noreturn]] void abandon_temp_sibling(const std::string& tmp_dir, const std::string& dest);

// The folder is complete: its mark goes (fsync'ed) and its lock is released. Before it is
// renamed into place (publish_new_dir does it itself; call it before replace_dir).
void seal_temp_sibling(const std::string& tmp_dir);

// Moves the complete folder `tmp_dir` to `dir`, which must not exist (renameat2
// RENAME_NOREPLACE: a `dir` that appeared meanwhile is refused, never replaced), and fsyncs the
// parent folder. Seals tmp_dir first when make_temp_sibling made it.
void publish_new_dir(const std::string& tmp_dir, const std::string& dir);

}  // namespace tetrad
