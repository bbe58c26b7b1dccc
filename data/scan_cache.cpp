#include "data/scan_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/fnv1a.h"

namespace trainer {

namespace fs = std::filesystem;

namespace {

constexpr const char* kHeader = "trainer token scan 1";
// A record is a few lines; anything bigger at that path is not ours.
constexpr std::uintmax_t kMaxRecordBytes = 1 << 16;

// The path is left out: the record was found through it already, and the
// same file named from another working directory is still the same file.
bool same(const FileStamp& a, const FileStamp& b) {
  return a.size == b.size && a.mtime_ns == b.mtime_ns && a.inode == b.inode && a.sample == b.sample;
}

template <class T>
bool parse_num(const std::string& s, T* v) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
  return !s.empty() && ec == std::errc() && p == s.data() + s.size();
}

// The per-user cache directory, or "" when neither XDG_CACHE_HOME nor HOME
// is set.
std::string cache_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && *xdg) return std::string(xdg) + "/trainer/token-scans";
  const char* home = std::getenv("HOME");
  if (home && *home) return std::string(home) + "/.cache/trainer/token-scans";
  return "";
}


bool write_atomically(const std::string& path, const std::string& text) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return false;
    f << text;
    f.flush();
    if (!f) {
      std::error_code ec;
      fs::remove(tmp, ec);
      return false;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::error_code ec;
    fs::remove(tmp, ec);
    return false;
  }
  return true;
}

}  // namespace

std::string format_scan_record(const ScanRecord& rec) {
  std::ostringstream os;
  os << kHeader << "\n"
     << "format " << rec.format << "\n"
     << "tokens " << rec.tokens << "\n"
     << "min " << rec.range.min << "\n"
     << "max " << rec.range.max << "\n";
  for (const FileStamp& f : rec.files)
    os << "file " << f.size << " " << f.mtime_ns << " " << f.inode << " " << f.path << "\n"
       << "sample " << hex64(f.sample) << "\n";
  return os.str();
}

std::optional<ScanRecord> parse_scan_record(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != kHeader) return std::nullopt;
  ScanRecord r;
  bool has_format = false, has_tokens = false, has_min = false, has_max = false;
  std::vector<bool> has_sample;
  while (std::getline(in, line)) {
    const size_t sp = line.find(' ');
    if (sp == std::string::npos) return std::nullopt;
    const std::string key = line.substr(0, sp), rest = line.substr(sp + 1);
    if (key == "format") {
      r.format = rest;
      has_format = true;
    } else if (key == "tokens") {
      has_tokens = parse_num(rest, &r.tokens);
    } else if (key == "min") {
      has_min = parse_num(rest, &r.range.min);
    } else if (key == "max") {
      has_max = parse_num(rest, &r.range.max);
    } else if (key == "file") {
      // size mtime_ns inode path (the path may hold spaces: it is the rest)
      FileStamp f;
      size_t a = rest.find(' '), b = a == std::string::npos ? a : rest.find(' ', a + 1);
      size_t c = b == std::string::npos ? b : rest.find(' ', b + 1);
      if (c == std::string::npos || !parse_num(rest.substr(0, a), &f.size) ||
          !parse_num(rest.substr(a + 1, b - a - 1), &f.mtime_ns) || !parse_num(rest.substr(b + 1, c - b - 1), &f.inode))
        return std::nullopt;
      f.path = rest.substr(c + 1);
      r.files.push_back(std::move(f));
      has_sample.push_back(false);
    } else if (key == "sample") {
      // The fingerprint of the file line before it (a record without one,
      // written before fingerprints, is not trusted).
      if (r.files.empty() || has_sample.back() || rest.size() != 16) return std::nullopt;
      char* end = nullptr;
      r.files.back().sample = std::strtoull(rest.c_str(), &end, 16);
      if (end != rest.c_str() + rest.size()) return std::nullopt;
      has_sample.back() = true;
    } else {
      return std::nullopt;
    }
  }
  if (!has_format || !has_tokens || !has_min || !has_max || r.files.empty()) return std::nullopt;
  for (bool b : has_sample)
    if (!b) return std::nullopt;
  return r;
}

std::vector<std::string> scan_cache_paths(const TokenSource& src) {
  if (src.stamps().empty()) return {};
  std::vector<std::string> out{src.data_path() + ".scan"};
  const std::string dir = cache_dir();
  if (!dir.empty()) {
    std::error_code ec;
    const fs::path abs = fs::absolute(src.data_path(), ec);
    const std::string key = ec ? src.data_path() : abs.lexically_normal().string();
    out.push_back(dir + "/" + fs::path(src.data_path()).filename().string() + "-" + hex64(fnv1a(key)) + ".scan");
  }
  return out;
}

std::optional<ScanRecord> load_scan_record(const TokenSource& src, std::string* from) {
  const std::vector<FileStamp> now = src.stamps();
  for (const std::string& p : scan_cache_paths(src)) {
    std::error_code ec;
    const auto bytes = fs::file_size(p, ec);
    if (ec || bytes > kMaxRecordBytes) continue;
    std::ifstream f(p, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    auto rec = parse_scan_record(text);
    if (!rec || rec->format != src.format() || rec->tokens != src.size() || rec->files.size() != now.size()) continue;
    bool match = true;
    for (size_t i = 0; i < now.size(); ++i) match = match && same(rec->files[i], now[i]);
    if (!match) continue;  // the data changed since: scan again
    if (from) *from = p;
    return rec;
  }
  return std::nullopt;
}

std::string save_scan_record(const TokenSource& src, const ScanRecord& rec) {
  const std::string text = format_scan_record(rec);
  const std::vector<std::string> paths = scan_cache_paths(src);
  for (size_t i = 0; i < paths.size(); ++i) {
    if (i > 0) {  // the cache directory may not exist yet
      std::error_code ec;
      fs::create_directories(fs::path(paths[i]).parent_path(), ec);
      if (ec) continue;
    }
    if (write_atomically(paths[i], text)) return paths[i];
  }
  return "";
}

}  // namespace trainer
