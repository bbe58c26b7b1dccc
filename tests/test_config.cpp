// The configuration system: defaults, a full file, --set, the YAML round trip,
// and the promise that every user mistake becomes one ConfigError naming the
// key (checked both in-process and through the real binary's exit code 2).
#include <catch2/catch.hpp>

#include "tests/error_of.h"

#include "tests/build_paths.h"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "config/config.h"
#include "model/dims.h"
#include "config/config_schema.h"

using namespace trainer;

namespace {

const std::string kData = "data:\n  train: [train.bin]\n";

constexpr auto& error_of = trainer::test::config_error_of;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Every schema key rendered as YAML text: comparing these compares whole
// configs without a hand-written operator== that could forget a field.
std::vector<std::string> all_values(const Config& c) {
  std::vector<std::string> out;
  for (const auto& k : config_schema()) out.push_back(std::string(k.path) + "=" + value_yaml(k, c));
  return out;
}

struct BadCase {
  const char* name;
  std::string yaml;
  bool add_data;                  // append a valid data section so only the mistake fails
  std::string key;                // the key path the message must name
  std::vector<std::string> also;  // further required fragments (suggestions, allowed values)
};

std::vector<BadCase> bad_cases() {
  return {
      {"typo in a key", "model:\n  n_head: 4\n", true, "model.n_head",
       {"did you mean 'model.n_heads'?", "bad.yaml:2:3", "unknown key"}},
      {"typo in a section", "modle:\n  d_model: 64\n", true, "modle", {"did you mean 'model'?"}},
      {"key in the wrong section", "model:\n  lr: 0.001\n", true, "model.lr", {"did you mean 'optim.lr'?"}},
      {"another trainer's name for a key", "model:\n  hidden_size: 128\n", true, "model.hidden_size",
       {"did you mean 'model.d_model'?"}},
      {"typo in a nested moe key", "model:\n  moe:\n    topk: 2\n", true, "model.moe.topk",
       {"did you mean 'model.moe.top_k'?", "bad.yaml:3:5"}},
      {"key without its section", "lr: 0.1\n", true, "lr", {"did you mean 'optim.lr'?"}},
      {"unknown key far from any", "train:\n  zzzqqq: 1\n", true, "train.zzzqqq", {"keys in train:", "micro_batch_size"}},
      {"text for an integer", "model:\n  d_model: abc\n", true, "model.d_model",
       {"expected an integer, got 'abc'", "bad.yaml:2:"}},
      {"fraction for an integer", "train:\n  micro_batch_size: 2.5\n", true, "train.micro_batch_size",
       {"expected an integer, got '2.5'"}},
      {"word for a bool", "parallel:\n  sp: maybe\n", true, "parallel.sp", {"expected true or false, got 'maybe'"}},
      {"word for a number", "optim:\n  lr: fast\n", true, "optim.lr", {"expected a number, got 'fast'"}},
      {"section given a scalar", "model: 5\n", true, "model", {"is a section", "got '5'", "bad.yaml:1:1"}},
      {"list for a scalar", "model:\n  n_layers: [1, 2]\n", true, "model.n_layers", {"got a list"}},
      {"map inside a file list", "data:\n  train:\n    - {path: a.bin}\n", false, "data.train[0]",
       {"expected a string", "got a map"}},
      {"map for a file list", "data:\n  train: {path: a.bin}\n", false, "data.train", {"got a map"}},
      {"unknown architecture", "model:\n  arch: gpt3\n", true, "model.arch", {"llama | gpt2", "'gpt3'"}},
      {"unknown device", "train:\n  device: gpu\n", true, "train.device", {"auto | cpu | cuda", "'gpu'"}},
      {"unknown precision", "train:\n  precision: fp8\n", true, "train.precision", {"auto | fp32 | bf16 | fp16"}},
      {"duplicate key", "model:\n  d_model: 64\n  d_model: 128\n", true, "model.d_model",
       {"bad.yaml:3:3: invalid YAML: duplicate key", "first at line 2"}},
      {"duplicate via dotted spelling", "model:\n  d_model: 64\nmodel.d_model: 128\n", true, "model.d_model",
       {"duplicate key"}},
      {"zero width", "model:\n  d_model: 0\n", true, "model.d_model", {">= 1", "got 0"}},
      {"beta2 of one", "optim:\n  beta2: 1.0\n", true, "optim.beta2", {">= 0.0 and < 1.0"}},
      {"negative learning rate", "optim:\n  lr: -0.001\n", true, "optim.lr", {"> 0"}},
      {"non-finite learning rate", "optim:\n  lr: .nan\n", true, "optim.lr", {"finite"}},
      {"min_lr above lr", "optim: {lr: 0.001, min_lr: 0.01}\n", true, "optim.min_lr", {"optim.lr=0.001"}},
      {"heads do not divide width", "model: {d_model: 100, n_heads: 3}\n", true, "model.d_model=100",
       {"model.n_heads=3"}},
      {"kv heads do not divide heads", "model: {n_heads: 4, n_kv_heads: 3}\n", true, "model.n_kv_heads=3",
       {"model.n_heads=4"}},
      {"more kv heads than heads", "model: {n_heads: 4, n_kv_heads: 8}\n", true, "model.n_kv_heads=8", {}},
      {"odd llama head_dim", "model: {d_model: 36, n_heads: 4}\n", true, "model.d_model",
       {"head_dim", "= 9", "even"}},
      {"global batch not a multiple", "train: {micro_batch_size: 4, global_batch_size: 6}\n", true,
       "train.global_batch_size=6", {"train.micro_batch_size"}},
      {"top_k above experts", "model: {moe: {num_experts: 2, top_k: 4}}\n", true, "model.moe.top_k=4",
       {"model.moe.num_experts=2"}},
      {"moe every zero", "model:\n  moe:\n    num_experts: 4\n    every: 0\n", true, "model.moe.every", {">= 1"}},
      {"moe every beyond the layers", "model: {n_layers: 2, moe: {num_experts: 4, every: 3}}\n", true,
       "model.moe.every=3", {"model.n_layers=2"}},
      {"no training data", "model:\n  d_model: 64\n", false, "data.train", {"token files"}},
      {"empty training path", "data:\n  train: ['']\n", false, "data.train[0]", {"empty path"}},
      {"tensor parallel without processes", "parallel: {tp: 2}\n", true, "parallel.tp",
       {"parallel.tp=2 needs 2 processes, this run has 1"}},
      {"pipeline parallel without processes", "parallel: {pp: 4}\n", true, "parallel.pp",
       {"parallel.pp=4 needs 4 processes, this run has 1"}},
      {"data parallel without processes", "parallel: {dp: 2}\n", true, "parallel.dp",
       {"parallel.dp=2 needs 2 processes, this run has 1"}},
      {"expert parallel without processes", "parallel: {ep: 2}\nmodel: {moe: {num_experts: 4}}\n", true,
       "parallel.ep", {"parallel.ep=2 needs 2 processes, this run has 1"}},
      {"zero stage four", "parallel:\n  zero_stage: 4\n", true, "parallel.zero_stage", {"0 .. 3", "got 4"}},
      {"bf16 on the CPU", "train: {device: cpu, precision: bf16}\n", true, "train.precision=bf16",
       {"train.device=cpu", "fp32"}},
      {"keep no checkpoints", "checkpoint: {keep_last: 0}\n", true, "checkpoint.keep_last",
       {">= 1", "got 0"}},
      {"sequence longer than the model", "train: {seq_len: 128}\n", true, "train.seq_len=128",
       {"model.max_seq_len=64"}},
      {"vocabulary of one", "model: {vocab_size: 1}\n", true, "model.vocab_size", {">= 2"}},
      {"unknown token dtype", "data:\n  train: a.bin\n  dtype: int8\n", false, "data.dtype", {"uint16 | uint32"}},
      {"unknown schedule", "optim: {schedule: step}\n", true, "optim.schedule", {"cosine | linear | constant"}},
      {"zero norm epsilon", "model: {norm_eps: 0}\n", true, "model.norm_eps", {"> 0"}},
      {"unknown rope scaling", "model: {rope_scaling: {type: yarn}}\n", true, "model.rope_scaling.type",
       {"none | linear | llama3"}},
      {"llama3 rope without its context", "model: {rope_scaling: {type: llama3, factor: 8}}\n", true,
       "model.rope_scaling.type=llama3", {"original_max_seq_len >= 1"}},
      {"llama3 rope with crossed frequency bands",
       "model: {rope_scaling: {type: llama3, original_max_seq_len: 8192, low_freq_factor: 4, high_freq_factor: 1}}\n",
       true, "model.rope_scaling.high_freq_factor", {"must be > model.rope_scaling.low_freq_factor"}},
      {"rope scaling on gpt2", "model: {arch: gpt2, rope_scaling: {type: linear, factor: 2}}\n", true,
       "model.rope_scaling.type=linear", {"gpt2 has learned positions"}},
      {"attention bias key on gpt2", "model: {arch: gpt2, attn_bias: qkv}\n", true, "model.attn_bias=qkv",
       {"gpt2 always has its attention biases"}},
      {"negative sliding window", "model: {sliding_window: -4}\n", true, "model.sliding_window", {">= 0", "got -4"}},
      {"steps beyond 64 bits", "train: {steps: 99999999999999999999}\n", true, "train.steps",
       {"out of the 64-bit range"}},
      {"width beyond 32 bits", "model: {d_model: 4294967296}\n", true, "model.d_model", {"32-bit"}},
      {"tie_embeddings not a choice", "model: {tie_embeddings: maybe}\n", true, "model.tie_embeddings",
       {"auto | true | false"}},
      {"empty resume", "checkpoint: {resume: ''}\n", true, "checkpoint.resume", {"none | auto | a path"}},
      {"negative seed", "run: {seed: -1}\n", true, "run.seed", {"non-negative"}},
      {"run name with a slash", "run: {name: a/b}\n", true, "run.name", {"run.dir"}},
      {"list as a key", "model:\n  [a, b]: 1\n", true, "model", {"keys must be plain names"}},
  };
}

// Mistakes in the YAML itself, where no key can be named; they must still
// come back as FILE:LINE:COL: invalid YAML.
std::vector<std::pair<std::string, std::string>> syntax_cases() {
  return {
      {"model: {d_model: 64\n", "bad.yaml:"},
      {"model:\n\td_model: 64\n", "bad.yaml:2:"},
      {"model:\n\td_model: 64\n", "tab character"},
      {"model:\n  d_model: 64\n---\nmodel:\n  d_model: 32\n", "2 documents"},
      {"- a\n- b\n", "top level must be a map of sections"},
      {"model: [unclosed\n", "bad.yaml:"},
      // A token no document starts with: yaml-cpp's LoadAll added null
      // documents forever (found by tests/fuzz/fuzz_config_yaml.cpp).
      {",", "bad.yaml:1:1: invalid YAML: unexpected ','"},
      {"model: {d_model: 64}\n,\n", "bad.yaml:2:1: invalid YAML"},
  };
}

std::string full_yaml() {
  return R"(# every section, non-default values
run:
  name: full
  dir: /tmp/runs/full
  seed: 7
model:
  arch: gpt2
  vocab_size: 512
  d_model: 96
  n_layers: 3
  n_heads: 6
  n_kv_heads: 3
  d_ff: 200
  max_seq_len: 128
  norm_eps: 1.0e-6
  rope_theta: 500000
  tie_embeddings: false
  init_std: 0.01
  moe:
    num_experts: 8
    top_k: 2
    every: 2
    capacity_factor: 1.25
    aux_loss_coeff: 0.001
    d_ff: 64
    normalize_topk: no
parallel:
  zero_stage: 1
  timeout_s: 30
train:
  device: cpu
  precision: fp32
  steps: 1000
  seq_len: 96
  micro_batch_size: 2
  global_batch_size: 8
  grad_clip: 0.5
  eval_interval: 100
  eval_steps: 2
  threads: 2
optim:
  name: adamw
  lr: 6.0e-4
  min_lr: 6.0e-5
  warmup_steps: 100
  schedule: linear
  decay_steps: 900
  beta1: 0.8
  beta2: 0.99
  eps: 1.0e-10
  weight_decay: 0.0
data:
  train: [a.bin, b.bin]
  valid: v.bin
  dtype: uint32
checkpoint:
  dir: ckpts
  interval: 0
  keep_last: 5
  async: false
  resume: auto
log:
  interval: 10
  jsonl: false
  progress: lines
smoke:
  steps: 50
)";
}

}  // namespace

TEST_CASE("config: schema is consistent with the structs", "[config]") {
  const Config defaults;
  std::vector<std::string> seen;
  for (const auto& k : config_schema()) {
    INFO(k.path);
    CHECK(std::find(seen.begin(), seen.end(), std::string(k.path)) == seen.end());
    seen.emplace_back(k.path);
    CHECK(find_key(k.path) == &k);
    CHECK(!k.help.empty());
    // The struct default must be acceptable to its own row.
    CHECK_FALSE(check_key_value(k, defaults).has_value());
    CHECK(contains(config_schema_help(), std::string(k.path)));
  }
  CHECK(is_section("model"));
  CHECK(is_section("model.moe"));
  CHECK_FALSE(is_section("model.d_model"));
  CHECK(find_key("model.moe.top_k")->type == KeyType::Int);
  CHECK(find_key("train.steps")->type == KeyType::Int64);
  CHECK(find_key("data.train")->type == KeyType::StringList);
}

TEST_CASE("config: suggestions for unknown keys", "[config]") {
  CHECK(suggest_key("model.n_head") == "model.n_heads");
  CHECK(suggest_key("modle") == "model");
  CHECK(suggest_key("model.lr") == "optim.lr");
  CHECK(suggest_key("optim.learning_rate") == "optim.lr");
  CHECK(suggest_key("train.batch_size") == "train.micro_batch_size");
  CHECK(suggest_key("model.moe.topk") == "model.moe.top_k");
  CHECK(suggest_key("model.num_hidden_layers") == "model.n_layers");
  CHECK(suggest_key("optim.warmup") == "optim.warmup_steps");
  CHECK(suggest_key("d_model") == "model.d_model");
  CHECK(suggest_key("train.zzzqqq").empty());
  CHECK(suggest_key("parallel.xy").empty());  // short names must not match "tp"/"pp" loosely
}

TEST_CASE("config: defaults load", "[config]") {
  const Config c = load_config_text("", "defaults.yaml", {"data.train=train.bin"});
  const Config d;
  CHECK(c.source == "defaults.yaml");
  for (const auto& k : config_schema()) {
    const std::string key(k.path);
    INFO(key);
    if (key == "model.tie_embeddings") {
      CHECK(c.model.tie_embeddings == "false");  // auto resolved for llama
    } else if (key == "train.global_batch_size") {
      CHECK(c.train.global_batch_size == d.train.micro_batch_size);  // dp = 1
    } else if (key == "data.train") {
      CHECK(c.data.train == std::vector<std::string>{"train.bin"});
    } else {
      CHECK(value_yaml(k, c) == value_yaml(k, d));
    }
  }
  // Comments, an explicit document marker and empty sections change nothing.
  const Config c2 = load_config_text("# nothing\n---\nmodel:\nlog:\n", "d2.yaml", {"data.train=train.bin"});
  CHECK(all_values(c2) == all_values(c));
}

TEST_CASE("config: derived widths", "[config]") {
  Config c;
  c.model.d_model = 64;
  CHECK(c.d_ff() == 192);  // 8*64/3 = 170 -> next multiple of 32
  c.model.d_model = 96;
  CHECK(c.d_ff() == 256);
  c.model.arch = "gpt2";
  CHECK(c.d_ff() == 384);
  c.model.d_ff = 100;
  CHECK(c.d_ff() == 100);
  CHECK(c.moe_d_ff() == 100);
  c.model.moe.d_ff = 48;
  CHECK(c.moe_d_ff() == 48);
}

TEST_CASE("config: a full file loads with the right values", "[config]") {
  const Config c = load_config_text(full_yaml(), "full.yaml", {});
  CHECK(c.run.name == "full");
  CHECK(c.run.dir == "/tmp/runs/full");
  CHECK(c.run.seed == 7u);
  CHECK(c.model.arch == "gpt2");
  CHECK(c.model.vocab_size == 512);
  CHECK(c.model.d_model == 96);
  CHECK(c.model.n_layers == 3);
  CHECK(c.model.n_heads == 6);
  CHECK(c.model.n_kv_heads == 3);
  CHECK(c.kv_heads() == 3);
  CHECK(c.head_dim() == 16);
  CHECK(c.d_ff() == 200);
  CHECK(c.moe_d_ff() == 64);
  CHECK(c.model.max_seq_len == 128);
  CHECK(c.model.norm_eps == 1e-6);
  CHECK(c.model.rope_theta == 500000.0);
  CHECK(c.model.tie_embeddings == "false");  // explicit beats the gpt2 auto
  CHECK_FALSE(c.model.tied());
  CHECK(c.model.init_std == 0.01);
  CHECK(c.model.moe.num_experts == 8);
  CHECK(c.model.moe.top_k == 2);
  CHECK(c.model.moe.every == 2);
  CHECK(make_dims(c, 1, 1).moe_layer(1));
  CHECK_FALSE(make_dims(c, 1, 1).moe_layer(0));
  CHECK(c.model.moe.capacity_factor == 1.25);
  CHECK(c.model.moe.aux_loss_coeff == 0.001);
  CHECK(c.model.moe.normalize_topk == false);  // "no" is a YAML false
  CHECK(c.parallel.zero_stage == 1);
  CHECK(c.parallel.timeout_s == 30.0);
  CHECK(c.train.device == "cpu");
  CHECK(c.train.precision == "fp32");
  CHECK(c.train.steps == 1000);
  CHECK(c.train.seq_len == 96);
  CHECK(c.train.micro_batch_size == 2);
  CHECK(c.train.global_batch_size == 8);
  CHECK(c.train.grad_clip == 0.5);
  CHECK(c.train.eval_interval == 100);
  CHECK(c.train.eval_steps == 2);
  CHECK(c.train.threads == 2);
  CHECK(c.optim.lr == 6e-4);
  CHECK(c.optim.min_lr == 6e-5);
  CHECK(c.optim.warmup_steps == 100);
  CHECK(c.optim.schedule == "linear");
  CHECK(c.optim.decay_steps == 900);
  CHECK(c.optim.beta1 == 0.8);
  CHECK(c.optim.beta2 == 0.99);
  CHECK(c.optim.eps == 1e-10);
  CHECK(c.optim.weight_decay == 0.0);
  CHECK(c.data.train == std::vector<std::string>{"a.bin", "b.bin"});
  CHECK(c.data.valid == std::vector<std::string>{"v.bin"});  // one string is a one-file list
  CHECK(c.data.dtype == "uint32");
  CHECK(c.checkpoint.dir == "ckpts");
  CHECK(c.checkpoint.keep_last == 5);
  CHECK(c.checkpoint.async == false);
  CHECK(c.checkpoint.resume == "auto");
  CHECK(c.log.interval == 10);
  CHECK(c.log.jsonl == false);
  CHECK(c.log.progress == "lines");
  CHECK(c.smoke.steps == 50);
}

TEST_CASE("config: auto values resolve", "[config]") {
  const Config gpt2 = load_config_text("model: {arch: gpt2}\n" + kData, "a.yaml", {});
  CHECK(gpt2.model.tie_embeddings == "true");
  CHECK(gpt2.model.tied());
  const Config llama = load_config_text(kData, "a.yaml", {"train.micro_batch_size=3"});
  CHECK(llama.model.tie_embeddings == "false");
  CHECK(llama.train.global_batch_size == 3);
  // Dotted keys at the top level and YAML's other bool spellings are accepted.
  const Config dotted = load_config_text("model.tie_embeddings: yes\nlog.jsonl: off\n" + kData, "a.yaml", {});
  CHECK(dotted.model.tie_embeddings == "true");
  CHECK_FALSE(dotted.log.jsonl);
}

TEST_CASE("config: --set overrides", "[config]") {
  const std::string yaml = "model:\n  d_model: 64\n  n_heads: 4\n" + kData;
  const Config c = load_config_text(
      yaml, "o.yaml",
      {"model.d_model=128", "model.d_model=256",          // later wins
       "model.n_heads=8", "optim.lr=1e-3",                 // scientific notation
       "data.train=[x.bin, y.bin]", "data.valid=v.bin",   // flow list, single string
       "log.jsonl=false", "checkpoint.async=false",       // bools
       "model.moe.num_experts=4", "model.moe.top_k=1",    // nested keys
       "model.moe={every: 2, capacity_factor: 1.5}",      // a section as a map
       "run.name=with space", "train.global_batch_size=8",
       "model.tie_embeddings=true", "run.dir="});
  CHECK(c.model.d_model == 256);
  CHECK(c.model.n_heads == 8);
  CHECK(c.optim.lr == 1e-3);
  CHECK(c.data.train == std::vector<std::string>{"x.bin", "y.bin"});
  CHECK(c.data.valid == std::vector<std::string>{"v.bin"});
  CHECK_FALSE(c.log.jsonl);
  CHECK_FALSE(c.checkpoint.async);
  CHECK(c.model.moe.num_experts == 4);
  CHECK(c.model.moe.top_k == 1);
  CHECK(c.model.moe.every == 2);
  CHECK(c.model.moe.capacity_factor == 1.5);
  CHECK(c.run.name == "with space");
  CHECK(c.train.global_batch_size == 8);
  CHECK(c.model.tied());
  CHECK(c.run.dir.empty());
  // An override can repair a file that would not validate on its own.
  CHECK_NOTHROW(load_config_text("model: {d_model: 100}\n" + kData, "o.yaml", {"model.d_model=128"}));
  // An override may empty a list the file set.
  CHECK(contains(error_of([&] { load_config_text(kData, "o.yaml", {"data.train=[]"}); }), "data.train"));
}

TEST_CASE("config: config_to_yaml round trip", "[config]") {
  SECTION("defaults") {
    const Config a = load_config_text(kData, "a.yaml", {});
    const std::string text = config_to_yaml(a);
    const Config b = load_config_text(text, "b.yaml", {});
    CHECK(all_values(a) == all_values(b));
    const auto body = [](const std::string& s) { return s.substr(s.find('\n')); };  // line 1 names the file
    CHECK(body(config_to_yaml(b)) == body(text));
  }
  SECTION("every key changed, awkward strings") {
    const Config a = load_config_text(
        full_yaml(), "full.yaml",
        {"run.name='name: with # marks'", "run.dir=", "checkpoint.dir=true",
         "data.train=['a, b.bin', '[x].bin', '#c.bin', 'null']", "data.valid=[]",
         "checkpoint.resume=runs/x/ckpt/step_00000100", "optim.lr=0.1", "train.grad_clip=-1",
         "model.moe.capacity_factor=0", "run.seed=18446744073709551615"});
    CHECK(a.run.name == "name: with # marks");
    CHECK(a.data.train.size() == 4);
    CHECK(a.data.train[3] == "null");
    const std::string text = config_to_yaml(a);
    // Every key appears, grouped under its section.
    for (const auto& k : config_schema()) CHECK(contains(text, std::string(k.leaf()) + ":"));
    CHECK(contains(text, "\nmodel:\n"));
    CHECK(contains(text, "\n  moe:\n    num_experts: 8"));
    const Config b = load_config_text(text, "b.yaml", {});
    CHECK(all_values(a) == all_values(b));
    CHECK(b.run.seed == 18446744073709551615ull);
    CHECK(b.optim.lr == a.optim.lr);
    CHECK(b.model.norm_eps == a.model.norm_eps);
    CHECK(b.data.train == a.data.train);
  }
}

TEST_CASE("config: validate_config with several processes", "[config]") {
  Config c = load_config_text(kData, "w.yaml", {});
  c.parallel.tp = 2;
  c.train.global_batch_size = 8;
  CHECK_NOTHROW(validate_config(c, 2));
  CHECK_NOTHROW(validate_config(c, 4));  // dp auto = 2
  CHECK(contains(error_of([&] { validate_config(c, 3); }), "parallel.tp"));
  c.parallel.dp = 2;
  CHECK(contains(error_of([&] { validate_config(c, 2); }), "parallel.dp=2"));
  c.parallel.dp = 0;
  c.train.global_batch_size = 4;  // micro 4 x dp 2 = 8 does not divide 4
  CHECK(contains(error_of([&] { validate_config(c, 4); }), "train.global_batch_size=4"));
  c.train.global_batch_size = 16;
  c.model.n_heads = 2;
  c.model.n_kv_heads = 1;
  CHECK_NOTHROW(validate_config(c, 2));  // the one kv head is replicated on both tp ranks
  c.model.d_model = 48;
  c.model.n_heads = 6;
  c.model.n_kv_heads = 3;
  const std::string kv_err = error_of([&] { validate_config(c, 2); });
  INFO(kv_err);
  CHECK(contains(kv_err, "model.n_kv_heads, 0 = n_heads) = 3 and parallel.tp=2"));
  c.model.n_kv_heads = 6;
  c.parallel.sp = true;
  c.parallel.tp = 1;
  CHECK(contains(error_of([&] { validate_config(c, 1); }), "parallel.sp=true splits the sequence"));
  c.parallel.tp = 2;
  c.train.seq_len = 33;
  CHECK(contains(error_of([&] { validate_config(c, 2); }), "train.seq_len=33 must be divisible by parallel.tp=2"));
  c.train.seq_len = 32;
  c.parallel.sp = false;
  c.model.d_ff = 33;
  CHECK(contains(error_of([&] { validate_config(c, 2); }), "model.d_ff=33"));
  c.model.d_ff = 64;
  // Built by hand and never resolved: "auto" placeholders are still valid.
  Config raw;
  raw.data.train = {"t.bin"};
  CHECK_NOTHROW(validate_config(raw));
}

TEST_CASE("config: bad configurations raise ConfigError naming the key", "[config]") {
  const auto cases = bad_cases();
  REQUIRE(cases.size() >= 20);
  for (const auto& bc : cases) {
    const std::string yaml = bc.yaml + (bc.add_data ? kData : "");
    INFO("case: " << bc.name << "\n--- yaml ---\n" << yaml);
    CHECK_THROWS_AS(load_config_text(yaml, "bad.yaml", {}), ConfigError);
    const std::string msg = error_of([&] { load_config_text(yaml, "bad.yaml", {}); });
    INFO("message: " << msg);
    CHECK(contains(msg, bc.key));
    CHECK(contains(msg, "bad.yaml"));
    for (const auto& frag : bc.also) CHECK(contains(msg, frag));
  }
}

TEST_CASE("config: YAML syntax errors are rephrased", "[config]") {
  for (const auto& [yaml, frag] : syntax_cases()) {
    const std::string msg = error_of([&] { load_config_text(yaml, "bad.yaml", {}); });
    INFO("yaml:\n" << yaml << "\nmessage: " << msg);
    CHECK(contains(msg, frag));
    CHECK(contains(msg, "bad.yaml"));
    CHECK_FALSE(contains(msg, "yaml-cpp"));
    CHECK_FALSE(contains(msg, "<not a ConfigError>"));
  }
}

TEST_CASE("config: mangled files only ever raise ConfigError", "[config]") {
  // Deterministic damage to a valid file: whatever yaml-cpp or the parsers
  // throw inside must come out as a ConfigError (main maps it to exit 2).
  const std::string base = full_yaml();
  const std::string junk = ":-[]{}#'\"\t\n ,&*!|>%@`x9.";
  uint64_t state = 12345;
  auto next = [&] { state = state * 6364136223846793005ull + 1442695040888963407ull; return state >> 33; };
  int other = 0, loaded = 0, rejected = 0;
  for (int i = 0; i < 400; ++i) {
    std::string y = base;
    for (int edits = 1 + int(next() % 3); edits > 0; --edits) {
      const size_t pos = next() % y.size();
      switch (next() % 3) {
        case 0: y.erase(pos, 1 + next() % 8); break;
        case 1: y.insert(pos, 1, junk[next() % junk.size()]); break;
        default: y[pos] = junk[next() % junk.size()]; break;
      }
    }
    try {
      load_config_text(y, "mangled.yaml", {});
      ++loaded;
    } catch (const ConfigError& e) {
      ++rejected;
      if (!contains(e.what(), "mangled.yaml")) {
        INFO("message without the file name: " << e.what() << "\n" << y);
        CHECK(false);
      }
    } catch (...) {
      ++other;
      INFO("yaml:\n" << y);
      CHECK(false);
    }
  }
  CHECK(other == 0);
  CHECK(rejected > 0);
  INFO("loaded " << loaded << ", rejected " << rejected);
  SUCCEED();
}

TEST_CASE("config: bad --set overrides", "[config]") {
  struct Case {
    std::string set, key, also;
  };
  const std::vector<Case> cases = {
      {"model.n_head=4", "model.n_head", "did you mean 'model.n_heads'?"},
      {"model.d_model", "model.d_model", "expected KEY=VALUE"},
      {"model.d_model=abc", "model.d_model", "expected an integer, got 'abc'"},
      {"=5", "=5", "key before '=' is empty"},
      {"model.moe.top_k=[1, 2]", "model.moe.top_k", "got a list"},
      {"data.train=[a.bin, {x: 1}]", "data.train[1]", "got a map"},
      {"model=5", "model", "is a section"},
      {"train.device=tpu", "train.device", "auto | cpu | cuda"},
      {"optim.lr=[1", "optim.lr", "invalid YAML value"},
      {"model.moe={topk: 1}", "model.moe.topk", "did you mean 'model.moe.top_k'?"},
      {"parallel.cp=2", "parallel.cp", "parallel.cp=2 needs 2 processes, this run has 1"},
  };
  for (const auto& cs : cases) {
    const std::string msg = error_of([&] { load_config_text(kData, "o.yaml", {cs.set}); });
    INFO("--set " << cs.set << "\nmessage: " << msg);
    CHECK(contains(msg, cs.key));
    CHECK(contains(msg, cs.also));
    CHECK_FALSE(contains(msg, "<not a ConfigError>"));
    CHECK_FALSE(contains(msg, "<no error>"));
  }
}

TEST_CASE("config: files that cannot be read", "[config]") {
  const std::string missing = "/nonexistent/dir/run.yaml";
  CHECK(contains(error_of([&] { load_config_file(missing, {}); }), missing));
  const std::string dir = std::filesystem::temp_directory_path().string();
  CHECK(contains(error_of([&] { load_config_file(dir, {}); }), "is a directory"));
  // The repository's example configs must load (they are what the README runs).
  for (const char* name : {"configs/tiny.yaml", "configs/quickstart.yaml"}) {
    const std::string path = std::string(TRAINER_SOURCE_DIR) + "/" + name;
    if (!std::filesystem::exists(path)) continue;
    INFO(path);
    CHECK_NOTHROW(load_config_file(path, {}));
  }
}

namespace {

struct Run {
  int status = -1;
  std::string output;
};

Run run_command(const std::string& cmd) {
  Run r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int raw = pclose(p);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return r;
}

}  // namespace

TEST_CASE("config: the trainer binary reports bad configs with exit code 2", "[config][binary]") {
  const std::string bin = TRAINER_BIN;
  REQUIRE(std::filesystem::exists(bin));
  const auto dir = std::filesystem::temp_directory_path() /
                   ("trainer_config_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);

  const auto cases = bad_cases();
  REQUIRE(cases.size() >= 15);
  int i = 0;
  for (const auto& bc : cases) {
    const auto file = dir / ("bad_" + std::to_string(i++) + ".yaml");
    {
      std::ofstream out(file);
      out << bc.yaml << (bc.add_data ? kData : "");
    }
    const Run r = run_command(bin + " --config '" + file.string() + "' 2>&1");
    INFO("case: " << bc.name << "\noutput: " << r.output);
    CHECK(r.status == 2);
    CHECK(contains(r.output, "error: "));
    CHECK(contains(r.output, bc.key));
    CHECK(contains(r.output, file.string()));
    CHECK_FALSE(contains(r.output, "terminate called"));
    CHECK_FALSE(contains(r.output, "what():"));
  }

  // --set mistakes and a missing file go through the same path.
  const auto good = dir / "good.yaml";
  {
    std::ofstream out(good);
    out << kData;
  }
  for (const auto& [args, key] : std::vector<std::pair<std::string, std::string>>{
           {"--config '" + good.string() + "' --set model.n_head=4", "model.n_heads"},
           {"--config '" + good.string() + "' --set model.d_model", "model.d_model"},
           {"--config '" + good.string() + "' --set parallel.tp=2", "parallel.tp=2 needs 2 processes"},
           {"--config '" + (dir / "missing.yaml").string() + "'", "missing.yaml"}}) {
    const Run r = run_command(bin + " " + args + " 2>&1");
    INFO("args: " << args << "\noutput: " << r.output);
    CHECK(r.status == 2);
    CHECK(contains(r.output, key));
    CHECK_FALSE(contains(r.output, "terminate called"));
    CHECK_FALSE(contains(r.output, "what():"));
  }

  // --print-config output is itself a valid config that prints the same.
  const Run printed = run_command(bin + " --config '" + good.string() + "' --print-config 2>&1");
  CHECK(printed.status == 0);
  const auto again = dir / "printed.yaml";
  {
    std::ofstream out(again);
    out << printed.output;
  }
  const Run reprinted = run_command(bin + " --config '" + again.string() + "' --print-config 2>&1");
  CHECK(reprinted.status == 0);
  const auto body = [](const std::string& s) { return s.substr(s.find('\n')); };  // line 1 names the file
  CHECK(body(reprinted.output) == body(printed.output));
  // What selective recompute drops, as model/recompute.cpp drops it: q, k, v are kept.
  CHECK(contains(printed.output, "selective drops the two norm outputs, the attention output (its core re-run from "
                                 "the kept q, k, v)"));

  std::filesystem::remove_all(dir);
}

TEST_CASE("config: log.trace takes a window of steps and names what is wrong", "[config]") {
  CHECK(parse_step_range("10-12")->first == 10);
  CHECK(parse_step_range("10-12")->last == 12);
  CHECK(parse_step_range("7")->last == 7);
  for (const char* bad : {"", "0", "0-3", "5-4", "a", "3-", "-3", "3-x", "3--4", " 3", "3 - 4", "1e3"})
    CHECK_FALSE(parse_step_range(bad).has_value());
  const Config ok = load_config_text("log: {trace: 3-5}\n", "t.yaml", {"data.train=train.bin"});
  CHECK(ok.log.trace == "3-5");
  const std::string err =
      error_of([&] { load_config_text("log: {trace: 5-3}\n", "t.yaml", {"data.train=train.bin"}); });
  INFO(err);
  CHECK(contains(err, "t.yaml: log.trace='5-3' is not a window of steps"));
  CHECK(contains(error_of([&] { load_config_text("", "t.yaml", {"data.train=train.bin", "log.trace=1-5000"}); }),
                 "spans more than 1000 steps"));
  const Config late = load_config_text("train: {steps: 10}\nlog: {trace: 11-12}\n", "t.yaml", {"data.train=train.bin"});
  const std::vector<std::string> w = config_warnings(late);
  REQUIRE(w.size() == 1);
  CHECK(contains(w[0], "log.trace=11-12 starts after the run's last step (train.steps=10): no timeline is written"));
  CHECK(config_warnings(ok).empty());
}
