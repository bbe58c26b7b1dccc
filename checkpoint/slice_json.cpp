#include "checkpoint/slice_json.h"

namespace trainer::ckpt_detail {

void put_slice(json::Value& object, const SliceSpec& s) {
  object["box_offset"] = json::int_array(s.box_offset);
  object["box_shape"] = json::int_array(s.box_shape);
  if (s.flat) object["flat_range"] = json::Value::array({s.flat->begin, s.flat->end});
}

SliceSpec get_slice(const json::Value& object, const std::vector<int64_t>& global_shape) {
  SliceSpec s = SliceSpec::box(global_shape, json::as_int64_list(json::at(object, "box_offset")),
                               json::as_int64_list(json::at(object, "box_shape")));
  if (const json::Value* f = json::find(object, "flat_range")) {
    const std::vector<int64_t> r = json::as_int64_list(*f);
    if (r.size() != 2) throw json::TypeError("flat_range must hold 2 numbers, has " + std::to_string(r.size()));
    s.flat = FlatRange{r[0], r[1]};
  }
  if (std::string bad = slice_error(s); !bad.empty()) throw json::TypeError(bad);
  return s;
}

}  // namespace trainer::ckpt_detail
