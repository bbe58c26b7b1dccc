// Checkpoints across parallel layouts. Pieces are N-d boxes of global
// tensors (tensor-parallel row or column blocks, expert ranges, whole tensors
// held by one pipeline stage), optionally ZeRO-sharded into flat ranges of
// the box. Synthetic layouts are saved through the multi-rank writer (one
// thread per rank, a real store) and read back whole and as every other
// layout, against a reference that works element by element.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "comm/store.h"

using namespace trainer;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() / ("ckpt_layouts_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& s) const { return (path / s).string(); }
};

// ---- the reference: one element at a time ----------------------------------

// Global row-major indices of a slice's elements, in the order of its data.
std::vector<int64_t> global_indices(const SliceSpec& s) {
  const size_t nd = s.global_shape.size();
  std::vector<int64_t> out, idx(nd, 0);
  const int64_t n = s.box_numel();
  for (int64_t k = 0; k < n; ++k) {
    int64_t rem = k;
    for (size_t d = nd; d-- > 0;) {
      idx[d] = rem % s.box_shape[d];
      rem /= s.box_shape[d];
    }
    if (s.flat && (k < s.flat->begin || k >= s.flat->end)) continue;
    int64_t g = 0;
    for (size_t d = 0; d < nd; ++d) g = g * s.global_shape[d] + s.box_offset[d] + idx[d];
    out.push_back(g);
  }
  return out;
}

std::vector<char> extract(const std::vector<char>& global, size_t es, const SliceSpec& s) {
  std::vector<char> out;
  for (int64_t g : global_indices(s)) out.insert(out.end(), global.begin() + g * int64_t(es), global.begin() + (g + 1) * int64_t(es));
  return out;
}

bool naive_overlap(const SliceSpec& a, const SliceSpec& b) {
  const auto ia = global_indices(a);
  const std::set<int64_t> sa(ia.begin(), ia.end());
  for (int64_t g : global_indices(b))
    if (sa.count(g)) return true;
  return false;
}

std::vector<char> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<char> v(n);
  for (auto& c : v) c = char(rng() & 0xFF);
  return v;
}

// ---- the synthetic model and its layouts ------------------------------------

struct Global {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<char> bytes;
};

const std::vector<Global>& tensors() {
  static const std::vector<Global> t = [] {
    std::vector<Global> g = {
        {"layers.0.attn.wq", DType::F32, {8, 6}, {}},   // column-parallel: blocks of rows
        {"layers.0.attn.wo", DType::BF16, {8, 6}, {}},  // row-parallel: blocks of columns
        {"layers.1.moe.w1", DType::F32, {4, 3, 5}, {}}, // stacked experts: ranges of dim 0
        {"layers.1.norm", DType::F32, {7}, {}},         // replicated: saved by one rank
    };
    for (size_t i = 0; i < g.size(); ++i)
      g[i].bytes = random_bytes(size_t(SliceSpec::whole(g[i].shape).numel()) * dtype_size(g[i].dtype), 1000 + i);
    return g;
  }();
  return t;
}

enum : size_t { kWq, kWo, kW1, kNorm };

struct Piece {
  int rank;
  size_t tensor;
  SliceSpec slice;
};

struct Layout {
  std::string name;
  int world;
  std::vector<Piece> pieces;
};

// k near-equal blocks of dimension `dim` (the first ones one larger).
std::vector<SliceSpec> blocks(const std::vector<int64_t>& shape, size_t dim, int k) {
  std::vector<SliceSpec> out;
  int64_t at = 0;
  for (int i = 0; i < k; ++i) {
    const int64_t len = shape[dim] / k + (i < shape[dim] % k ? 1 : 0);
    std::vector<int64_t> off(shape.size(), 0), ext = shape;
    off[dim] = at;
    ext[dim] = len;
    out.push_back(SliceSpec::box(shape, off, ext));
    at += len;
  }
  return out;
}

const std::vector<int64_t>& shape_of(size_t t) { return tensors()[t].shape; }

// Every piece of `base` cut into m flat ranges of its box (uneven, some
// possibly empty), held by m data-parallel ranks: rank r of the base
// becomes ranks r, r + world, r + 2 world, ...
Layout zero(const Layout& base, int m) {
  Layout z{base.name + "+zero" + std::to_string(m), base.world * m, {}};
  for (const Piece& p : base.pieces) {
    const int64_t n = p.slice.box_numel();
    for (int j = 0; j < m; ++j) {
      const int64_t b = n * j * (j + 1) / (m * (m + 1)), e = n * (j + 1) * (j + 2) / (m * (m + 1));
      z.pieces.push_back(Piece{p.rank + j * base.world, p.tensor, p.slice.flat_range(b, e)});
    }
  }
  return z;
}

std::vector<Layout> layouts() {
  std::vector<Layout> base;
  {  // one rank holds everything, the other nothing
    Layout l{"whole", 2, {}};
    for (size_t t = 0; t < tensors().size(); ++t) l.pieces.push_back({0, t, SliceSpec::whole(shape_of(t))});
    base.push_back(l);
  }
  {  // tensor parallel 2; experts split 2 ways
    Layout l{"tp2", 2, {}};
    for (int r = 0; r < 2; ++r) {
      l.pieces.push_back({r, kWq, blocks(shape_of(kWq), 0, 2)[size_t(r)]});
      l.pieces.push_back({r, kWo, blocks(shape_of(kWo), 1, 2)[size_t(r)]});
      l.pieces.push_back({r, kW1, blocks(shape_of(kW1), 0, 2)[size_t(r)]});
    }
    l.pieces.push_back({0, kNorm, SliceSpec::whole(shape_of(kNorm))});
    base.push_back(l);
  }
  {  // tensor parallel 4 (columns 2, 2, 1, 1), experts on ranks 2 and 3
    Layout l{"tp4_ep2", 4, {}};
    for (int r = 0; r < 4; ++r) {
      l.pieces.push_back({r, kWq, blocks(shape_of(kWq), 0, 4)[size_t(r)]});
      l.pieces.push_back({r, kWo, blocks(shape_of(kWo), 1, 4)[size_t(r)]});
    }
    for (int e = 0; e < 2; ++e) l.pieces.push_back({2 + e, kW1, blocks(shape_of(kW1), 0, 2)[size_t(e)]});
    l.pieces.push_back({3, kNorm, SliceSpec::whole(shape_of(kNorm))});
    base.push_back(l);
  }
  {  // pipeline stages: layer 0 on rank 0, layer 1 on rank 1
    Layout l{"pp2", 2, {}};
    for (size_t t : {kWq, kWo}) l.pieces.push_back({0, t, SliceSpec::whole(shape_of(t))});
    for (size_t t : {kW1, kNorm}) l.pieces.push_back({1, t, SliceSpec::whole(shape_of(t))});
    base.push_back(l);
  }
  {  // pipeline 2 x tensor parallel 2: stage s, tp rank t is rank 2s + t
    Layout l{"pp2_tp2", 4, {}};
    for (int t = 0; t < 2; ++t) {
      l.pieces.push_back({t, kWq, blocks(shape_of(kWq), 0, 2)[size_t(t)]});
      l.pieces.push_back({t, kWo, blocks(shape_of(kWo), 1, 2)[size_t(t)]});
      l.pieces.push_back({2 + t, kW1, blocks(shape_of(kW1), 0, 2)[size_t(t)]});
    }
    l.pieces.push_back({2, kNorm, SliceSpec::whole(shape_of(kNorm))});
    base.push_back(l);
  }
  std::vector<Layout> all = base;
  const int ways[] = {3, 2, 3, 3, 2};
  for (size_t i = 0; i < base.size(); ++i) all.push_back(zero(base[i], ways[i]));
  return all;
}

const Layout& layout_named(const std::vector<Layout>& all, const std::string& name) {
  for (const Layout& l : all)
    if (l.name == name) return l;
  throw std::logic_error("no layout " + name);
}

ShardTensor piece_tensor(size_t t, const SliceSpec& s) {
  const Global& g = tensors()[t];
  return ShardTensor{g.name, g.dtype, s, extract(g.bytes, dtype_size(g.dtype), s)};
}

Snapshot snapshot_of(const Layout& l, int rank, int64_t step) {
  Snapshot s;
  s.meta.step = step;
  s.meta.tokens = step * 100;
  s.meta.world_size = l.world;
  s.meta.layout = l.name;
  s.rank = rank;
  for (const Piece& p : l.pieces)
    if (p.rank == rank) s.tensors.push_back(piece_tensor(p.tensor, p.slice));
  return s;
}

// Saves `l` with one thread per rank (each its own store client and group
// writer); `tamper` may change a rank's snapshot first. Returns each rank's
// error, "" where the save succeeded.
std::vector<std::string> save_layout(const std::string& root, const Layout& l, int64_t step,
                                     const std::function<void(int, Snapshot&)>& tamper = {}) {
  StoreServerOptions quiet;
  quiet.log = [](const std::string&) {};
  StoreServer server("127.0.0.1", 0, "layouts", quiet);
  std::vector<std::string> errors(size_t(l.world));
  std::vector<std::thread> threads;
  for (int r = 0; r < l.world; ++r)
    threads.emplace_back([&, r] {
      try {
        StoreClient client("127.0.0.1", server.port(), "layouts", 10);
        CheckpointWriter w(root, 0, false, CheckpointGroup{&client, r, l.world, 30});
        Snapshot s = snapshot_of(l, r, step);
        if (tamper) tamper(r, s);
        w.save(std::move(s));
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

std::string step_dir(const std::string& root, int64_t step) { return root + "/" + checkpoint_dir_name(step); }

}  // namespace

// ---------------------------------------------------------------------------
// Slice geometry

TEST_CASE("slices: random boxes and flat ranges copy like an element-by-element reference", "[checkpoint][layouts]") {
  std::mt19937 rng(11);
  auto uni = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  auto random_slice = [&](const std::vector<int64_t>& g) {
    std::vector<int64_t> off(g.size()), ext(g.size());
    for (size_t d = 0; d < g.size(); ++d) {
      off[d] = uni(0, g[d] - 1);
      ext[d] = uni(1, g[d] - off[d]);
    }
    SliceSpec s = SliceSpec::box(g, off, ext);
    if (uni(0, 2) > 0) {  // two thirds of them a flat range of the box
      const int64_t b = uni(0, s.box_numel()), e = uni(b, s.box_numel());
      s = s.flat_range(b, e);
    }
    return s;
  };
  int nonempty = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const size_t nd = size_t(trial % 5);
    std::vector<int64_t> g(nd);
    for (auto& d : g) d = uni(1, 6);
    const SliceSpec src = random_slice(g), dst = random_slice(g);
    INFO("trial " << trial << ": " << describe_slice(src) << " -> " << describe_slice(dst) << " of "
                  << shape_text(g));
    REQUIRE(slice_error(src).empty());
    REQUIRE(slice_error(dst).empty());
    const std::vector<char> all = random_bytes(size_t(SliceSpec::whole(g).numel()) * 2, uint32_t(trial));
    const std::vector<char> src_data = extract(all, 2, src);
    std::vector<char> got(size_t(dst.numel()) * 2, 0x5A), want = got;
    // Reference: each element of dst that src holds, looked up one by one.
    const auto si = global_indices(src), di = global_indices(dst);
    std::map<int64_t, int64_t> at_src;
    for (size_t k = 0; k < si.size(); ++k) at_src[si[k]] = int64_t(k);
    int64_t expect = 0;
    for (size_t k = 0; k < di.size(); ++k)
      if (auto it = at_src.find(di[k]); it != at_src.end()) {
        std::memcpy(want.data() + k * 2, src_data.data() + it->second * 2, 2);
        ++expect;
      }
    CHECK(copy_common_elements(src, src_data.data(), dst, got.data(), 2) == expect);
    CHECK(got == want);
    CHECK(slices_overlap(src, dst) == (expect > 0));
    nonempty += expect > 0;
  }
  // Both outcomes are exercised (about 1 in 6 trials overlap).
  CHECK(nonempty > 60);
  CHECK(600 - nonempty > 60);
}

TEST_CASE("slices: copies run over contiguous stretches, not single elements", "[checkpoint][layouts]") {
  auto runs = [](const SliceSpec& a, const SliceSpec& b) {
    int64_t n = 0, elements = 0;
    for_each_common_run(a, b, [&](int64_t, int64_t, int64_t count) {
      ++n;
      elements += count;
      return true;
    });
    return std::pair<int64_t, int64_t>{n, elements};
  };
  const std::vector<int64_t> big = {1024, 1024};
  const SliceSpec whole = SliceSpec::whole(big);
  // A ZeRO piece of the whole tensor from the whole tensor: one memcpy.
  CHECK(runs(whole, whole.flat_range(1000, 900000)) == std::pair<int64_t, int64_t>{1, 899000});
  // A block of rows is contiguous in the tensor: one run, also for a flat range of it.
  const SliceSpec rows = SliceSpec::box(big, {100, 0}, {100, 1024});
  CHECK(runs(rows.flat_range(5, 20000), whole) == std::pair<int64_t, int64_t>{1, 19995});
  // A block of columns: one run per row.
  const SliceSpec cols = SliceSpec::box(big, {0, 256}, {1024, 256});
  CHECK(runs(cols, whole) == std::pair<int64_t, int64_t>{1024, 1024 * 256});
  // Rows 10..19 of a ZeRO range meet the column block in 10 runs; the search
  // skips the other 1014 rows.
  CHECK(runs(whole.flat_range(10 * 1024 + 5, 20 * 1024), cols) == std::pair<int64_t, int64_t>{10, 10 * 256});
  // Experts [2, 4) of [4, 3, 5]: one run.
  CHECK(runs(SliceSpec::box({4, 3, 5}, {2, 0, 0}, {2, 3, 5}), SliceSpec::whole({4, 3, 5})) ==
        std::pair<int64_t, int64_t>{1, 30});
  // Stopping early.
  int64_t calls = 0;
  for_each_common_run(cols, whole, [&](int64_t, int64_t, int64_t) { return ++calls < 3; });
  CHECK(calls == 3);
  CHECK(!slices_overlap(cols, SliceSpec::box(big, {0, 0}, {1024, 256})));
}

TEST_CASE("slices: the cover check finds gaps and overlaps of boxes and flat ranges", "[checkpoint][layouts]") {
  const std::vector<int64_t> g = {8, 6};
  const auto rb = blocks(g, 0, 2);  // rows [0, 4) and [4, 8)
  const std::vector<std::pair<std::string, SliceSpec>> good = {{"rank 0", rb[0].flat_range(0, 10)},
                                                               {"rank 2", rb[0].flat_range(10, 24)},
                                                               {"rank 1", rb[1].flat_range(0, 24)},
                                                               {"rank 3", rb[1].flat_range(24, 24)}};
  CHECK(cover_error(g, good) == "");
  struct Case {
    std::vector<std::pair<std::string, SliceSpec>> pieces;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {{good[0], good[2]}, "no piece holds elements [1, 4] to [3, 5] (14 of 48)"},
      {{good[0], good[1], good[2], {"rank 3", rb[1]}}, "rank 1 and rank 3 both hold element [4, 0]"},
      {{good[0], {"rank 2", rb[0].flat_range(9, 24)}, good[2]}, "rank 0 and rank 2 both hold element [1, 3]"},
      {{good[0], good[1]}, "no piece holds elements [4, 0] to [7, 5] (24 of 48)"},
      {{good[0], good[1], good[2], {"rank 5", SliceSpec::box(g, {0, 5}, {8, 1})}}, "both hold element [0, 5]"},
      {{{"rank 0", SliceSpec::box(g, {4, 0}, {5, 6})}}, "rank 0: box at [4, 0] of shape [5, 6] does not fit"},
      {{{"rank 0", rb[0].flat_range(0, 25)}}, "rank 0: flat range [0, 25) does not fit in the box's 24 elements"},
      {{{"rank 0", SliceSpec::whole({48})}}, "rank 0 has global shape [48], not [8, 6]"},
  };
  for (const Case& c : cases) {
    const std::string err = cover_error(g, c.pieces);
    std::cout << "cover error (expected): " << err << "\n";
    CHECK_THAT(err, Contains(c.fragment));
  }
}

// ---------------------------------------------------------------------------
// Saved through the multi-rank writer, read in every layout

TEST_CASE("checkpoint layouts: every layout saves and reads back whole, bit for bit", "[checkpoint][layouts]") {
  TempDir dir;
  int64_t checked = 0;
  for (const Layout& l : layouts()) {
    INFO("layout " << l.name);
    const std::string root = dir / l.name;
    REQUIRE(save_layout(root, l, 3) == std::vector<std::string>(size_t(l.world)));
    const LoadedCheckpoint ck = load_checkpoint(step_dir(root, 3));
    CHECK(ck.meta.world_size == l.world);
    CHECK(ck.meta.layout == l.name);
    CHECK(ck.tensors.size() == l.pieces.size());
    const SliceAssembler saved(ck);
    for (const Global& g : tensors()) {
      INFO("tensor " << g.name);
      std::vector<char> out(g.bytes.size(), 0x11);
      saved.fill(g.name, g.dtype, SliceSpec::whole(g.shape), out.data());
      CHECK(out == g.bytes);
      ++checked;
    }
  }
  CHECK(checked == 10 * 4);
}

TEST_CASE("checkpoint layouts: any layout is assembled from any other", "[checkpoint][layouts]") {
  TempDir dir;
  const std::vector<Layout> all = layouts();
  for (const Layout& l : all) REQUIRE(save_layout(dir / l.name, l, 1) == std::vector<std::string>(size_t(l.world)));
  int64_t filled = 0, loaded = 0, skipped = 0;
  for (const Layout& from : all) {
    const std::string ckpt = step_dir(dir / from.name, 1);
    for (const Layout& to : all) {
      for (int r = 0; r < to.world; ++r) {
        INFO(from.name << " -> " << to.name << ", rank " << r);
        std::vector<std::pair<std::string, SliceSpec>> wanted;
        std::vector<const Piece*> mine;
        for (const Piece& p : to.pieces)
          if (p.rank == r) {
            wanted.emplace_back(tensors()[p.tensor].name, p.slice);
            mine.push_back(&p);
          }
        const LoadedCheckpoint ck = load_checkpoint(ckpt, overlapping(wanted));
        // The filter takes exactly the saved pieces that share an element
        // with a wanted one (by the reference), so each rank reads its share.
        int64_t expect_loaded = 0;
        for (const Piece& s : from.pieces) {
          bool hit = false;
          for (const Piece* w : mine) hit = hit || (w->tensor == s.tensor && naive_overlap(w->slice, s.slice));
          expect_loaded += hit;
          skipped += !hit;
        }
        CHECK(int64_t(ck.tensors.size()) == expect_loaded);
        loaded += int64_t(ck.tensors.size());
        const SliceAssembler saved(ck);
        for (const Piece* w : mine) {
          const Global& g = tensors()[w->tensor];
          if (w->slice.numel() == 0) continue;  // an empty ZeRO range needs nothing
          std::vector<char> out(size_t(w->slice.numel()) * dtype_size(g.dtype), 0x11);
          saved.fill(g.name, g.dtype, w->slice, out.data());
          CHECK(out == extract(g.bytes, dtype_size(g.dtype), w->slice));
          ++filled;
        }
      }
    }
  }
  std::cout << "layouts: " << filled << " pieces assembled, " << loaded << " saved pieces loaded, " << skipped
            << " left unread by the filters\n";
  CHECK(filled > 1000);
  CHECK(skipped > loaded);  // the filters do skip most pieces
}

TEST_CASE("checkpoint layouts: a gap or an overlap across ranks fails the save naming the tensor",
          "[checkpoint][layouts]") {
  TempDir dir;
  const std::vector<Layout> all = layouts();
  const Layout& tp2z = layout_named(all, "tp2+zero2");  // ranks 0, 1: first thirds; 2, 3: the rest
  struct Case {
    std::string what;
    std::function<void(int, Snapshot&)> tamper;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {"gap: rank 3 leaves out its part of the experts",
       [](int r, Snapshot& s) {
         if (r == 3)
           s.tensors.erase(std::remove_if(s.tensors.begin(), s.tensors.end(),
                                          [](const ShardTensor& t) { return t.name == "layers.1.moe.w1"; }),
                           s.tensors.end());
       },
       "tensor \"layers.1.moe.w1\": no piece holds elements [2, 2, 0] to [3, 2, 4] (20 of 60)"},
      {"overlap: rank 1's rows of wq start one row early",
       [](int r, Snapshot& s) {
         if (r != 1) return;
         for (ShardTensor& t : s.tensors)
           if (t.name == "layers.0.attn.wq") t = piece_tensor(kWq, SliceSpec::box({8, 6}, {3, 0}, {5, 6}).flat_range(0, 10));
       },
       "tensor \"layers.0.attn.wq\": rank 2 and rank 1 both hold element [3, 0]"},
      {"overlap: two ZeRO ranges of one box share elements",
       [](int r, Snapshot& s) {
         if (r != 2) return;
         for (ShardTensor& t : s.tensors)
           if (t.name == "layers.0.attn.wo") t = piece_tensor(kWo, t.slice.flat_range(t.slice.flat->begin - 2, t.slice.flat->end));
       },
       "tensor \"layers.0.attn.wo\": rank 0 and rank 2 both hold element [2, 0]"},
      {"disagreement on the global shape",
       [](int r, Snapshot& s) {
         if (r == 2) s.tensors[0].slice.global_shape = {9, 6};
       },
       "tensor \"layers.0.attn.wq\": rank 0 saved it as F32 [8, 6], rank 2 as F32 [9, 6]"},
  };
  int64_t step = 1;
  for (const Case& c : cases) {
    INFO(c.what);
    const std::string root = dir / ("case" + std::to_string(step));
    const auto errors = save_layout(root, tp2z, step, c.tamper);
    std::cout << c.what << " (expected): " << errors[0] << "\n";
    for (int r = 0; r < tp2z.world; ++r) {
      INFO("rank " << r << ": " << errors[size_t(r)]);
      CHECK_THAT(errors[size_t(r)], Contains("checkpoint save of " + step_dir(root, step) + " failed: "));
      CHECK_THAT(errors[size_t(r)], Contains(c.fragment));
      CHECK_THAT(errors[size_t(r)], !Contains("rank 0 failed"));  // the layout failed, not a rank
    }
    CHECK(!fs::exists(step_dir(root, step)));
    CHECK(!fs::exists(step_dir(root, step) + ".partial"));
    ++step;
  }
}

TEST_CASE("checkpoint layouts: manifest, rank files and inspect describe pieces in global terms",
          "[checkpoint][layouts]") {
  TempDir dir;
  const std::vector<Layout> all = layouts();
  const std::string root = dir / "ckpt";
  const Layout& l = layout_named(all, "tp4_ep2+zero3");
  REQUIRE(save_layout(root, l, 2) == std::vector<std::string>(size_t(l.world)));
  const std::string step = step_dir(root, 2);

  // A flat range is stored as [numel]; a whole box under its own shape.
  for (const auto& t : read_safetensors(step + "/rank_00004.safetensors"))  // tp rank 0, second ZeRO range
    if (t.name == "layers.0.attn.wq") CHECK(t.shape == std::vector<int64_t>{4});  // 12 elements: [2, 6)
  const Layout& tp2 = layout_named(all, "tp2");
  REQUIRE(save_layout(dir / "tp2", tp2, 2) == std::vector<std::string>(2));
  for (const auto& t : read_safetensors(step_dir(dir / "tp2", 2) + "/rank_00001.safetensors"))
    if (t.name == "layers.0.attn.wo") CHECK(t.shape == std::vector<int64_t>{8, 3});

  const std::string text = describe_checkpoint(step);
  std::cout << text;
  CHECK_THAT(text, Contains("layout tp4_ep2+zero3, world size 12"));
  CHECK_THAT(text, Contains("[4, 3, 5]"));
  // wq: 4 row blocks x 3 ZeRO ranges = 12 pieces, the first four shown.
  CHECK_THAT(text, Contains("layers.0.attn.wq") && Contains("  12  rank 0 [0:2, 0:6] flat [0, 2); rank 1 [2:4, 0:6] flat [0, 2); rank 2"));
  CHECK_THAT(text, Contains("... (8 more)"));
  CHECK_THAT(text, Contains("rank 3 flat [0, 1)"));  // the norm: a flat range of the whole tensor

  // A version 1 manifest (ZeRO pieces flattened) is refused, naming the version.
  std::string manifest;
  {
    std::ifstream in(step + "/manifest.json");
    std::stringstream ss;
    ss << in.rdbuf();
    manifest = ss.str();
  }
  // As that version was written: no checksum of its own at the end.
  manifest.replace(manifest.find("\"format_version\": 3"), 19, "\"format_version\": 1");
  manifest.erase(manifest.rfind(",\n  \"manifest_crc32c\""), std::string::npos);
  manifest += "\n}\n";
  std::ofstream(step + "/manifest.json", std::ios::trunc) << manifest;
  try {
    load_checkpoint(step);
    FAIL("a version 1 manifest loaded");
  } catch (const std::exception& e) {
    std::cout << "version 1 (expected): " << e.what() << "\n";
    CHECK_THAT(std::string(e.what()), Contains(step + "/manifest.json") && Contains("format_version 1 is not supported"));
  }
}

TEST_CASE("checkpoint layouts: assembling names the checkpoint and tensor when pieces are missing or differ",
          "[checkpoint][layouts]") {
  TempDir dir;
  const std::vector<Layout> all = layouts();
  const Layout& l = layout_named(all, "tp2");
  REQUIRE(save_layout(dir / "c", l, 1) == std::vector<std::string>(2));
  const std::string step = step_dir(dir / "c", 1);
  // Only rows [0, 4) of wq were loaded; asking for all of it fails.
  const LoadedCheckpoint part = load_checkpoint(step, overlapping({{"layers.0.attn.wq", blocks({8, 6}, 0, 2)[0]}}));
  REQUIRE(part.tensors.size() == 1);
  const SliceAssembler a(part);
  std::vector<float> out(48);
  CHECK_THROWS_WITH(a.fill("layers.0.attn.wq", DType::F32, SliceSpec::whole({8, 6}), out.data()),
                    Contains(step) && Contains("\"layers.0.attn.wq\"") && Contains("hold 24 of the 48 elements"));
  CHECK_THROWS_WITH(a.fill("layers.0.attn.wq", DType::F32, SliceSpec::whole({6, 8}), out.data()),
                    Contains("is F32 [8, 6] in the checkpoint, F32 [6, 8] here"));
  CHECK_THROWS_WITH(a.fill("layers.0.attn.wq", DType::BF16, SliceSpec::whole({8, 6}), out.data()),
                    Contains("is F32 [8, 6] in the checkpoint, BF16 [8, 6] here"));
  CHECK_THROWS_WITH(a.fill("nope", DType::F32, SliceSpec::whole({8, 6}), out.data()), Contains("no tensor \"nope\""));
  // A tensor whose shape changed is still loaded, so the error can say so.
  const LoadedCheckpoint other = load_checkpoint(step, overlapping({{"layers.1.norm", SliceSpec::whole({9})}}));
  CHECK(other.tensors.size() == 1);
}
