#include "model/cp_traffic.h"

namespace trainer {

RingTraffic ring_traffic(const ModelDims& d) {
  const double block = double(d.B * d.T * d.Hkv * d.D) * double(dtype_size(d.act));  // one of K, V
  RingTraffic t;
  t.forward_bytes = 2 * block * double(d.cp - 1);
  t.backward_bytes = 2 * block * double(d.cp - 1) + 2 * block * double(d.cp);
  return t;
}

}  // namespace trainer
