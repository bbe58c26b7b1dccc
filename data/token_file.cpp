#include "data/token_file.h"

#include "data/content_sample.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "data/dataset_formats.h"

namespace trainer {

// Every layout stores little-endian integers and the readers load them as-is.
static_assert(std::endian::native == std::endian::little, "token readers assume a little-endian host");

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error(path + ": cannot open token file: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw std::runtime_error(path + ": cannot stat: " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw std::runtime_error(path + ": not a regular file");
  }
  bytes_ = uint64_t(st.st_size);
  mtime_ns_ = int64_t(st.st_mtim.tv_sec) * 1000000000 + int64_t(st.st_mtim.tv_nsec);
  inode_ = uint64_t(st.st_ino);
  if (bytes_ > 0) {
    void* p = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      throw std::runtime_error(path + ": mmap failed: " + std::strerror(e));
    }
    base_ = static_cast<const unsigned char*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
}

MappedFile::~MappedFile() {
  if (base_) ::munmap(const_cast<unsigned char*>(base_), bytes_);
}

void TokenSource::read(int64_t start, int64_t n, int64_t* out) const {
  for (int64_t i = 0; i < n; ++i) out[i] = at(start + i);
}

TokenRange TokenSource::min_max(int64_t start, int64_t n) const {
  TokenRange r;
  constexpr int64_t kChunk = 4096;
  int64_t buf[kChunk];
  for (int64_t done = 0; done < n; done += kChunk) {
    const int64_t k = std::min(kChunk, n - done);
    read(start + done, k, buf);
    for (int64_t i = 0; i < k; ++i) {
      r.min = std::min(r.min, buf[i]);
      r.max = std::max(r.max, buf[i]);
    }
  }
  return r;
}

FileStamp stamp_of(const MappedFile& f) {
  return FileStamp{f.path(), f.size(), f.mtime_ns(), f.inode(), content_sample(f.data(), f.size())};
}

namespace {

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

bool is_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

std::string megatron_prefix(const std::string& path) {
  if (ends_with(path, ".idx")) return is_file(path) ? path.substr(0, path.size() - 4) : "";
  if (ends_with(path, ".bin")) {
    const std::string prefix = path.substr(0, path.size() - 4);
    if (is_file(prefix + ".idx")) return prefix;
  }
  if (is_file(path + ".idx")) return path;
  return "";
}

std::string detect_token_format(const std::string& path) {
  if (!megatron_prefix(path).empty()) return "megatron";
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return "raw";  // the raw opener reports why it cannot be read
  int32_t magic = 0;
  const ssize_t got = ::read(fd, &magic, sizeof magic);
  ::close(fd);
  if (got == ssize_t(sizeof magic) && (magic == kLlmcMagic || magic == kLlmcMagicLlama3)) return "llmc";
  return "raw";
}

std::unique_ptr<TokenSource> open_token_source(const std::string& path, const std::string& format,
                                               const std::string& dtype) {
  std::string fmt = format.empty() ? "auto" : format;
  const bool guessed = fmt == "auto";
  if (guessed) fmt = detect_token_format(path);
  if (fmt == "megatron") return open_megatron_tokens(path);
  if (fmt == "llmc") {
    if (!guessed) return open_llmc_tokens(path);
    try {
      return open_llmc_tokens(path);
    } catch (const std::runtime_error& e) {
      // A raw uint16 file can begin with the two tokens that spell the magic.
      throw std::runtime_error(std::string(e.what()) +
                               " (data.format=auto read it as an llm.c shard because it starts with the "
                               "llm.c magic; set data.format: raw if it is a headerless token file)");
    }
  }
  if (fmt == "raw") {
    if (dtype != "uint16" && dtype != "uint32")
      throw std::runtime_error(path + ": data.dtype='" + dtype + "' is not a raw token type (uint16 | uint32)");
    return open_raw_tokens(path, dtype == "uint32" ? 4 : 2);
  }
  throw std::runtime_error(path + ": unknown data.format '" + format + "' (auto | raw | llmc | megatron)");
}

}  // namespace trainer
