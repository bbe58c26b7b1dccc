// Pieces shared by checkpoint_writer.cpp and checkpoint_reader.cpp; not part
// of the checkpoint API.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace trainer::ckpt_detail {

// Bumped whenever a reader of the previous version would misread a manifest.
// 3: version 2 ending with the manifest's own checksum (manifest_checksum.h);
// 2: pieces in global terms (real N-d global shape, box, flat range); 1 saved
// a ZeRO piece flattened, without its tensor's shape.
constexpr int64_t kFormatVersion = 3;
// The version before manifests were sealed: recognised only to be refused
// with its own message (a downgrade would hide a damaged manifest).
constexpr int64_t kUnsealedFormatVersion = 2;
constexpr const char* kFormatName = "trainer-checkpoint";
constexpr const char* kManifestName = "manifest.json";
constexpr const char* kLatestName = "latest";
constexpr const char* kPartialSuffix = ".partial";
// An older directory of the same step, moved out of the way while a new one
// replaces it.
constexpr const char* kReplacedSuffix = ".replaced";
// An old checkpoint on its way out (keep_last): renamed to this first, so a
// kill while its files are deleted leaves nothing that looks like a checkpoint.
constexpr const char* kDeletingSuffix = ".deleting";
// A checkpoint of a timeline the run left (set_aside_newer): kept for the
// user, never loaded or pruned.
constexpr const char* kSupersededSuffix = ".superseded";

// "step_00001000" -> 1000; nullopt for anything else (".partial" included).
std::optional<int64_t> parse_step_dir_name(std::string_view name);

// "rank_00003.safetensors"
std::string rank_file_name(int rank);

}  // namespace trainer::ckpt_detail
