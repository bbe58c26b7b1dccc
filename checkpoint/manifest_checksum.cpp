#include "checkpoint/manifest_checksum.h"

#include <stdexcept>

#include "checkpoint/checksum.h"

namespace trainer::ckpt_detail {

namespace {

// What surrounds the digits: json::dump(v, 2) of an object whose last member
// is a string ends with `"key": "value"\n}`; the writer adds the newline.
const std::string kBefore = std::string("\"") + kManifestChecksumKey + "\": \"";
constexpr std::string_view kAfter = "\"\n}\n";
constexpr size_t kDigits = 8;

}  // namespace

std::string sealed_manifest_text(json::Value manifest) {
  if (!manifest.is_object() || manifest.contains(kManifestChecksumKey))
    throw std::logic_error("sealed_manifest_text: needs an object without \"manifest_crc32c\"");
  manifest[kManifestChecksumKey] = std::string(kDigits, '0');
  std::string text = json::dump(manifest, 2) + "\n";
  // The layout is nlohmann's pretty printer's; should it ever change, fail
  // the save here rather than write a manifest no reader accepts.
  const size_t tail = kBefore.size() + kDigits + kAfter.size();
  if (text.size() < tail || text.compare(text.size() - tail, kBefore.size(), kBefore) != 0 ||
      text.compare(text.size() - kAfter.size(), kAfter.size(), kAfter) != 0)
    throw std::logic_error("sealed_manifest_text: the JSON printer did not end the manifest with the checksum member");
  const size_t digits_at = text.size() - kAfter.size() - kDigits;
  text.replace(digits_at, kDigits, crc32c_hex(crc32c(text.data(), digits_at)));
  return text;
}

ManifestChecksum check_manifest_checksum(std::string_view text) {
  ManifestChecksum r;
  // The bare key (with its quotes) cannot occur inside a JSON string, where a
  // quote is escaped; anywhere in the text, it means the file was sealed.
  if (text.find(std::string("\"") + kManifestChecksumKey + "\"") == std::string_view::npos) {
    r.state = ManifestChecksum::State::Absent;
    return r;
  }
  r.state = ManifestChecksum::State::Broken;
  const size_t tail = kBefore.size() + kDigits + kAfter.size();
  if (text.size() < tail || text.substr(text.size() - kAfter.size()) != kAfter ||
      text.substr(text.size() - tail, kBefore.size()) != kBefore) {
    r.problem = std::string("its checksum trailer (\"") + kManifestChecksumKey +
                "\" as the last member, then the end of the file) is damaged or the file was truncated or extended";
    return r;
  }
  const size_t digits_at = text.size() - kAfter.size() - kDigits;
  r.stored = std::string(text.substr(digits_at, kDigits));
  const std::string actual = crc32c_hex(crc32c(text.data(), digits_at));
  if (actual != r.stored) {
    r.problem = std::string("manifest checksum mismatch: ") + kManifestChecksumKey + " records " + r.stored +
                ", the content has " + actual + " (damaged or edited after it was written)";
    return r;
  }
  r.state = ManifestChecksum::State::Valid;
  return r;
}

}  // namespace trainer::ckpt_detail
