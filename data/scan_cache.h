// Where the start-up token scan (data/token_scan.h) remembers its result:
// a small text file, valid only while every file the source reads has the
// size, mtime (nanoseconds), inode and sampled content fingerprint
// (data/content_sample.h: an in-place edit with the mtime put back) it had
// when scanned.
//
//   trainer token scan 1
//   format raw uint16
//   tokens 1048576
//   min 0
//   max 255
//   file 2097152 1732870000123456789 131 /data/web/shard_000.bin
//   sample 9f0c2a4d61e7b3a8
//
// (one `file` line per file the source reads: size, mtime_ns, inode, path;
// each followed by its `sample` fingerprint.)
//
// Locations, in order: PATH.scan next to the data file (PATH is the .bin of
// a Megatron dataset), else, when that directory cannot be written,
// $XDG_CACHE_HOME/trainer/token-scans (default ~/.cache/...) under a name
// made from the absolute path. When neither can be written nothing is
// cached, silently: the scan then simply runs again next time. Records are
// written to a temporary name and renamed, so ranks scanning the same file
// at once never read half a record.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "data/token_file.h"

namespace trainer {

struct ScanRecord {
  std::string format;
  int64_t tokens = 0;
  TokenRange range;
  std::vector<FileStamp> files;
};

// The candidate record paths of a source, best first.
std::vector<std::string> scan_cache_paths(const TokenSource& src);

// The cached record that still describes `src` (format, token count and
// every file stamp equal), and the path it came from.
std::optional<ScanRecord> load_scan_record(const TokenSource& src, std::string* from = nullptr);

// Writes the record at the first candidate path that accepts it; returns
// that path, or "" when none did (never throws).
std::string save_scan_record(const TokenSource& src, const ScanRecord& rec);

// The text of a record, and its parse (nullopt when it is not one).
std::string format_scan_record(const ScanRecord& rec);
std::optional<ScanRecord> parse_scan_record(const std::string& text);

}  // namespace trainer
