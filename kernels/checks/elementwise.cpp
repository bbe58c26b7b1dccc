// Shared checks of the elementwise and memory ops (kernels/op_list.h).
#include <string>

#include "kernels/checks/check_util.h"
#include "kernels/checks/op_checks.h"

namespace trainer::op_checks {

using namespace checks;

void fill(Tensor t, float) { need_float("fill", "t", t); }

// Bytes of any dtype, ids included.
void copy(Tensor dst, Tensor src) {
  present("copy", "dst", dst);
  present("copy", "src", src);
  if (dst.dtype != src.dtype)
    fail("copy", std::string("dst ") + dtype_name(dst.dtype) + " vs src " + dtype_name(src.dtype));
  same_numel("copy", "dst", dst, "src", src);
}

void add(Tensor out, Tensor a, Tensor b) {
  need_float("add", "out", out);
  need_float("add", "a", a);
  need_float("add", "b", b);
  same_numel("add", "out", out, "a", a);
  same_numel("add", "a", a, "b", b);
}

void add_inplace(Tensor acc, Tensor x) {
  need_float("add_inplace", "acc", acc);
  need_float("add_inplace", "x", x);
  same_numel("add_inplace", "acc", acc, "x", x);
}

void scale_inplace(Tensor t, float) { need_float("scale_inplace", "t", t); }

void convert(Tensor dst, Tensor src) {
  need_float("convert", "dst", dst);
  need_float("convert", "src", src);
  same_numel("convert", "dst", dst, "src", src);
}

}  // namespace trainer::op_checks
