// The collective this process issued last. When a collective never returns
// (NCCL waits on the device, not inside the call), the watchdog's message
// names it from here.
#pragma once

#include <string>

namespace trainer {

// Called by the communicators as each collective starts; a mutex and a
// string copy, cheap next to any collective.
void note_collective(const char* op, const std::string& group);
// "reduce_scatter on group dp (ranks 0,1,2,3), issued 12.3 s ago"; "" when
// none was issued yet.
std::string last_collective();

}  // namespace trainer
