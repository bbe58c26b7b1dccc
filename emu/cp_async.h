// One thread's cp.async state: the non-bulk asynchronous global -> shared
// copies (PTX ISA, "cp.async", "cp.async.commit_group", "cp.async.wait_group /
// cp.async.wait_all"), modelled so that a kernel missing a wait reads stale
// shared memory here too instead of getting lucky:
// - a copy writes its destination only when a wait completes its group
//   ("Writes performed by cp.async operations are made visible to the
//   executing thread only after" the wait_all / the wait_group on its group);
// - commit_group batches every issued, not yet committed copy into a new
//   group, an empty one when there are none: it still counts as a group;
// - wait_group N completes every committed group except the most recent N
//   ("wait till only N or fewer of the most recent cp.async-groups are
//   pending and all the prior cp.async-groups ... are complete"); issued but
//   uncommitted copies belong to no group and are not waited for;
// - wait_all is commit_group then wait_group 0.
// The source is read when the copy lands, not when it is issued: hardware
// reads it at some unspecified point in between, and reading at the latest
// point makes a kernel that overwrites its source before waiting visibly
// wrong. Copies land in issue order.
#pragma once

#include <cstddef>
#include <deque>
#include <vector>

namespace trainer::emu {

// The cache operator (.ca: all levels, .cg: L2 only): a performance hint,
// except that .cg allows only cp-size 16.
enum class CpAsyncCache { ca, cg };

class CpAsyncQueue {
 public:
  // cp.async.{ca,cg}.shared.global [dst], [src], cp_size, src_size: cp_size
  // is 4, 8 or 16 (16 only for .cg); the first src_size bytes (0..cp_size)
  // come from src, the rest of the cp_size destination bytes become zero,
  // and src_size 0 reads nothing (src may then be null). dst and src must be
  // aligned to cp_size. Throws std::runtime_error otherwise.
  void copy(CpAsyncCache cache, void* dst, const void* src, int cp_size, int src_size);
  void copy(CpAsyncCache cache, void* dst, const void* src, int cp_size) { copy(cache, dst, src, cp_size, cp_size); }

  void commit();           // cp.async.commit_group
  void wait_group(int n);  // cp.async.wait_group n
  void wait_all();         // cp.async.wait_all

  // The thread exits: hardware still carries out its outstanding copies, so
  // every committed and uncommitted copy lands now. Returns how many did so
  // without a wait (a kernel that never waits for a copy it issued is
  // usually wrong; the caller decides whether to complain).
  size_t drain();

  size_t committed_groups() const { return groups_.size(); }  // committed, not yet completed
  size_t uncommitted_copies() const { return uncommitted_.size(); }
  // Whether [p, p + bytes) overlaps the destination of a copy that has not
  // landed: reading such bytes before the wait is a race on hardware.
  bool has_pending_write(const void* p, size_t bytes) const;

 private:
  struct Copy {
    unsigned char* dst;
    const unsigned char* src;
    int cp_size, src_size;
  };
  static void land(const Copy& copy);
  void complete_oldest_group();

  std::vector<Copy> uncommitted_;
  std::deque<std::vector<Copy>> groups_;  // oldest first
};

}  // namespace trainer::emu
