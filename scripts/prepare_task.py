#!/usr/bin/env python3
"""Pre-tokenizes a multiple-choice task (HellaSwag's JSON lines) for `trainer eval` and
train.eval_task, for tokenizers the binary cannot encode with (a Hugging Face tokenizer.json).

Each line {"ctx" (or "context"), "endings", "label"} gets "context_ids" and "endings_ids":
the ids of the context, and of each continuation " " + ending as lm-eval cuts them (the whole
text encoded, the context's own ids taken off its front). The text fields stay, so acc_norm
can divide by each ending's length in bytes. Hugging Face's hellaswag rows ("ctx_a", "ctx_b",
"activity_label") are joined as lm-eval's hellaswag task joins them.

  .venv-hf/bin/python scripts/prepare_task.py TASK.jsonl --tokenizer-json tokenizer.json --out TASK.ids.jsonl
"""
import argparse
import json
import re
import sys


def hellaswag_ctx(row):
    """lm-eval's hellaswag query: activity label, ctx_a and the capitalised ctx_b."""
    ctx = row["ctx_a"] + " " + row["ctx_b"].capitalize()
    return clean(row.get("activity_label", "") + ": " + ctx if row.get("activity_label") else ctx)


def clean(text):
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("task")
    ap.add_argument("--tokenizer-json", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    try:
        from tokenizers import Tokenizer
    except ImportError:
        sys.exit("prepare_task: needs the tokenizers package (run it with .venv-hf/bin/python)")
    tok = Tokenizer.from_file(a.tokenizer_json)
    enc = lambda s: tok.encode(s, add_special_tokens=False).ids
    n = 0
    with open(a.task, encoding="utf-8") as f, open(a.out, "w", encoding="utf-8") as out:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if "ctx_a" in row:
                row["ctx"] = hellaswag_ctx(row)
                row["endings"] = [clean(e) for e in row["endings"]]
            ctx = row.get("ctx", row.get("context"))
            if not isinstance(ctx, str) or not isinstance(row.get("endings"), list):
                sys.exit(f"prepare_task: {a.task}, line {line_no}: needs \"ctx\" (or \"context\") and \"endings\"")
            c = enc(ctx)
            ends = []
            for e in row["endings"]:
                whole = enc(ctx + " " + e)
                if whole[:len(c)] != c:
                    sys.exit(f"prepare_task: {a.task}, line {line_no}: the context encodes differently inside the "
                             "whole text")
                ends.append(whole[len(c):])
            row["context_ids"], row["endings_ids"] = c, ends
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    print(f"prepare_task: {n} examples -> {a.out}")


if __name__ == "__main__":
    main()
