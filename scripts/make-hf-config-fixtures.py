#!/usr/bin/env python3
"""Writes the config.json fixtures of tests/data/hf_configs/ with the transformers it runs under.

    python scripts/make-hf-config-fixtures.py tests/data/hf_configs tf4   # under transformers 4.x
    python scripts/make-hf-config-fixtures.py tests/data/hf_configs tf5   # under transformers 5.x

Each file is what `config.save_pretrained()` writes for a small model (transformers 4.x puts
rope_theta at the top level and llama3 scaling in rope_scaling; 5.x puts both in
rope_parameters). Needs only transformers (no PyTorch).
"""
import json
import os
import sys
import tempfile

from transformers import GPT2Config, LlamaConfig
import transformers


def save(cfg, path):
    with tempfile.TemporaryDirectory() as d:
        cfg.save_pretrained(d)
        with open(os.path.join(d, "config.json")) as f:
            j = json.load(f)
    with open(path, "w") as f:
        json.dump(j, f, indent=2, sort_keys=True)
        f.write("\n")
    print("wrote", path, "with transformers", transformers.__version__)


def main():
    out, tag = sys.argv[1], sys.argv[2]
    major = int(transformers.__version__.split(".")[0])
    small = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                 tie_word_embeddings=False)
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    if major >= 5:
        plain = LlamaConfig(**small, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
        scaled = LlamaConfig(**small, rope_parameters=dict(llama3, rope_theta=500000.0))
    else:
        plain = LlamaConfig(**small, rope_theta=500000.0)
        scaled = LlamaConfig(**small, rope_theta=500000.0, rope_scaling=llama3)
    save(plain, os.path.join(out, f"llama_theta500k_{tag}.json"))
    save(scaled, os.path.join(out, f"llama3_scaled_{tag}.json"))
    save(GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=64),
         os.path.join(out, f"gpt2_{tag}.json"))


if __name__ == "__main__":
    main()
