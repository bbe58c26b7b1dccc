// TensorBoard event files (log.tensorboard: true): the scalars of every
// logged step in <run dir>/tensorboard/events.out.tfevents.<time>.<host>,
// which `tensorboard --logdir runs/` reads while the run goes on.
//
// The file is a sequence of TFRecords, each
//   uint64 length, uint32 masked CRC32C of those 8 bytes,
//   length bytes of data, uint32 masked CRC32C of the data
// (masked: ((crc >> 15) | (crc << 17)) + 0xa282ead8, little-endian), and each
// record's data a serialized tensorflow.Event:
//   1 wall_time (double, seconds since the epoch), 2 step (int64),
//   3 file_version (string; the first record only, "brain.Event:2"),
//   5 summary: Summary { repeated Value value = 1 }, Value { 1 tag (string),
//     2 simple_value (float) }.
// One event per step carries all of that step's scalars. Only rank 0
// writes (the caller decides; see observe/metrics.h).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace trainer {

class TensorBoardWriter {
 public:
  // Creates `dir` and a new event file in it (never overwrites one: a
  // second file in the same second gets a numbered suffix). Throws
  // std::runtime_error naming the path when either cannot be created.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One event: these (tag, value) scalars at `step`; flushed, so that
  // TensorBoard sees it at once and a crash loses nothing written.
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);

  const std::string& path() const { return path_; }

 private:
  void record(const std::string& event);
  std::string path_;
  FILE* f_ = nullptr;
};

// The masked CRC32C of TFRecord framing.
uint32_t tfrecord_masked_crc(const void* data, size_t n);

// The framing of one record around `data`.
std::string tfrecord_frame(const std::string& data);

}  // namespace trainer
