#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <unordered_set>

#include "checkpoint/checksum.h"
#include "checkpoint/strict_json.h"

namespace trainer {

namespace {

// The header must fit in memory and be parsed before any check against the
// data can run; the reference implementation refuses more than 100 MB too.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// numel * element size, or nullopt when it overflows (a corrupt shape must
// not wrap around into a plausible size).
std::optional<uint64_t> checked_nbytes(const std::vector<int64_t>& shape, size_t esize) {
  uint64_t n = esize;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d != 0 && n > UINT64_MAX / uint64_t(d)) return std::nullopt;
    n *= uint64_t(d);
  }
  return n;
}

// Compact JSON padded with spaces so the data starts 8-byte aligned (the
// format allows trailing whitespace in the header).
std::string build_header(const std::vector<SafetensorsView>& tensors, const SafetensorsMetadata& metadata = {}) {
  json::Value header = json::Value::object();
  if (!metadata.empty()) {
    json::Value m = json::Value::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  std::unordered_set<std::string> names;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    auto nbytes = checked_nbytes(t.shape, dtype_size(t.dtype));
    if (!nbytes) throw std::logic_error("safetensors: tensor " + t.name + " has an invalid shape " + shape_text(t.shape));
    json::Value entry = json::Value::object();
    entry["dtype"] = dtype_name(t.dtype);
    entry["shape"] = json::int_array(t.shape);
    entry["data_offsets"] = json::Value::array({offset, offset + *nbytes});
    if (!names.insert(t.name).second) throw std::logic_error("safetensors: tensor name " + t.name + " appears twice");
    header[t.name] = std::move(entry);
    offset += *nbytes;
  }
  std::string text = json::dump(header);
  while ((text.size() + 8) % 8 != 0) text += ' ';
  return text;
}

std::string length_prefix(uint64_t n) {
  std::string len(8, '\0');
  for (int i = 0; i < 8; ++i) len[size_t(i)] = char((n >> (8 * i)) & 0xFF);
  return len;
}

std::vector<SafetensorsView> views_of(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::vector<SafetensorsView> views;
  for (const auto& [name, t] : tensors) {
    if (t.device != Device::CPU) throw std::logic_error("write_safetensors: " + name + " is not on the host");
    views.push_back({name, t.dtype, std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.ndim), t.data});
  }
  return views;
}

bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    // Linux caps one write at about 2 GiB; loop for larger tensors.
    const ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t(1) << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= size_t(w);
  }
  return true;
}

}  // namespace

std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::U16, DType::U32, DType::F64})
    if (name == dtype_name(t)) return t;
  return std::nullopt;
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors) {
  const auto views = views_of(tensors);
  const std::string header = build_header(views);

  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw std::runtime_error(tmp + ": cannot write: " + std::strerror(errno));
  const std::string len = length_prefix(header.size());
  bool ok = std::fwrite(len.data(), 1, 8, f) == 8 &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size();
  for (const auto& [name, t] : tensors)
    ok = ok && std::fwrite(t.data, 1, t.nbytes(), f) == t.nbytes();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw std::runtime_error(path + ": write failed: " + std::strerror(err));
  }
}

WrittenFile write_safetensors_synced(const std::string& path, const std::vector<SafetensorsView>& tensors,
                                     const SafetensorsMetadata& metadata) {
  const std::string header = build_header(tensors, metadata);
  const std::string len = length_prefix(header.size());
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(path + ": cannot create: " + std::strerror(errno));
  WrittenFile out;
  bool ok = write_all(fd, len.data(), len.size()) && write_all(fd, header.data(), header.size());
  out.crc32c = crc32c(len.data(), len.size());
  out.crc32c = crc32c(header.data(), header.size(), out.crc32c);
  out.bytes = len.size() + header.size();
  for (const auto& t : tensors) {
    if (!ok) break;
    const size_t n = size_t(*checked_nbytes(t.shape, dtype_size(t.dtype)));
    ok = write_all(fd, t.data, n);
    out.crc32c = crc32c(t.data, n, out.crc32c);
    out.bytes += n;
  }
  ok = ok && ::fsync(fd) == 0;
  const int err = errno;
  if (::close(fd) != 0 && ok) throw std::runtime_error(path + ": write failed: " + std::strerror(errno));
  if (!ok) throw std::runtime_error(path + ": write failed: " + std::strerror(err));
  return out;
}

std::vector<SafetensorsTensor> read_safetensors(const std::string& path) {
  const auto fail = [&](const std::string& what) -> std::runtime_error {
    return std::runtime_error(path + ": " + what);
  };
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw fail(std::string("cannot open: ") + std::strerror(errno));
  std::unique_ptr<FILE, int (*)(FILE*)> closer(f, &std::fclose);
  struct stat st;
  if (::fstat(::fileno(f), &st) != 0) throw fail(std::string("cannot stat: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw fail("not a regular file");
  const uint64_t file_size = uint64_t(st.st_size);
  if (file_size < 8)
    throw fail("file is " + std::to_string(file_size) +
               " bytes, too short to hold the 8-byte header length (truncated or not a safetensors file)");

  unsigned char len[8];
  if (std::fread(len, 1, 8, f) != 8) throw fail("cannot read the header length");
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= uint64_t(len[i]) << (8 * i);
  if (header_len > file_size - 8)
    throw fail("header length " + std::to_string(header_len) + " exceeds the " + std::to_string(file_size - 8) +
               " bytes after the length field (truncated or not a safetensors file)");
  if (header_len > kMaxHeaderBytes)
    throw fail("header length " + std::to_string(header_len) + " is implausibly large (limit " +
               std::to_string(kMaxHeaderBytes) + ")");
  if (header_len < 2) throw fail("header length " + std::to_string(header_len) + " is too small for a JSON object");

  std::string header_text(size_t(header_len), '\0');
  if (std::fread(header_text.data(), 1, header_text.size(), f) != header_text.size())
    throw fail("cannot read the " + std::to_string(header_len) + "-byte header");
  json::Value header;
  try {
    header = json::parse(header_text);
  } catch (const json::ParseError& e) {
    throw fail("header is not valid JSON: " + e.reason() +
               (e.offset() ? " at byte " + std::to_string(8 + *e.offset()) + " of the file" : std::string()));
  }
  if (!header.is_object()) throw fail("header is a JSON " + std::string(header.type_name()) + ", not an object");

  const uint64_t data_size = file_size - 8 - header_len;
  struct Entry {
    SafetensorsTensor t;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) throw fail("\"__metadata__\" is not an object");
      continue;
    }
    const std::string where = "tensor \"" + name + "\": ";
    if (!v.is_object()) throw fail(where + "entry is not an object");
    for (const auto& [key, _] : v.items())
      if (key != "dtype" && key != "shape" && key != "data_offsets") throw fail(where + "unexpected key \"" + key + "\"");
    Entry e;
    e.t.name = name;
    try {
      const std::string& dt = json::as_string(json::at(v, "dtype"));
      auto dtype = dtype_from_name(dt);
      if (!dtype) throw fail(where + "unknown dtype \"" + dt + "\" (known: F32, BF16, F16, I32, U16, U32, F64)");
      e.t.dtype = *dtype;
      for (const auto& d : json::as_array(json::at(v, "shape"))) {
        const int64_t n = json::as_int64(d);
        if (n < 0) throw fail(where + "negative dimension " + std::to_string(n) + " in shape");
        e.t.shape.push_back(n);
      }
      const auto& offs = json::as_array(json::at(v, "data_offsets"));
      if (offs.size() != 2) throw fail(where + "data_offsets must hold 2 numbers, has " + std::to_string(offs.size()));
      e.begin = json::as_uint64(offs[0]);
      e.end = json::as_uint64(offs[1]);
    } catch (const json::TypeError& te) {
      throw fail(where + te.what());
    }
    if (e.begin > e.end)
      throw fail(where + "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "] run backwards");
    if (e.end > data_size)
      throw fail(where + "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                 "] run past the end of the data (" + std::to_string(data_size) + " bytes; truncated file?)");
    const auto need = checked_nbytes(e.t.shape, dtype_size(e.t.dtype));
    if (!need) throw fail(where + "shape " + shape_text(e.t.shape) + " overflows");
    if (e.end - e.begin != *need)
      throw fail(where + "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "] hold " +
                 std::to_string(e.end - e.begin) + " bytes but shape " + shape_text(e.t.shape) + " of " +
                 dtype_name(e.t.dtype) + " needs " + std::to_string(*need));
    entries.push_back(std::move(e));
  }

  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expect = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    if (e.begin < expect)
      throw fail("tensor \"" + e.t.name + "\" overlaps tensor \"" + entries[i - 1].t.name + "\" (starts at " +
                 std::to_string(e.begin) + ", previous ends at " + std::to_string(expect) + ")");
    if (e.begin > expect)
      throw fail("gap of " + std::to_string(e.begin - expect) + " bytes before tensor \"" + e.t.name + "\" at data offset " +
                 std::to_string(expect));
    expect = e.end;
  }
  if (expect != data_size)
    throw fail(std::to_string(data_size - expect) + " bytes after the last tensor are not described by the header");

  std::vector<SafetensorsTensor> out;
  out.reserve(entries.size());
  for (Entry& e : entries) {
    e.t.data.resize(size_t(e.end - e.begin));
    if (!e.t.data.empty() && std::fread(e.t.data.data(), 1, e.t.data.size(), f) != e.t.data.size())
      throw fail("cannot read the data of tensor \"" + e.t.name + "\"" +
                 (std::ferror(f) ? std::string(": ") + std::strerror(errno) : std::string(" (file shrank?)")));
    out.push_back(std::move(e.t));
  }
  return out;
}

}  // namespace trainer
