"""Answers the demo's question about examples/demo-document.txt with
SmolLM2-135M-Instruct in Hugging Face transformers, its KV cache in a
private kvtrimd: once with the full cache, once with KVzap (the shipped
MLP scorer at its threshold for 75%) evicting; prints each answer and the
KV bytes the daemon held for it.

    python examples/python/answer.py [--gguf PATH] [--policy SPEC ...]

Run from the repository root, in the environment of
scripts/python_venv.sh (`make models` fetched the GGUF).
"""
import argparse
import os
import time

import torch
import transformers
from transformers import AutoModelForCausalLM

import kvtrim
import kvtrim.hf

QUESTION = "What was the name of the test machine the first kvtrimd ran on?"


def tau(target):
    with open("weights/smollm2/calibration.txt") as f:
        for line in f:
            w = line.split()
            if len(w) == 3 and w[0] == "kvzap-mlp" and float(w[1]) == target:
                return w[2]
    raise SystemExit("no kvzap-mlp threshold for %s" % target)


def main():
    cache_dir = os.environ.get("KVTRIM_MODELS") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
        "kvtrim", "models")
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=os.path.join(
        cache_dir, "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--doc", default="examples/demo-document.txt")
    ap.add_argument("--policy", nargs="*", default=[
        "full",
        "kvzap:model=weights/smollm2/kvzap-mlp,threshold=%s,window=32,"
        "sinks=4" % tau(0.75)])
    a = ap.parse_args()
    transformers.utils.logging.disable_progress_bar()
    transformers.logging.set_verbosity_error()
    d, f = os.path.split(os.path.abspath(a.gguf))
    tok = kvtrim.hf.load_tokenizer(a.gguf)
    model = AutoModelForCausalLM.from_pretrained(
        d, gguf_file=f, dtype=torch.float32, attn_implementation="kvtrim")
    doc = open(a.doc).read()
    msgs = [{"role": "user", "content": doc + "\n\n" + QUESTION}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    n = ids["input_ids"].shape[1]
    print(f"{n} prompt tokens; question: {QUESTION}")
    with kvtrim.Daemon(pool_size="512M") as daemon:
        for spec in a.policy:
            with kvtrim.hf.KVTrimCache(model, policy=spec,
                                       runtime_dir=daemon.runtime_dir,
                                       chunk=n, max_tokens=n + 64) as cache:
                t0 = time.time()
                out = model.generate(**ids, past_key_values=cache,
                                     max_new_tokens=32, do_sample=False)
                dt = time.time() - t0
                st = cache.stats()
                answer = tok.decode(out[0, n:], skip_special_tokens=True)
                print(f"{spec}\n  KV {st['kv_bytes'] / 2**20:.1f} MiB, "
                      f"kept {st['entries_kept']} of "
                      f"{st['entries_appended']} entries, {dt:.1f} s\n"
                      f"  answer: {answer.strip()}")


if __name__ == "__main__":
    main()
