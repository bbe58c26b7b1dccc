// A checkpoint's manifest.json, as `trainer inspect` and a resume read it:
// describe_checkpoint (the manifest verified field by field, then every file
// it lists checked), then load_checkpoint and the assembly of each tensor.
// Both take a directory, so the input is written to DIR/manifest.json.
//
// The manifest seals itself with a CRC32C of its own text (manifest_checksum.h);
// a mutated input would fail that check and never reach the parser, so the
// harness recomputes the digits of a well-formed trailer first. Inputs whose
// trailer is damaged still test the check itself.
//
// DIR also holds two fixed rank files (below); the corpus's manifests list
// them with their true sizes and CRCs, so mutations of the tensor entries
// reach load_checkpoint's comparison with what the files hold.
#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checksum.h"
#include "checkpoint/safetensors.h"
#include "fuzz_files.h"

namespace {

const std::string& work_dir() { return fuzz::work_dir("manifest"); }
using fuzz::write_file;

// The step directory (its name must match the manifest's step: 1 in the
// corpus) with the rank files of a two-rank save of
//   model/w [4, 3] F32, rows 0-1 on rank 0, rows 2-3 on rank 1;
//   model/b [3] F32, whole, on rank 0;
//   optim/m/w [4, 3] F32, flat range [0, 6) on rank 0, [6, 12) on rank 1.
// tests/fuzz/corpus/manifest/ was generated against exactly these bytes:
// changing them means regenerating its sizes and CRCs.
std::string step_dir() {
  const std::string dir = work_dir() + "/step_00000001";
  ::mkdir(dir.c_str(), 0700);
  std::vector<float> v(12);
  for (int i = 0; i < 12; ++i) v[size_t(i)] = float(i);
  const std::vector<float> b = {10, 11, 12};
  using trainer::DType;
  trainer::write_safetensors_synced(dir + "/rank_00000.safetensors",
                                    {{"model/w", DType::F32, {2, 3}, v.data()},
                                     {"model/b", DType::F32, {3}, b.data()},
                                     {"optim/m/w", DType::F32, {6}, v.data()}});
  trainer::write_safetensors_synced(dir + "/rank_00001.safetensors",
                                    {{"model/w", DType::F32, {2, 3}, v.data() + 6},
                                     {"optim/m/w", DType::F32, {6}, v.data() + 6}});
  return dir;
}

// Recomputes the checksum digits when the text ends the way a sealed
// manifest does.
void reseal(std::string& text) {
  static const std::string before = "\"manifest_crc32c\": \"", after = "\"\n}\n";
  const size_t tail = before.size() + 8 + after.size();
  if (text.size() < tail || text.compare(text.size() - after.size(), after.size(), after) != 0 ||
      text.compare(text.size() - tail, before.size(), before) != 0)
    return;
  const size_t digits_at = text.size() - after.size() - 8;
  text.replace(digits_at, 8, trainer::crc32c_hex(trainer::crc32c(text.data(), digits_at)));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = step_dir();
  std::string text(reinterpret_cast<const char*>(data), size);
  reseal(text);
  write_file(dir + "/manifest.json", text.data(), text.size());
  try {
    trainer::describe_checkpoint(dir);
  } catch (const std::exception&) {
    return 0;  // std::runtime_error naming manifest.json and the field
  }
  try {
    const trainer::LoadedCheckpoint ck = trainer::load_checkpoint(dir);
    // Resume asks for every tensor the model has; here: each one whole, in
    // the dtype the manifest gives (small ones only: the harness's buffer is
    // not the reader's business).
    const trainer::SliceAssembler assembler(ck);
    std::set<std::string> done;
    for (const trainer::ShardTensor& t : ck.tensors) {
      if (!done.insert(t.name).second) continue;
      const trainer::SliceSpec whole = trainer::SliceSpec::whole(t.slice.global_shape);
      if (whole.numel() > (1 << 16)) continue;
      std::vector<char> dst(size_t(whole.numel()) * trainer::dtype_size(t.dtype));
      assembler.fill(t.name, t.dtype, whole, dst.data());
    }
  } catch (const std::exception&) {
    // A file that does not match the manifest, a tensor it does not cover.
  }
  return 0;
}
