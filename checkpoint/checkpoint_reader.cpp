// Loading, choosing and describing checkpoints. Nothing is trusted: the
// manifest must parse and be complete, every file it lists must have the
// recorded size and CRC32C, and every tensor must match the manifest, before a
// checkpoint is returned.
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_internal.h"
#include "checkpoint/checksum.h"
#include "checkpoint/strict_json.h"
#include "checkpoint/safetensors.h"

namespace trainer {

namespace fs = std::filesystem;
using namespace ckpt_detail;

namespace {

struct ManifestSlice {
  int rank = 0;
  std::string file;
  std::vector<int64_t> offset, shape;
};

struct ManifestTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> global_shape;
  std::vector<ManifestSlice> slices;
};

struct ManifestFile {
  std::string name;
  uint64_t bytes = 0;
  std::string crc32c;
};

struct Manifest {
  std::string path;
  int64_t format_version = 0;
  std::string created;
  CheckpointMeta meta;
  std::vector<ManifestFile> files;
  std::vector<ManifestTensor> tensors;
};

std::runtime_error corrupt(const std::string& where, const std::string& what) {
  return std::runtime_error(where + ": incomplete or corrupt checkpoint: " + what);
}

// A manifest names files relative to its directory; anything that could
// point elsewhere is refused rather than followed.
bool plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

Manifest read_manifest(const fs::path& dir) {
  Manifest m;
  const fs::path path = dir / kManifestName;
  m.path = path.string();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw std::runtime_error(dir.string() + ": not a directory");
  if (!fs::exists(path, ec)) throw corrupt(dir.string(), std::string(kManifestName) + " is missing");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw corrupt(m.path, std::string("cannot open: ") + std::strerror(errno));
  std::stringstream buf;
  buf << in.rdbuf();
  json::Value root;
  try {
    root = json::parse(buf.str());
  } catch (const json::ParseError& e) {
    throw corrupt(m.path, std::string("not valid JSON: ") + e.what());
  }
  std::string field;  // which part was being read, for the error message
  try {
    field = "format";
    if (!root.is_object() || json::as_string(json::at(root, "format")) != kFormatName)
      throw corrupt(m.path, std::string("not a checkpoint manifest (\"format\" is not \"") + kFormatName + "\")");
    field = "format_version";
    m.format_version = json::as_int64(json::at(root, "format_version"));
    if (m.format_version != kFormatVersion)
      throw std::runtime_error(m.path + ": format_version " + std::to_string(m.format_version) +
                               " is not supported (this build reads version " + std::to_string(kFormatVersion) + ")");
    field = "step";
    m.meta.step = json::as_int64(json::at(root, "step"));
    field = "tokens";
    m.meta.tokens = json::as_int64(json::at(root, "tokens"));
    field = "seed";
    m.meta.seed = json::as_uint64(json::at(root, "seed"));
    field = "optimizer_step";
    m.meta.optimizer_step = json::as_int64(json::at(root, "optimizer_step"));
    field = "world_size";
    const int64_t ws = json::as_int64(json::at(root, "world_size"));
    if (ws < 1 || ws > (1 << 24)) throw json::TypeError("world_size " + std::to_string(ws) + " is out of range");
    m.meta.world_size = int(ws);
    field = "layout";
    m.meta.layout = json::as_string(json::at(root, "layout"));
    field = "config_yaml";
    m.meta.config_yaml = json::as_string(json::at(root, "config_yaml"));
    field = "created";
    m.created = json::as_string(json::at(root, "created"));

    std::set<std::string> file_names;
    for (const auto& [name, f] : json::as_object(json::at(root, "files")).items()) {
      field = "files/" + name;
      if (!plain_file_name(name)) throw json::TypeError("not a plain file name");
      ManifestFile mf;
      mf.name = name;
      mf.bytes = json::as_uint64(json::at(f, "bytes"));
      mf.crc32c = json::as_string(json::at(f, "crc32c"));
      m.files.push_back(mf);
      file_names.insert(name);
    }
    if (m.files.empty()) throw json::TypeError("no files listed");

    std::set<std::string> tensor_names;
    for (const auto& t : json::as_array(json::at(root, "tensors"))) {
      field = "tensors";
      ManifestTensor mt;
      mt.name = json::as_string(json::at(t, "name"));
      field = "tensors/" + mt.name;
      if (!tensor_names.insert(mt.name).second) throw json::TypeError("listed twice");
      const std::string& dt = json::as_string(json::at(t, "dtype"));
      const auto dtype = dtype_from_name(dt);
      if (!dtype) throw json::TypeError("unknown dtype \"" + dt + "\"");
      mt.dtype = *dtype;
      mt.global_shape = json::as_int64_list(json::at(t, "global_shape"));
      std::vector<SliceBox> boxes;
      for (const auto& s : json::as_array(json::at(t, "slices"))) {
        ManifestSlice ms;
        const int64_t rank = json::as_int64(json::at(s, "rank"));
        if (rank < 0 || rank >= ws) throw json::TypeError("slice rank " + std::to_string(rank) + " outside the world size");
        ms.rank = int(rank);
        ms.file = json::as_string(json::at(s, "file"));
        if (!file_names.count(ms.file)) throw json::TypeError("slice file \"" + ms.file + "\" is not listed in \"files\"");
        ms.offset = json::as_int64_list(json::at(s, "offset"));
        ms.shape = json::as_int64_list(json::at(s, "shape"));
        boxes.push_back(SliceBox{ms.offset, ms.shape});
        mt.slices.push_back(std::move(ms));
      }
      const std::string bad = check_slice_cover(mt.global_shape, boxes);
      if (!bad.empty()) throw json::TypeError(bad);
      m.tensors.push_back(std::move(mt));
    }
  } catch (const json::TypeError& e) {
    throw corrupt(m.path, field + ": " + e.what());
  }
  // A copied directory may carry any name; one that looks like a step
  // directory must hold that step.
  const auto dir_step = parse_step_dir_name(dir.filename().string());
  if (dir_step && *dir_step != m.meta.step)
    throw corrupt(m.path, "records step " + std::to_string(m.meta.step) + " but the directory is " +
                              dir.filename().string());
  return m;
}

// Empty when the file matches the manifest, else what is wrong with it.
// `checksum`: also read it through for the CRC (files whose slices are not
// loaded are only checked for existence and size).
std::string verify_file(const fs::path& dir, const ManifestFile& f, bool checksum) {
  const std::string path = (dir / f.name).string();
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    return path + ": missing (the manifest lists it with " + std::to_string(f.bytes) + " bytes)";
  if (!S_ISREG(st.st_mode)) return path + ": not a regular file";
  if (uint64_t(st.st_size) != f.bytes)
    return path + ": size is " + std::to_string(uint64_t(st.st_size)) + " bytes, the manifest says " +
           std::to_string(f.bytes) + " (truncated or corrupt)";
  if (!checksum) return "";
  const std::string actual = crc32c_hex(crc32c_file(path));
  if (actual != f.crc32c)
    return path + ": CRC32C mismatch: the manifest says " + f.crc32c + ", the file has " + actual + " (corrupt)";
  return "";
}

fs::path strip_trailing_slash(const std::string& s) {
  fs::path p = fs::path(s).lexically_normal();
  if (!p.has_filename() && p.has_parent_path()) p = p.parent_path();
  return p;
}

// The step directory `latest` names, or nullopt when it is missing or does
// not look like one.
std::optional<std::string> read_latest(const fs::path& root) {
  std::ifstream in(root / kLatestName);
  if (!in) return std::nullopt;
  std::string name;
  std::getline(in, name);
  while (!name.empty() && (name.back() == '\r' || name.back() == ' ' || name.back() == '\t')) name.pop_back();
  if (!parse_step_dir_name(name)) return std::nullopt;
  return name;
}

}  // namespace

LoadedCheckpoint load_checkpoint(const std::string& dir_str, const SliceFilter& want) {
  const fs::path dir = strip_trailing_slash(dir_str);
  Manifest m = read_manifest(dir);

  // Only the files that hold a wanted slice are read (and checksummed); the
  // others must still exist with their recorded size.
  std::set<std::string> needed;
  for (const ManifestTensor& mt : m.tensors)
    for (const ManifestSlice& ms : mt.slices)
      if (!want || want(mt.name, mt.global_shape, ms.offset, ms.shape)) needed.insert(ms.file);
  for (const ManifestFile& f : m.files) {
    const std::string bad = verify_file(dir, f, needed.count(f.name) > 0);
    if (!bad.empty()) throw std::runtime_error(bad);
  }

  // Read each needed file once; slices then take their bytes from it.
  std::map<std::string, std::map<std::string, SafetensorsTensor>> contents;
  for (const ManifestFile& f : m.files) {
    if (!needed.count(f.name)) continue;
    auto& by_name = contents[f.name];
    for (auto& t : read_safetensors((dir / f.name).string())) {
      std::string name = t.name;
      by_name.emplace(std::move(name), std::move(t));
    }
  }

  LoadedCheckpoint out;
  out.dir = dir.string();
  out.meta = m.meta;
  for (const ManifestTensor& mt : m.tensors) {
    for (const ManifestSlice& ms : mt.slices) {
      if (!needed.count(ms.file)) continue;
      const std::string path = (dir / ms.file).string();
      auto& by_name = contents[ms.file];
      auto it = by_name.find(mt.name);
      if (it == by_name.end())
        throw std::runtime_error(path + ": tensor \"" + mt.name + "\" listed by the manifest is not in the file");
      SafetensorsTensor& st = it->second;
      if (st.dtype != mt.dtype || st.shape != ms.shape)
        throw std::runtime_error(path + ": tensor \"" + mt.name + "\" is " + dtype_name(st.dtype) + " " +
                                 shape_str(st.shape) + ", the manifest says " + dtype_name(mt.dtype) + " " +
                                 shape_str(ms.shape));
      const bool keep = !want || want(mt.name, mt.global_shape, ms.offset, ms.shape);
      if (keep) {
        ShardTensor t;
        t.name = mt.name;
        t.global_shape = mt.global_shape;
        t.offset = ms.offset;
        t.dtype = mt.dtype;
        t.shape = ms.shape;
        t.data = std::move(st.data);
        out.tensors.push_back(std::move(t));
      }
      by_name.erase(it);
    }
  }
  for (const auto& [file, rest] : contents)
    if (!rest.empty())
      throw std::runtime_error((dir / file).string() + ": tensor \"" + rest.begin()->first +
                               "\" is not described by the manifest");
  return out;
}

std::vector<std::string> resume_candidates(const std::string& root_str, const std::string& mode) {
  if (mode == "none" || mode.empty()) return {};

  if (mode == "auto") {
    const fs::path root = strip_trailing_slash(root_str);
    std::error_code ec;
    if (!fs::exists(root, ec)) return {};
    if (!fs::is_directory(root, ec))
      throw std::runtime_error("checkpoint.dir " + root.string() + " exists but is not a directory");
    std::vector<std::pair<int64_t, std::string>> candidates;
    for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (auto step = parse_step_dir_name(name); step && it->is_directory()) candidates.emplace_back(*step, name);
    }
    if (ec) throw std::runtime_error(root.string() + ": cannot list: " + ec.message());
    std::sort(candidates.begin(), candidates.end(), std::greater<>());
    // `latest` is the writer's last word and wins over a higher step left by
    // an earlier run that was later resumed from further back; but it is only
    // a hint: if what it names does not load, the scan continues.
    if (auto latest = read_latest(root)) {
      auto it = std::find_if(candidates.begin(), candidates.end(), [&](const auto& c) { return c.second == *latest; });
      if (it != candidates.end()) std::rotate(candidates.begin(), it, it + 1);
    }
    std::vector<std::string> out;
    for (const auto& c : candidates) out.push_back((root / c.second).string());
    return out;
  }

  const fs::path p = strip_trailing_slash(mode);
  std::error_code ec;
  if (!fs::exists(p, ec)) throw std::runtime_error("checkpoint.resume: " + p.string() + " does not exist");
  const std::string name = p.filename().string();
  if (name.size() > std::strlen(kPartialSuffix) &&
      name.compare(name.size() - std::strlen(kPartialSuffix), std::string::npos, kPartialSuffix) == 0)
    throw std::runtime_error("checkpoint.resume: " + p.string() + " is an unfinished save (.partial), not a checkpoint");
  if (fs::exists(p / kManifestName, ec) || parse_step_dir_name(name)) return {p.string()};
  if (fs::exists(p / kLatestName, ec)) {
    const auto latest = read_latest(p);
    if (!latest)
      throw std::runtime_error("checkpoint.resume: " + (p / kLatestName).string() +
                               " does not name a step directory (expected e.g. step_00001000)");
    return {(p / *latest).string()};
  }
  throw std::runtime_error("checkpoint.resume: " + p.string() + " is neither a checkpoint directory (no " +
                           kManifestName + ") nor a checkpoint root (no `" + kLatestName + "`)");
}

std::optional<LoadedCheckpoint> resolve_resume(const std::string& root, const std::string& mode,
                                               const SliceFilter& want, const ResumeAgreement& agree) {
  for (const std::string& dir : resume_candidates(root, mode)) {
    std::optional<LoadedCheckpoint> ck;
    std::string error;
    try {
      ck = load_checkpoint(dir, want);
    } catch (const std::exception& e) {
      error = e.what();
    }
    const int64_t failed = agree ? agree(dir, ck.has_value()) : int64_t(!ck);
    if (failed == 0) return ck;
    if (mode != "auto")
      throw std::runtime_error(!error.empty() ? error
                                              : dir + ": failed to load on " + std::to_string(failed) +
                                                    " other rank(s) (see their messages)");
    if (!error.empty()) std::cerr << "checkpoint: skipping " << dir << ": " << error << "\n";
  }
  return std::nullopt;
}

std::string describe_checkpoint(const std::string& dir_str) {
  const fs::path dir = strip_trailing_slash(dir_str);
  const Manifest m = read_manifest(dir);
  std::ostringstream o;
  o << "checkpoint " << dir.string() << "\n";
  o << "  step " << m.meta.step << ", tokens " << m.meta.tokens << ", optimizer step " << m.meta.optimizer_step
    << ", seed " << m.meta.seed << "\n";
  o << "  layout " << (m.meta.layout.empty() ? "(none)" : m.meta.layout) << ", world size " << m.meta.world_size
    << "\n";
  o << "  format version " << m.format_version << ", created " << m.created << ", config "
    << std::count(m.meta.config_yaml.begin(), m.meta.config_yaml.end(), '\n') << " lines\n";

  bool all_ok = true;
  o << "files:\n";
  size_t wname = 4;
  for (const auto& f : m.files) wname = std::max(wname, f.name.size());
  for (const auto& f : m.files) {
    std::string status;
    try {
      const std::string bad = verify_file(dir, f, true);
      status = bad.empty() ? "ok" : bad.substr(bad.find(": ") + 2);
    } catch (const std::exception& e) {
      status = e.what();
    }
    all_ok = all_ok && status == "ok";
    o << "  " << std::left << std::setw(int(wname)) << f.name << "  " << std::right << std::setw(14) << f.bytes
      << " bytes  crc32c " << f.crc32c << "  " << status << "\n";
  }

  // Columns sized to their longest entry so the table stays aligned.
  struct Row {
    std::string name, dtype, shape, slices;
  };
  std::vector<Row> rows;
  int64_t elements = 0;
  for (const auto& t : m.tensors) {
    Row r{t.name, dtype_name(t.dtype), shape_str(t.global_shape), ""};
    for (size_t i = 0; i < t.slices.size(); ++i) {
      const auto& s = t.slices[i];
      r.slices += (i ? "; " : "") + std::string("rank ") + std::to_string(s.rank) + " " + shape_str(s.shape) + " @ " +
                  shape_str(s.offset);
    }
    elements += checked_numel(t.global_shape).value_or(0);
    rows.push_back(std::move(r));
  }
  size_t w0 = 4, w1 = 5, w2 = 12;
  for (const auto& r : rows) {
    w0 = std::max(w0, r.name.size());
    w1 = std::max(w1, r.dtype.size());
    w2 = std::max(w2, r.shape.size());
  }
  o << "tensors: " << rows.size() << " (" << elements << " elements)\n";
  o << "  " << std::left << std::setw(int(w0)) << "name" << "  " << std::setw(int(w1)) << "dtype" << "  "
    << std::setw(int(w2)) << "global shape" << "  slices (rank shape @ offset)\n";
  for (const auto& r : rows)
    o << "  " << std::left << std::setw(int(w0)) << r.name << "  " << std::setw(int(w1)) << r.dtype << "  "
      << std::setw(int(w2)) << r.shape << "  " << r.slices << "\n";
  o << (all_ok ? "status: every file matches the manifest\n" : "status: CORRUPT (see files above); will not load\n");
  return o.str();
}

int64_t copy_overlap(const ShardTensor& src, const std::vector<int64_t>& dst_offset,
                     const std::vector<int64_t>& dst_shape, void* dst) {
  const size_t nd = src.global_shape.size();
  if (src.offset.size() != nd || src.shape.size() != nd || dst_offset.size() != nd || dst_shape.size() != nd)
    throw std::invalid_argument("copy_overlap: " + src.name + ": source offset/shape and destination offset/shape " +
                                "must all have " + std::to_string(nd) + " dimensions");
  const size_t esize = dtype_size(src.dtype);
  const auto src_numel = checked_numel(src.shape);
  if (!src_numel || src.data.size() != uint64_t(*src_numel) * esize)
    throw std::invalid_argument("copy_overlap: " + src.name + ": data holds " + std::to_string(src.data.size()) +
                                " bytes, shape " + shape_str(src.shape) + " needs " +
                                std::to_string(src_numel.value_or(-1) * int64_t(esize)));

  // The overlap box in global coordinates.
  std::vector<int64_t> lo(nd), len(nd);
  int64_t count = 1;
  for (size_t d = 0; d < nd; ++d) {
    lo[d] = std::max(src.offset[d], dst_offset[d]);
    const int64_t hi = std::min(src.offset[d] + src.shape[d], dst_offset[d] + dst_shape[d]);
    if (hi <= lo[d]) return 0;
    len[d] = hi - lo[d];
    count *= len[d];
  }

  // Row-major element strides of both boxes.
  std::vector<int64_t> sstride(nd, 1), dstride(nd, 1);
  for (size_t d = nd; d-- > 1;) {
    sstride[d - 1] = sstride[d] * src.shape[d];
    dstride[d - 1] = dstride[d] * dst_shape[d];
  }
  // The innermost dimension is contiguous in both: copy it as one run and
  // walk the outer dimensions like an odometer.
  const size_t run = nd ? size_t(len[nd - 1]) * esize : esize;
  const size_t outer_dims = nd ? nd - 1 : 0;
  std::vector<int64_t> idx(outer_dims, 0);
  const char* s = src.data.data();
  char* d_ptr = static_cast<char*>(dst);
  while (true) {
    int64_t so = 0, doff = 0;
    for (size_t d = 0; d < nd; ++d) {
      const int64_t g = lo[d] + (d < outer_dims ? idx[d] : 0);
      so += (g - src.offset[d]) * sstride[d];
      doff += (g - dst_offset[d]) * dstride[d];
    }
    std::memcpy(d_ptr + doff * int64_t(esize), s + so * int64_t(esize), run);
    size_t k = outer_dims;
    while (k > 0) {
      --k;
      if (++idx[k] < len[k]) break;
      idx[k] = 0;
      if (k == 0) return count;
    }
    if (outer_dims == 0) return count;
  }
}

}  // namespace trainer
