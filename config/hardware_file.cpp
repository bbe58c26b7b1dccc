#include "config/hardware_file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <variant>

#include "config/config_schema.h"

namespace trainer {

namespace {

constexpr const char* kKey = "hardware.calibration";

[[noreturn]] void refuse(const std::string& path, const std::string& why) {
  throw ConfigError(std::string(kKey) + ": " + path + ": " + why);
}

std::string read_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (ec || !fs::exists(st))
    refuse(path, "no such file (write it with `trainer calibrate --config RUN.yaml --out " + path +
                     "`, launched like the run)");
  if (fs::is_directory(st)) refuse(path, "is a directory, not the YAML file `trainer calibrate` writes");
  // Not a device or a pipe (reading /dev/zero would never end), nor anything
  // far larger than the few kilobytes calibrate writes.
  if (!fs::is_regular_file(st)) refuse(path, "is not a regular file, as the YAML file `trainer calibrate` writes is");
  if (fs::file_size(path, ec) > (1u << 20)) refuse(path, "is over 1 MiB: not a file `trainer calibrate` wrote");
  std::ifstream in(path, std::ios::binary);
  if (!in) refuse(path, std::string("cannot open: ") + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) refuse(path, std::string("cannot read: ") + std::strerror(errno));
  return text.str();
}

}  // namespace

void apply_hardware_calibration(Config& c) {
  const std::string path = c.hardware.calibration;
  if (path.empty()) return;
  Config file;
  try {
    file = parse_config_keys(read_file(path), path);
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    if (what.rfind(kKey, 0) == 0) throw;
    throw ConfigError(std::string(kKey) + ": " + what);  // the loader's message names the file and line
  }
  if (file.given.empty()) refuse(path, "holds no hardware section (a file `trainer calibrate` wrote starts 'hardware:')");
  for (const std::string& key : file.given) {
    if (key.rfind("hardware.", 0) != 0)
      refuse(path, "holds '" + key + "': a calibration file holds the hardware section only");
    if (key == kKey) refuse(path, "names another calibration file: its numbers belong in this one");
  }
  for (const std::string& key : file.given) {
    if (c.given.count(key)) continue;  // the configuration's own value wins
    std::visit([&](auto field) { field(c) = field(file); }, find_key(key)->field);
  }
}

std::string format_hardware_section(const Config& c, const std::vector<std::string>& keys, const std::string& comment) {
  std::string out;
  std::istringstream lines(comment);
  for (std::string line; std::getline(lines, line);) out += line.empty() ? "#\n" : "# " + line + "\n";
  out += "hardware:\n";
  for (const std::string& key : keys) {
    const KeySpec* k = find_key(key);
    if (!k || key.rfind("hardware.", 0) != 0) throw std::logic_error("format_hardware_section: not a hardware key: " + key);
    out += "  " + std::string(k->leaf()) + ": " + value_yaml(*k, c) + "\n";
  }
  return out;
}

}  // namespace trainer
