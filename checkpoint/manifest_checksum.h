// The checksum that protects manifest.json itself. The rank files are
// protected by the CRC32C the manifest records for each; without one of its
// own, a flipped byte in the manifest's step, tokens, optimizer_step, config
// text or tensor names would change the resumed run without any error.
//
// Format (manifest format version 3): the manifest's last member is
//
//     ,
//       "manifest_crc32c": "1a2b3c4d"
//     }
//
// and the file ends right there, with one newline. The 8 lowercase hex
// digits are the CRC32C of every byte of the file before them (the opening
// '{' up to and including the quote before the digits). Verifying needs no
// trust in the rest of the file, not even that it parses: the trailer sits
// at a fixed place, the end, and is checked before the JSON is read. A
// single damaged byte anywhere is detected: in the covered bytes the CRC
// changes (CRC32C detects every error burst up to 32 bits), in the digits
// they no longer match, after them the trailer is no longer well-formed.
#pragma once

#include <string>
#include <string_view>

#include "checkpoint/strict_json.h"

namespace trainer::ckpt_detail {

constexpr const char* kManifestChecksumKey = "manifest_crc32c";

// The text to write: `manifest` (which must not already hold the key)
// pretty-printed with the checksum member appended last.
std::string sealed_manifest_text(json::Value manifest);

struct ManifestChecksum {
  enum class State {
    Valid,   // the trailer is there and matches
    Absent,  // the key appears nowhere in the text: a manifest of format version 2
    Broken,  // the key appears but the trailer is malformed or does not match
  };
  State state = State::Absent;
  std::string stored;   // the 8 digits recorded (Valid, or a mismatch)
  std::string problem;  // Broken: what is wrong, for the error message
};

ManifestChecksum check_manifest_checksum(std::string_view text);

}  // namespace trainer::ckpt_detail
