// Pieces shared by checkpoint_writer.cpp and checkpoint_reader.cpp; not part
// of the checkpoint API.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace trainer::ckpt_detail {

// Bumped whenever a reader of the previous version would misread a manifest.
constexpr int64_t kFormatVersion = 1;
constexpr const char* kFormatName = "trainer-checkpoint";
constexpr const char* kManifestName = "manifest.json";
constexpr const char* kLatestName = "latest";
constexpr const char* kPartialSuffix = ".partial";
// An older directory of the same step, moved out of the way while a new one
// replaces it.
constexpr const char* kReplacedSuffix = ".replaced";

// "step_00001000" -> 1000; nullopt for anything else (".partial" included).
std::optional<int64_t> parse_step_dir_name(std::string_view name);

// "rank_00003.safetensors"
std::string rank_file_name(int rank);

std::string shape_str(const std::vector<int64_t>& shape);

// Product of the dimensions; nullopt on a negative dimension or overflow.
std::optional<int64_t> checked_numel(const std::vector<int64_t>& shape);

struct SliceBox {
  std::vector<int64_t> offset, shape;
};

// Empty when the slices lie inside the global shape, are pairwise disjoint and
// together cover every element exactly once; otherwise what is wrong. Every
// element must be stored once so that any later layout can be assembled from
// the saved slices.
std::string check_slice_cover(const std::vector<int64_t>& global_shape, const std::vector<SliceBox>& slices);

}  // namespace trainer::ckpt_detail
