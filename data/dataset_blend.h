// The entries of data.train / data.valid: "PATH_OR_GLOB" or
// "WEIGHT PATH_OR_GLOB". Parsing is separate from opening so config
// validation can reject a bad weight before any file is touched.
#pragma once

#include <string>
#include <vector>

namespace trainer {

struct DataEntry {
  double weight = 1.0;  // > 0, relative to the other entries of the split
  std::string pattern;  // a path, a Megatron prefix or a glob(3) pattern
};

// key names the entry in messages ("data.train[2]"). Throws
// std::runtime_error "KEY: ..." for an empty entry, a weight that does not
// parse or is <= 0, or a weight with no path after it.
// A whole entry that names an existing file is a path even with spaces in it,
// so "my corpus/train.bin" keeps working; otherwise a first word that starts
// like a number must be a valid weight.
DataEntry parse_data_entry(const std::string& text, const std::string& key);

// The files an entry stands for, sorted (glob(3) order). A pattern with no
// glob characters is returned as is (opening it reports a missing file). For
// format auto/megatron the .bin and .idx of one Megatron dataset count once.
// Throws "KEY: 'ENTRY' matches no files" for an empty glob.
std::vector<std::string> expand_data_entry(const DataEntry& e, const std::string& text, const std::string& key,
                                           const std::string& format);

}  // namespace trainer
