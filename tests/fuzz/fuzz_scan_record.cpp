// The token scan's cache record (FILE.scan beside the data, or under
// $XDG_CACHE_HOME): parse_scan_record reads the text load_scan_record found.
// A record it accepts must print back to one that parses the same, since the
// trainer rewrites records with format_scan_record.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "data/scan_cache.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const auto rec = trainer::parse_scan_record(text);
  if (!rec) return 0;
  const auto again = trainer::parse_scan_record(trainer::format_scan_record(*rec));
  if (!again || again->format != rec->format || again->tokens != rec->tokens || again->range.min != rec->range.min ||
      again->range.max != rec->range.max || again->files.size() != rec->files.size())
    std::abort();
  return 0;
}
