#!/usr/bin/env python3
"""Makes small Hugging Face models with transformers (random weights, fixed seed) for
scripts/check-hf-parity.sh, and compares logit files.

    hf_make.py make KIND OUT_DIR TOKENS.json   # save_pretrained + OUT_DIR/hf_logits.bin
    hf_make.py compare A.bin B.bin [--rtol 1e-4]
    hf_make.py qwen2-tokenizer OUT_DIR TEXT    # Qwen2's tokenizer.json, trained on TEXT

KIND: gpt2 | llama-gqa | llama-tied | llama-theta500k | llama3-scaled | qwen2 | qwen2-tied |
qwen3 | qwen3-tied. The qwen3 kinds are Qwen3ForCausalLM of the qwen2 kinds' sizes with heads 24
wide (head_dim 24, not hidden / heads = 16) and random (not 1) q_norm / k_norm weights.
The qwen2 kinds are Qwen2ForCausalLM of the same sizes as llama-gqa (qwen2-tied: tied
embeddings, 4 key/value heads), rope theta 1000000, with random (non-zero) q/k/v biases. The
qwen2 tokenizer is transformers' Qwen2Tokenizer (its NFC normalizer, Split regex, byte-level
BPE and special tokens) over 1000 ids trained on TEXT. The Llama kinds have 2
layers, hidden 64, 4 heads (2 key/value heads for GQA), vocabulary 8192; theta500k sets rope theta
500000, llama3-scaled adds Llama 3.1's scaling (factor 8, low/high frequency factors 1 and 4,
original context 64, so the 128-position model (head dim 16) has a frequency in every band). The config is
written the way the running transformers writes it (5.x: rope_parameters; 4.x: rope_theta and
rope_scaling). Logits are raw float32 little-endian [T, V], as `tetrad logits` writes them.
"""
import json
import struct
import sys


def make(kind, out, tokens_path):
    import torch
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1234)
    major = int(transformers.__version__.split(".")[0])
    with open(tokens_path) as f:
        tokens = json.load(f)
    if kind == "gpt2":
        cfg = GPT2Config(vocab_size=8192, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = GPT2LMHeadModel(cfg)
    elif kind.startswith("qwen2") or kind.startswith("qwen3"):
        tied = kind.endswith("-tied")
        kw = dict(vocab_size=8192, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4 if tied else 2,
                  max_position_embeddings=128, tie_word_embeddings=tied, rms_norm_eps=1e-6)
        if kind.startswith("qwen3"):
            from transformers import Qwen3Config as Config, Qwen3ForCausalLM as Model
            kw["head_dim"] = 24
        else:
            Config, Model = Qwen2Config, Qwen2ForCausalLM
        if major >= 5:
            cfg = Config(**kw, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
        else:
            cfg = Config(**kw, rope_theta=1e6)
        model = Model(cfg)
        # transformers initialises norms to 1 and biases to 0; make them matter.
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "norm" in n or n.endswith(".bias"):
                    p.add_(0.1 * torch.randn_like(p))
    else:
        theta = 500000.0 if kind in ("llama-theta500k", "llama3-scaled") else 10000.0
        scaling = None
        if kind == "llama3-scaled":
            scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
        kw = dict(vocab_size=8192, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2 if kind != "llama-tied" else 4,
                  max_position_embeddings=128, tie_word_embeddings=kind == "llama-tied",
                  rms_norm_eps=1e-6)
        if major >= 5:
            rp = dict(scaling or {"rope_type": "default"}, rope_theta=theta)
            cfg = LlamaConfig(**kw, rope_parameters=rp)
        else:
            cfg = LlamaConfig(**kw, rope_theta=theta, rope_scaling=scaling)
        model = LlamaForCausalLM(cfg)
        # transformers initialises norms to 1; make them matter.
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "norm" in n:
                    p.add_(0.1 * torch.randn_like(p))
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    with torch.no_grad():
        logits = model(torch.tensor([tokens], dtype=torch.long)).logits[0].float()
    with open(f"{out}/hf_logits.bin", "wb") as f:
        f.write(struct.pack(f"<{logits.numel()}f", *logits.flatten().tolist()))
    print(f"{kind}: {type(model).__name__} saved to {out} with transformers {transformers.__version__}")


def qwen2_tokenizer(out, text_path):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from tokenizers import Regex
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    # Trained with Qwen2's own pipeline, then handed to Qwen2Tokenizer, which sets it again.
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    with open(text_path, encoding="utf-8", errors="replace") as f:
        tok.train_from_iterator(f.read().splitlines(), trainer)
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    q = Qwen2Tokenizer(vocab=model["vocab"], merges=merges)
    q.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    q.save_pretrained(out)
    print(f"Qwen2Tokenizer ({len(q)} ids) saved to {out}")


def compare(a_path, b_path, rtol):
    def read(p):
        with open(p, "rb") as f:
            data = f.read()
        return struct.unpack(f"<{len(data) // 4}f", data)
    a, b = read(a_path), read(b_path)
    if len(a) != len(b):
        print(f"FAIL: {a_path} has {len(a)} values, {b_path} {len(b)}")
        return 1
    max_abs = max(abs(x - y) for x, y in zip(a, b))
    scale = max(max(abs(x) for x in b), 1e-30)
    rel = max_abs / scale
    print(f"max |logit difference| = {max_abs:.3e}; relative to max |reference logit| {scale:.4g}: "
          f"{rel:.3e} (tolerance {rtol:g})")
    if not rel <= rtol:
        print("FAIL: logits differ beyond the tolerance")
        return 1
    print("OK")
    return 0


def main():
    if len(sys.argv) >= 5 and sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3], sys.argv[4])
        return 0
    if len(sys.argv) >= 4 and sys.argv[1] == "qwen2-tokenizer":
        qwen2_tokenizer(sys.argv[2], sys.argv[3])
        return 0
    if len(sys.argv) >= 4 and sys.argv[1] == "compare":
        rtol = float(sys.argv[5]) if len(sys.argv) >= 6 and sys.argv[4] == "--rtol" else 1e-4
        return compare(sys.argv[2], sys.argv[3], rtol)
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
