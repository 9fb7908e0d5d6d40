#!/usr/bin/env python3
"""Check a tetrad checkpoint against Hugging Face transformers.

Loads a checkpoint folder (save_hf's output, or a run checkpoint step_NNNNNN/) with
transformers' AutoModelForCausalLM, runs it on a token sequence and compares its logits with
reference logits computed by tetrad:

    scripts/hf_check.py CKPT_DIR TOKENS.json REF_LOGITS.bin [--rtol 1e-4] [--dump HF_LOGITS.bin]

TOKENS.json      a JSON list of token ids, e.g. [464, 2068, 7586]
REF_LOGITS.bin   raw float32 little-endian, shape [T, V] (T tokens, V = vocab_size)

It prints the largest absolute difference and that difference relative to the largest
reference logit, and exits 0 when the relative difference is within --rtol (default 1e-4),
1 when it is not, 2 when the inputs are unusable. --dump also writes transformers' logits in
the same raw layout (to compare the other way round).

Not part of CTest: it needs PyTorch and transformers, which the build does not. To install
them on Debian 12 (torch 1.13 from Debian, a transformers release that still supports it):

    apt-get install python3-torch
    python3 -m venv --system-site-packages /tmp/hfenv
    /tmp/hfenv/bin/pip install 'transformers<4.37'
    /tmp/hfenv/bin/python scripts/hf_check.py ...
"""
import argparse
import json
import os
import struct
import sys


def fail(msg):
    print(f"hf_check: {msg}", file=sys.stderr)
    sys.exit(2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", help="folder with config.json and model.safetensors")
    ap.add_argument("tokens", help="JSON list of token ids")
    ap.add_argument("ref_logits", help="raw float32 little-endian logits [T, V]")
    ap.add_argument("--rtol", type=float, default=1e-4,
                    help="tolerance on max|diff| / max|ref| (default 1e-4)")
    ap.add_argument("--dump", help="also write transformers' logits here (raw float32 [T, V])")
    args = ap.parse_args()

    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError as e:
        fail(f"{e}; install PyTorch and transformers (see the top of this script)")

    with open(args.tokens) as f:
        tokens = json.load(f)
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, int) for t in tokens):
        fail(f"{args.tokens}: expected a non-empty JSON list of integers")

    model = AutoModelForCausalLM.from_pretrained(args.checkpoint, torch_dtype=torch.float32)
    model.eval()
    vocab = model.config.vocab_size
    if max(tokens) >= vocab or min(tokens) < 0:
        fail(f"{args.tokens}: token ids must lie in [0, {vocab})")
    with torch.no_grad():
        logits = model(torch.tensor([tokens], dtype=torch.long)).logits[0].float()  # [T, V]
    T, V = logits.shape

    size = os.path.getsize(args.ref_logits)
    if size != T * V * 4:
        fail(f"{args.ref_logits}: {size} bytes, but {T} tokens x {V} vocabulary x 4 bytes = "
             f"{T * V * 4} were expected")
    with open(args.ref_logits, "rb") as f:
        ref = torch.tensor(struct.unpack(f"<{T * V}f", f.read()), dtype=torch.float32).view(T, V)

    if args.dump:
        with open(args.dump, "wb") as f:
            f.write(struct.pack(f"<{T * V}f", *logits.flatten().tolist()))

    diff = (logits - ref).abs()
    max_abs = diff.max().item()
    scale = max(ref.abs().max().item(), 1e-30)
    rel = max_abs / scale
    t, v = divmod(int(diff.argmax().item()), V)
    print(f"{type(model).__name__} from {args.checkpoint}: {T} tokens, vocabulary {V}")
    print(f"max |logit difference| = {max_abs:.3e} at token {t}, id {v} "
          f"(transformers {logits[t, v].item():.6g}, reference {ref[t, v].item():.6g})")
    print(f"relative to max |reference logit| {scale:.4g}: {rel:.3e} (tolerance {args.rtol:g})")
    if not rel <= args.rtol:  # also fails on NaN
        print("FAIL: logits differ beyond the tolerance")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
