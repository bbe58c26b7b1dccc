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
#include "checkpoint/manifest_checksum.h"
#include "checkpoint/slice_json.h"
#include "checkpoint/strict_json.h"
#include "checkpoint/safetensors.h"

namespace trainer {

namespace fs = std::filesystem;
using namespace ckpt_detail;

namespace {

struct ManifestPiece {
  int rank = 0;
  std::string file;
  SliceSpec slice;
};

struct ManifestTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> global_shape;
  std::vector<ManifestPiece> pieces;
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
  std::string checksum;  // for `inspect`: "crc32c 1a2b3c4d ok" or why there is none
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

// The optional members of later builds: who wrote the checkpoint and what
// the step policy knew of its state (absent: unknown). `field` names the
// member being read, for the caller's error.
void read_run_fields(const json::Value& root, CheckpointMeta& meta, std::string& field) {
  field = "run_identity";
  if (const json::Value* id = json::find(root, "run_identity")) {
    meta.identity.id = json::as_string(json::at(*id, "id"));
    meta.identity.model = json::as_string(json::at(*id, "model"));
    meta.identity.data = json::as_string(json::at(*id, "data"));
    for (const auto& l : json::as_array(json::at(*id, "lineage"))) meta.identity.lineage.push_back(json::as_string(l));
    if (meta.identity.id.empty()) throw json::TypeError("empty id");
  }
  field = "verdict";
  if (const json::Value* v = json::find(root, "verdict")) {
    meta.verdict = json::as_string(*v);
    if (meta.verdict != kVerdictHealthy && meta.verdict != kVerdictUnconfirmed)
      throw json::TypeError("\"" + meta.verdict + "\" is neither \"" + kVerdictHealthy + "\" nor \"" +
                            kVerdictUnconfirmed + "\"");
  }
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
  const std::string text = buf.str();
  // Before anything of the content is believed (manifest_checksum.h).
  const ManifestChecksum sum = check_manifest_checksum(text);
  if (sum.state == ManifestChecksum::State::Broken) throw corrupt(m.path, sum.problem);
  json::Value root;
  try {
    root = json::parse(text);
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
    if (m.format_version == 1)
      throw std::runtime_error(m.path + ": format_version 1 is not supported: this build reads version " +
                               std::to_string(kFormatVersion) + " (pieces as box + flat range of the real global shape); version 1 stored ZeRO "
                               "pieces flattened, without their tensor's shape, so it cannot be mapped onto one. "
                               "Resume it with the build that wrote it, or start a new run");
    if (m.format_version != kFormatVersion && m.format_version != kUnsealedFormatVersion)
      throw std::runtime_error(m.path + ": format_version " + std::to_string(m.format_version) +
                               " is not supported (this build reads version " + std::to_string(kFormatVersion) + ")");
    if (sum.state == ManifestChecksum::State::Valid) {
      m.checksum = "crc32c " + sum.stored + " ok";
    } else if (m.format_version == kUnsealedFormatVersion) {
      // Nothing can tell a version 2 manifest from a version 3 one whose
      // checksum was cut off and its version edited: a downgrade is how a
      // damaged or tampered manifest would look, so it is refused.
      throw corrupt(m.path, "format_version " + std::to_string(kUnsealedFormatVersion) +
                                " manifest without a checksum of its own: its step, tokens, optimizer step, "
                                "config and tensor names cannot be verified, and a sealed manifest edited down to "
                                "this version would look the same. Resume it once with an older build that accepts it "
                                "and let that run save (it writes sealed manifests), or start a new run");
    } else {
      throw corrupt(m.path, std::string("format_version ") + std::to_string(m.format_version) +
                                " manifests end with their checksum (\"" + kManifestChecksumKey +
                                "\"), this one has none: damaged");
    }
    field = "step";
    m.meta.step = json::as_int64(json::at(root, "step"));
    field = "tokens";
    m.meta.tokens = json::as_int64(json::at(root, "tokens"));
    field = "seed";
    m.meta.seed = json::as_uint64(json::at(root, "seed"));
    field = "optimizer_step";
    m.meta.optimizer_step = json::as_int64(json::at(root, "optimizer_step"));
    field = "data_offset";
    if (const json::Value* v = json::find(root, "data_offset")) m.meta.data_offset = json::as_int64(*v);
    field = "world_size";
    const int64_t ws = json::as_int64(json::at(root, "world_size"));
    if (ws < 1 || ws > (1 << 24)) throw json::TypeError("world_size " + std::to_string(ws) + " is out of range");
    m.meta.world_size = int(ws);
    field = "nodes";
    if (const json::Value* v = json::find(root, "nodes")) {
      const int64_t n = json::as_int64(*v);
      if (n < 1 || n > ws) throw json::TypeError("nodes " + std::to_string(n) + " is outside 1..world_size");
      m.meta.nodes = int(n);
    }
    field = "layout";
    m.meta.layout = json::as_string(json::at(root, "layout"));
    field = "config_yaml";
    m.meta.config_yaml = json::as_string(json::at(root, "config_yaml"));
    field = "created";
    m.created = json::as_string(json::at(root, "created"));
    read_run_fields(root, m.meta, field);

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
      std::vector<std::pair<std::string, SliceSpec>> cover;
      std::set<std::string> files_of_tensor;
      for (const auto& s : json::as_array(json::at(t, "pieces"))) {
        field = "tensors/" + mt.name + "/pieces/" + std::to_string(mt.pieces.size());
        ManifestPiece mp;
        const int64_t rank = json::as_int64(json::at(s, "rank"));
        if (rank < 0 || rank >= ws) throw json::TypeError("rank " + std::to_string(rank) + " outside the world size");
        mp.rank = int(rank);
        mp.file = json::as_string(json::at(s, "file"));
        if (!file_names.count(mp.file)) throw json::TypeError("file \"" + mp.file + "\" is not listed in \"files\"");
        // A rank file holds one piece per tensor name.
        if (!files_of_tensor.insert(mp.file).second) throw json::TypeError("a second piece in " + mp.file);
        mp.slice = get_slice(s, mt.global_shape);
        cover.emplace_back("the piece in " + mp.file, mp.slice);
        mt.pieces.push_back(std::move(mp));
      }
      field = "tensors/" + mt.name;
      const std::string bad = cover_error(mt.global_shape, cover);
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
// `checksum`: also read it through for the CRC (files whose pieces are not
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

// The step directories of a root (step, path), newest first; `with_manifest`:
// only those holding a manifest. Throws naming the root when it cannot be listed.
std::vector<std::pair<int64_t, std::string>> scan_step_dirs(const fs::path& root, bool with_manifest) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const auto step = parse_step_dir_name(it->path().filename().string());
    if (step && it->is_directory() && (!with_manifest || fs::exists(it->path() / kManifestName)))
      out.emplace_back(*step, it->path().string());
  }
  if (ec) throw std::runtime_error(root.string() + ": cannot list: " + ec.message());
  std::sort(out.begin(), out.end(), std::greater<>());
  return out;
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

  // Only the files that hold a wanted piece are read (and checksummed); the
  // others must still exist with their recorded size.
  std::vector<std::vector<bool>> wanted(m.tensors.size());
  std::set<std::string> needed;
  for (size_t i = 0; i < m.tensors.size(); ++i)
    for (const ManifestPiece& mp : m.tensors[i].pieces) {
      const bool w = !want || want(m.tensors[i].name, mp.slice);
      wanted[i].push_back(w);
      if (w) needed.insert(mp.file);
    }
  for (const ManifestFile& f : m.files) {
    const std::string bad = verify_file(dir, f, needed.count(f.name) > 0);
    if (!bad.empty()) throw std::runtime_error(bad);
  }

  // Read each needed file once; pieces then take their bytes from it.
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
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const ManifestTensor& mt = m.tensors[i];
    for (size_t k = 0; k < mt.pieces.size(); ++k) {
      const ManifestPiece& mp = mt.pieces[k];
      if (!needed.count(mp.file)) continue;
      const std::string path = (dir / mp.file).string();
      auto& by_name = contents[mp.file];
      auto it = by_name.find(mt.name);
      if (it == by_name.end())
        throw std::runtime_error(path + ": tensor \"" + mt.name + "\" listed by the manifest is not in the file");
      SafetensorsTensor& st = it->second;
      if (st.dtype != mt.dtype || st.shape != mp.slice.stored_shape())
        throw std::runtime_error(path + ": tensor \"" + mt.name + "\" is " + dtype_name(st.dtype) + " " +
                                 shape_text(st.shape) + ", the manifest says " + dtype_name(mt.dtype) + " " +
                                 shape_text(mp.slice.stored_shape()) + " (" + describe_slice(mp.slice) + ")");
      if (wanted[i][k]) out.tensors.push_back(ShardTensor{mt.name, mt.dtype, mp.slice, std::move(st.data)});
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
    // Every step directory, a manifest or not (one without is reported as
    // not loadable), newest first. `latest` is only the writer's last word:
    // a kill between publishing a step and replacing `latest` leaves it
    // naming the one before, and a newer complete checkpoint is never passed
    // over for it (a run that resumes from further back sets the newer ones
    // aside: set_aside_newer).
    std::vector<std::string> out;
    for (const auto& c : scan_step_dirs(root, false)) out.push_back(c.second);
    return out;
  }

  return {checkpoint_directory(mode, "checkpoint.resume")};
}

std::string checkpoint_directory(const std::string& path, const std::string& key) {
  const fs::path p = strip_trailing_slash(path);
  std::error_code ec;
  if (!fs::exists(p, ec)) throw std::runtime_error(key + ": " + p.string() + " does not exist");
  const std::string name = p.filename().string();
  if (name.size() > std::strlen(kPartialSuffix) &&
      name.compare(name.size() - std::strlen(kPartialSuffix), std::string::npos, kPartialSuffix) == 0)
    throw std::runtime_error(key + ": " + p.string() + " is an unfinished save (.partial), not a checkpoint");
  if (fs::exists(p / kManifestName, ec) || parse_step_dir_name(name)) return p.string();
  if (fs::exists(p / kLatestName, ec)) {
    const auto latest = read_latest(p);
    if (!latest)
      throw std::runtime_error(key + ": " + (p / kLatestName).string() +
                               " does not name a step directory (expected e.g. step_00001000)");
    return (p / *latest).string();
  }
  throw std::runtime_error(key + ": " + p.string() + " is neither a checkpoint directory (no " + kManifestName +
                           ") nor a checkpoint root (no `" + kLatestName + "`)");
}

std::optional<LoadedCheckpoint> resolve_resume(const std::string& root, const std::string& mode,
                                               const SliceFilter& want, const ResumeAgreement& agree,
                                               const ResumeFilter& pass_over) {
  const std::vector<std::string> candidates = resume_candidates(root, mode);
  std::string refused;  // "  DIR: why" per candidate that did not load
  for (const std::string& dir : candidates) {
    if (pass_over && mode == "auto") {
      std::string why;
      try {
        why = pass_over(read_manifest(strip_trailing_slash(dir)).meta);
      } catch (const std::exception&) {
        // A manifest that does not read is reported by the load below.
      }
      if (!why.empty()) {
        refused += "\n  " + dir + ": passed over: " + why;
        continue;
      }
    }
    std::optional<LoadedCheckpoint> ck;
    std::string error;
    try {
      ck = load_checkpoint(dir, want);
    } catch (const std::exception& e) {
      error = e.what();
    }
    const int64_t failed = agree ? agree(dir, ck.has_value()) : int64_t(!ck);
    if (failed == 0) return ck;
    const std::string why = !error.empty() ? error
                                           : dir + ": failed to load on " + std::to_string(failed) +
                                                 " other rank(s) (see their messages)";
    if (mode != "auto") throw std::runtime_error(why);
    if (!error.empty()) std::cerr << "checkpoint: skipping " << dir << ": " << error << "\n";
    refused += "\n  " + dir + ": " + why;
  }
  // Checkpoints exist but none is usable: training from step 0 over them
  // would silently discard the run, so that has to be asked for.
  if (!candidates.empty())
    throw std::runtime_error("checkpoint.resume=auto: " + std::to_string(candidates.size()) +
                             " checkpoint(s) under " + strip_trailing_slash(root).string() +
                             ", none loadable:" + refused +
                             "\nrepair or move them away, resume one by path (checkpoint.resume=DIR), or start "
                             "over from step 0 with checkpoint.resume=none");
  return std::nullopt;
}

CheckpointMeta read_checkpoint_meta(const std::string& dir) { return read_manifest(strip_trailing_slash(dir)).meta; }

std::vector<std::pair<int64_t, std::string>> step_directories(const std::string& root_str) {
  const fs::path root = strip_trailing_slash(root_str);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return {};
  return scan_step_dirs(root, true);
}

std::optional<int64_t> latest_step(const std::string& root) {
  const auto name = read_latest(strip_trailing_slash(root));
  if (!name) return std::nullopt;
  return parse_step_dir_name(*name);
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
  o << "  manifest checksum " << m.checksum << "\n";
  o << "  verdict " << (m.meta.verdict.empty() ? "(not recorded)" : m.meta.verdict) << ", run identity "
    << (m.meta.identity.known() ? m.meta.identity.id + " (model " + m.meta.identity.model + ", data " +
                                      m.meta.identity.data + ")"
                                : "(not recorded)")
    << "\n";

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

  // Columns sized to their longest entry so the table stays aligned. A
  // tensor of many pieces shows the first few; the count says how many.
  constexpr size_t kPiecesShown = 4;
  struct Row {
    std::string name, dtype, shape, count, pieces;
  };
  std::vector<Row> rows;
  int64_t elements = 0;
  for (const auto& t : m.tensors) {
    Row r{t.name, dtype_name(t.dtype), shape_text(t.global_shape), std::to_string(t.pieces.size()), ""};
    for (size_t i = 0; i < t.pieces.size() && i < kPiecesShown; ++i)
      r.pieces += (i ? "; " : "") + std::string("rank ") + std::to_string(t.pieces[i].rank) + " " +
                  describe_slice(t.pieces[i].slice);
    if (t.pieces.size() > kPiecesShown) r.pieces += "; ... (" + std::to_string(t.pieces.size() - kPiecesShown) + " more)";
    elements += SliceSpec::whole(t.global_shape).numel();
    rows.push_back(std::move(r));
  }
  size_t w0 = 4, w1 = 5, w2 = 12, w3 = 6;
  for (const auto& r : rows) {
    w0 = std::max(w0, r.name.size());
    w1 = std::max(w1, r.dtype.size());
    w2 = std::max(w2, r.shape.size());
    w3 = std::max(w3, r.count.size());
  }
  o << "tensors: " << rows.size() << " (" << elements << " elements)\n";
  o << "  " << std::left << std::setw(int(w0)) << "name" << "  " << std::setw(int(w1)) << "dtype" << "  "
    << std::setw(int(w2)) << "global shape" << "  " << std::right << std::setw(int(w3)) << "pieces"
    << "  where (rank: box [begin:end per dimension], flat range of the box)\n";
  for (const auto& r : rows)
    o << "  " << std::left << std::setw(int(w0)) << r.name << "  " << std::setw(int(w1)) << r.dtype << "  "
      << std::setw(int(w2)) << r.shape << "  " << std::right << std::setw(int(w3)) << r.count << "  " << r.pieces
      << "\n";
  o << (all_ok ? "status: every file matches the manifest\n" : "status: CORRUPT (see files above); will not load\n");
  return o.str();
}

}  // namespace trainer
