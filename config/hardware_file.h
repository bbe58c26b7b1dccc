// The file `trainer calibrate` writes and `hardware.calibration: PATH`
// reads: a YAML document holding one `hardware:` section (comments say
// when, where and what was measured). A run and `trainer plan` load it with
// the configuration: each hardware key the configuration itself leaves
// unset (Config::given) takes the file's value, so a key written in the
// configuration, or by --set, still wins.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"

namespace trainer {

// Fills c.hardware from c.hardware.calibration (nothing when it is "").
// Throws ConfigError naming hardware.calibration and the file when the file
// is missing or unreadable, not YAML, holds a key outside `hardware:` (or
// another calibration), none at all, or a value the key refuses (with the
// file's line).
void apply_hardware_calibration(Config& c);

// The `hardware:` section with the given keys of `c` ("hardware.gpu", ...,
// in that order) as load_config parses them back exactly, preceded by
// `comment` (each line prefixed "# "; "" for none).
std::string format_hardware_section(const Config& c, const std::vector<std::string>& keys, const std::string& comment);

}  // namespace trainer
