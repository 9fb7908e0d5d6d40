// Crash-safe file and folder replacement for the checkpoint writers.
//
// A file is written under a temporary name beside its destination, fsync'ed, renamed over the
// destination and the directory fsync'ed, so a reader sees either the old complete file or the
// new complete file, never a prefix. Folders are built under a temporary name and renamed into
// place the same way.
//
// Not done here: locking. One process writes a given path at a time (rank 0 in a parallel run).
// Every failure throws tetrad::Error naming the path and the system error.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tetrad {

// A file being written atomically. Nothing is visible at `path` until commit(); destroying an
// uncommitted AtomicFile removes its temporary file.
// With `direct` the file is created at `path` itself (for files inside a folder that is renamed
// into place as a whole): commit() is then fsync + close, and an uncommitted file is removed.
class AtomicFile {
 public:
  // Creates `path.tmp-XXXXXX` beside the destination (or `path` itself when direct).
  explicit AtomicFile(std::string path, bool direct = false);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t size);  // all of it, or throws
  // Asks the kernel to start writing [offset, offset + size) to disk now (sync_file_range), so a
  // large file's final fsync does not have to wait for all of it; no durability promise.
  void start_writeback(int64_t offset, int64_t size);
  // fsync, close, rename over the destination, fsync the directory.
  void commit();
  const std::string& path() const { return path_; }

 private:
  std::string path_, tmp_path_;  // tmp_path_ == path_ when direct
  int fd_ = -1;
  bool direct_ = false;
};

// The whole content at once, atomically.
void write_file_atomic(const std::string& path, std::string_view content);

// Writes `content` to a new file at `path` (no temporary name) and fsyncs it: for files inside a
// folder that is itself renamed into place afterwards.
void write_file_synced(const std::string& path, std::string_view content);

// Copies a file's bytes to `dst` (created or truncated) and fsyncs it.
void copy_file_synced(const std::string& src, const std::string& dst);

// fsync of a directory, so renames and creations inside it are durable.
void fsync_dir(const std::string& dir);

// Moves the complete folder `tmp_dir` to `dir`. If `dir` exists it is replaced: atomically
// swapped where the file system supports it (renameat2 RENAME_EXCHANGE), else renamed aside
// first; the old content is then deleted. The parent directory is fsync'ed.
void replace_dir(const std::string& tmp_dir, const std::string& dir);

// An unfinished output: a folder a command builds beside its destination (output_path.hpp's
// make_temp_sibling) holds this file until it is complete, and so does an old folder being
// deleted after replace_dir swapped it out. What an interrupted command left is thereby marked.
constexpr const char* kUnfinishedMarker = ".tetrad-unfinished";
// Throws Error when `path` or a folder above it holds the marker (readers call it: an
// interrupted command's leftover is never read as a model).
void refuse_unfinished(const std::string& path);
// Deletes the marked folder `dir` with its mark last: everything else inside first, then the
// mark, then the folder. A process killed part way leaves a marked remnant (which readers
// refuse and the next run removes), never an unmarked half of an output. Errors are ignored,
// like std::filesystem::remove_all with an error_code; returns false when something remains.
bool remove_marked_dir(const std::string& dir);

// Reads a whole (small) file; throws Error naming it.
std::string read_small_file(const std::string& path);

}  // namespace tetrad
