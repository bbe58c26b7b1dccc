#include "observe/tensorboard.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "checkpoint/checksum.h"
#include "observe/proto_wire.h"

namespace trainer {

namespace {

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char b[256] = {0};
  if (::gethostname(b, sizeof b - 1) != 0 || b[0] == '\0') return "localhost";
  return b;
}

// Event fields (tensorflow/core/util/event.proto).
constexpr int kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5;
// Summary.value, Summary.Value.tag, Summary.Value.simple_value (summary.proto).
constexpr int kValue = 1, kTag = 1, kSimpleValue = 2;

}  // namespace

uint32_t tfrecord_masked_crc(const void* data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord_frame(const std::string& data) {
  std::string out;
  const uint64_t len = data.size();
  char hdr[8];
  std::memcpy(hdr, &len, 8);
  out.append(hdr, 8);
  const uint32_t len_crc = tfrecord_masked_crc(hdr, 8);
  out.append(reinterpret_cast<const char*>(&len_crc), 4);
  out += data;
  const uint32_t data_crc = tfrecord_masked_crc(data.data(), data.size());
  out.append(reinterpret_cast<const char*>(&data_crc), 4);
  return out;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw std::runtime_error(dir + ": cannot create the TensorBoard directory (log.tensorboard): " + ec.message());
  const double now = wall_time();
  const std::string base = dir + "/events.out.tfevents." + std::to_string(int64_t(now)) + "." + host_name();
  path_ = base;
  for (int n = 1; std::filesystem::exists(path_); ++n) path_ = base + "." + std::to_string(n);
  f_ = std::fopen(path_.c_str(), "wb");
  if (!f_) throw std::runtime_error(path_ + ": cannot open for writing (log.tensorboard): " + std::strerror(errno));
  // The first record says which event format follows.
  std::string ev;
  proto::double_field(ev, kWallTime, now);
  proto::bytes_field(ev, kFileVersion, "brain.Event:2");
  record(ev);
}

TensorBoardWriter::~TensorBoardWriter() {
  if (f_) std::fclose(f_);
}

void TensorBoardWriter::record(const std::string& event) {
  const std::string framed = tfrecord_frame(event);
  // Like metrics.jsonl, a full disk does not stop training.
  std::fwrite(framed.data(), 1, framed.size(), f_);
  std::fflush(f_);
}

void TensorBoardWriter::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  std::string summary;
  for (const auto& [tag, v] : values) {
    std::string value;
    proto::bytes_field(value, kTag, tag);
    proto::float_field(value, kSimpleValue, float(v));
    proto::bytes_field(summary, kValue, value);
  }
  std::string ev;
  proto::double_field(ev, kWallTime, wall_time());
  proto::int64_field(ev, kStep, step);
  proto::bytes_field(ev, kSummary, summary);
  record(ev);
}

}  // namespace trainer
