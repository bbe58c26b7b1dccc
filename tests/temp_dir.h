// A directory for one test, named after the test and the process, removed
// with everything in it at the end of the scope.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

namespace trainer::test {

struct TempDir {
  std::filesystem::path path;
  // prefix: the test file's ("data", "scan"); name: the case's.
  TempDir(const std::string& prefix, const std::string& name) {
    path = std::filesystem::temp_directory_path() / ("trainer_" + prefix + "_" + name + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string operator/(const std::string& f) const { return (path / f).string(); }
};

}  // namespace trainer::test
