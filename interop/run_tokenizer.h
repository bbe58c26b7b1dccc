// The tokenizer a run trains with, and where `trainer generate` finds it
// again. At start-up the trainer looks next to the first training data file
// (data/tokenizer.h): a vocabulary larger than model.vocab_size is a
// ConfigError (exit 2) naming the file and both sizes, as is a
// tokenizer_info.json whose dtype differs from data.dtype. Rank 0 copies the
// files into <run dir>/tokenizer/ and writes there a tokenizer_info.json
// (the data's, or one it makes) with "data_dir": where they came from.
//
// From a checkpoint directory (its manifest's config_yaml), `trainer
// generate` looks, in order:
//   1. --tokenizer PATH (a file, or a directory holding one)
//   2. <run.dir>/tokenizer/ of the saved configuration (runs/<name> when
//      run.dir is empty, relative to where the run was started)
//   3. tokenizer/ beside the checkpoint root (a step directory's
//      ../../tokenizer: the run directory, wherever it was moved)
//   4. the directory of the first data.train file of the saved configuration
//   5. nothing: bytes for model.vocab_size 256, else token ids (a warning).
// A place that holds a tokenizer_info.json naming a missing tokenizer file is
// an error (exit 1 naming it), not a fallback: the ids would be misread.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "config/config.h"
#include "data/tokenizer.h"

namespace trainer {

// The first file of data.train's first entry ("" when there is none).
std::string first_train_file(const Config& cfg);

// The data's tokenizer, checked against the configuration (see above);
// nullopt when none sits next to the data.
std::optional<TokenizerFiles> check_data_tokenizer(const Config& cfg);

// Copies the files into <run_dir>/tokenizer/ (replacing an older copy);
// throws std::runtime_error naming the file that cannot be copied.
void record_tokenizer(const TokenizerFiles& files, const std::string& run_dir);

// The tokenizer files of a checkpoint's run: places 2-4 of the order above
// (`trainer export` takes them along); nullopt when none is there.
std::optional<TokenizerFiles> saved_tokenizer_files(const Config& saved, const std::string& checkpoint_dir);
// The tokenizer to show a checkpoint's text with (the lookup order above);
// `chosen` says where it came from.
std::unique_ptr<Tokenizer> tokenizer_for_checkpoint(const Config& saved, const std::string& checkpoint_dir,
                                                    const std::string& override_path, std::string& chosen);

// The tokenizer of a run's own data for its end-of-run sample: the files
// found at start-up, else bytes (vocabulary 256) or ids.
std::unique_ptr<Tokenizer> tokenizer_or_fallback(const std::optional<TokenizerFiles>& files, int64_t vocab_size);

}  // namespace trainer
