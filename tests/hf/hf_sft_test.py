#!/usr/bin/env python3
"""Fine-tuning on chat data against transformers.

A byte-level BPE tokenizer with a ChatML-like chat template in its
tokenizer_config.json (system, user and assistant turns, BOS first) and a
tiny random Llama saved by transformers. scripts/prepare_corpus.py --chat
turns JSON lines of `messages` into tokens and a loss mask:
  - every conversation's ids equal transformers' apply_chat_template
    (tokenize=True) of it;
  - the kept tokens of each assistant reply decode to exactly the reply
    and its end-of-turn marker, and no other token is kept;
  - --loss-on all writes no mask; a conversation without an assistant
    reply, or whose messages are not {role, content}, is a bad record.
Then the trainer, started from the model directory by `model.init_from`
alone (every model key from its config.json), logs the loss of one step
on one conversation (the only window of a dataset holding just it); it
must equal transformers' loss with labels = the ids, -100 where masked
out, within 1e-5 relative (fp32 both).

Usage: hf_sft_test.py TRAINER SOURCE_DIR WORK_DIR. Exit 77 when
transformers cannot be imported (ctest: skipped).
"""
import json
import os
import shutil
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_interop_test as base  # noqa: E402  (exits 77 without transformers)

torch, transformers = base.torch, base.transformers
check, run = base.check, base.run
TRAINER, SRC, WORK = base.TRAINER, base.SRC, base.WORK
TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")
CONVERSATIONS = [
    [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "What is a license?"},
     {"role": "assistant", "content": "Permission to use something, under conditions."},
     {"role": "user", "content": "And a warranty?"},
     {"role": "assistant", "content": "A promise about quality; free software usually has none."}],
    [{"role": "user", "content": "Say hello."}, {"role": "assistant", "content": "Hello!"}],
    [{"role": "user", "content": "Count to three."}, {"role": "assistant", "content": "One, two, three."},
     {"role": "user", "content": "Backwards?"}, {"role": "assistant", "content": "Three, two, one."}],
]


def make_tokenizer(d):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    licenses = [os.path.join("/usr/share/common-licenses", n) for n in sorted(os.listdir("/usr/share/common-licenses"))]
    tok.train([p for p in licenses if os.path.isfile(p)],
              trainers.BpeTrainer(vocab_size=384, special_tokens=["<s>", "</s>", "<|system|>", "<|user|>",
                                                                  "<|assistant|>", "<|end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.save(os.path.join(d, "tokenizer.json"))
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
               "chat_template": TEMPLATE}, open(os.path.join(d, "tokenizer_config.json"), "w"))
    return tok.get_vocab_size()


def prepare(jsonl, out, *flags, expect_ok=True):
    cmd = [sys.executable, os.path.join(SRC, "scripts", "prepare_corpus.py"), jsonl, "--out-dir", out,
           "--tokenizer-json", os.path.join(WORK, "model", "tokenizer.json"), "--chat", "--progress", "none",
           "--valid-fraction", "0", "--workers", "2", *flags]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if (p.returncode == 0) != expect_ok:
        raise SystemExit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stdout}{p.stderr}")
    return p.stdout + p.stderr


def read_dataset(prefix):
    """Sequences of a uint16 Megatron dataset and its loss mask, split by document."""
    idx = open(prefix + ".idx", "rb").read()
    _, _, seqs, _ = struct.unpack_from("<QBQQ", idx, 9)
    sizes = struct.unpack_from(f"<{seqs}i", idx, 34)
    ids = struct.unpack(f"<{sum(sizes)}H", open(prefix + ".bin", "rb").read())
    mask = open(prefix + ".lossmask", "rb").read()[16:] if os.path.exists(prefix + ".lossmask") else None
    out, at = [], 0
    for n in sizes:
        out.append((list(ids[at:at + n]), None if mask is None else list(mask[at:at + n])))
        at += n
    return out


def check_rendering(hf_tok):
    jsonl = os.path.join(WORK, "chat.jsonl")
    with open(jsonl, "w") as f:
        for c in CONVERSATIONS:
            f.write(json.dumps({"messages": c}) + "\n")
        f.write(json.dumps({"messages": [{"role": "user", "content": "no reply"}]}) + "\n")
        f.write(json.dumps({"messages": [{"speaker": "user", "text": "x"}]}) + "\n")
    out = prepare(jsonl, os.path.join(WORK, "chat"))
    print(out.strip())
    check("2 bad records left out" in out and "no assistant message" in out and "string role and content" in out,
          "conversations without a reply or without role/content are bad records, counted")
    docs = read_dataset(os.path.join(WORK, "chat", "train"))
    check(len(docs) == len(CONVERSATIONS), f"{len(docs)} conversations prepared")
    for conv, (ids, mask) in zip(CONVERSATIONS, docs):
        want = hf_tok.apply_chat_template(conv, tokenize=True)
        check(ids == want, f"ids of a {len(conv)}-message conversation equal apply_chat_template's ({len(ids)} tokens)")
        kept = [[]]
        for t, m in zip(ids, mask):
            if m:
                kept[-1].append(t)
            elif kept[-1]:
                kept.append([])
        kept = [k for k in kept if k]
        replies = [m["content"] + "<|end|>\n" for m in conv if m["role"] == "assistant"]
        got = [hf_tok.decode(k) for k in kept]
        check(got == replies, f"the kept tokens are the assistant replies and their end marker: {got}")
    prepare(jsonl, os.path.join(WORK, "chat_all"), "--loss-on", "all")
    check(not os.path.exists(os.path.join(WORK, "chat_all", "train.lossmask")), "--loss-on all writes no mask")
    return docs


def check_loss(docs):
    model_dir = os.path.join(WORK, "model")
    ids, mask = docs[0]
    one = os.path.join(WORK, "one.jsonl")
    with open(one, "w") as f:
        f.write(json.dumps({"messages": CONVERSATIONS[0]}) + "\n")
    prepare(one, os.path.join(WORK, "one"))
    T = len(ids) - 1
    yaml = os.path.join(WORK, "sft.yaml")
    with open(yaml, "w") as f:
        f.write(f"model: {{init_from: {model_dir}}}\n"
                f"train: {{steps: 1, seq_len: {T}, micro_batch_size: 1, global_batch_size: 1, eval_interval: 0}}\n"
                f"optim: {{lr: 1.0e-30, warmup_steps: 0}}\n"
                f"data: {{train: [{WORK}/one/train], documents: separate}}\n"
                f"log: {{interval: 1, progress: lines}}\nrun: {{dir: {WORK}/run}}\n")
    p = run(["--config", yaml])
    check("the keys the configuration leaves unset: model.arch=llama" in p.stdout,
          "model.init_from alone: the architecture comes from config.json")
    check("loss on " in p.stdout, "the data line reports the loss mask")
    losses = [json.loads(l)["loss"] for l in open(os.path.join(WORK, "run", "metrics.jsonl")) if '"loss"' in l]
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    labels = torch.tensor([t if m else -100 for t, m in zip(ids, mask)])
    with torch.no_grad():
        hf_loss = model(torch.tensor([ids]), labels=labels[None]).loss.item()
    err = abs(losses[0] - hf_loss) / abs(hf_loss)
    print(f"trainer step-1 loss {losses[0]:.7f}, transformers (labels -100 where masked) {hf_loss:.7f}, rel {err:.1e}")
    check(err < 1e-5, f"the trainer's masked loss equals transformers' within 1e-5 (rel {err:.1e})")


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    model_dir = os.path.join(WORK, "model")
    os.makedirs(model_dir)
    vocab = make_tokenizer(model_dir)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                                   initializer_range=0.1, bos_token_id=0, eos_token_id=1)
    transformers.LlamaForCausalLM(cfg).save_pretrained(model_dir, safe_serialization=True)
    hf_tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    docs = check_rendering(hf_tok)
    check_loss(docs)
    if base.failures:
        print(f"{len(base.failures)} check(s) failed")
        sys.exit(1)
    print("hf_sft: all checks passed")


main()
