#!/usr/bin/env python3
"""transformers anchor for tetrad's mixture-of-experts benchmark (issue 32, bench/moe.sh).

Trains transformers' own MixtralForCausalLM (what a user would run instead of tetrad), or the
dense MistralForCausalLM of the same active parameters (--dense: one SwiGLU MLP of width
k x the expert width), on random tokens and times whole training steps: forward with the
router's auxiliary loss (output_router_logits, router_aux_loss_coef 0.001: the objective tetrad
trains), loss, backward, gradient clipping at 1 and AdamW. Modes: eager and torch.compile, each
on a fresh model after its own warm-up; fp32, or bf16 autocast around the forward and loss. One
JSON line: per mode the median step time and tokens/s, and the faster mode.

The shape is issue 32's (8 experts, top 2, hidden 512, expert width 1408, 4 layers, 8 heads with
2 key/value heads, vocabulary 8192, batch 4 x 512); every field can be overridden. Needs
torch and transformers 5 (the venv of TETRAD_HF_VENV, /tmp/tetrad-hf5 or .venv-pytorch).
"""
import argparse
import json
import os
import sys

from anchor_timing import (next_token_loss, random_batch, run_modes, set_thread_env, time_steps,
                           training_step)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dense", action="store_true",
                   help="MistralForCausalLM with ffn = k x expert width (same active parameters)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--expert-ffn", type=int, default=1408)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="bf16 = torch.autocast('cpu', dtype=torch.bfloat16) around forward+loss")
    p.add_argument("--steps", type=int, default=3, help="timed steps")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps before the timed ones")
    p.add_argument("--modes", default="eager,compile", help="comma list of eager, compile")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    for m in a.modes.split(","):
        if m not in ("eager", "compile"):
            p.error(f"--modes: expected eager and/or compile, got {m!r}")
    if a.steps < 1 or a.warmup < 0 or a.threads < 1:
        p.error("need --steps >= 1, --warmup >= 0, --threads >= 1")
    return a


args = parse_args(sys.argv[1:])
set_thread_env(args.threads)  # before torch starts its thread pools

import torch  # noqa: E402
import transformers  # noqa: E402

torch.set_num_threads(args.threads)
torch.set_num_interop_threads(args.threads)


def make_model(a):
    common = dict(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
                  num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                  max_position_embeddings=a.seq, rope_theta=1e6, rms_norm_eps=1e-5,
                  tie_word_embeddings=False, sliding_window=None, attention_dropout=0.0,
                  attn_implementation="sdpa")
    if a.dense:
        cfg = transformers.MistralConfig(intermediate_size=a.top_k * a.expert_ffn, **common)
        return transformers.MistralForCausalLM(cfg)
    cfg = transformers.MixtralConfig(intermediate_size=a.expert_ffn, num_local_experts=a.experts,
                                     num_experts_per_tok=a.top_k, router_aux_loss_coef=0.001,
                                     output_router_logits=True, router_jitter_noise=0.0,
                                     **common)
    return transformers.MixtralForCausalLM(cfg)


def active_flops_per_token(model, a):
    """tetrad's convention (model/flops.cpp): 6 x the active matmul parameters (the k experts a
    token is routed to and the router, not every expert) + causal attention counted as half:
    6 L C T. Embedding lookups are not products."""
    C, L, F_ = a.hidden, a.layers, a.expert_ffn
    hd = C // a.heads
    attn = C * (a.heads * hd) + 2 * C * (a.kv_heads * hd) + (a.heads * hd) * C
    mlp = a.top_k * 3 * C * F_ + (0 if a.dense else a.experts * C)
    matmul = L * (attn + mlp) + a.vocab * C
    return 6.0 * matmul + 6.0 * L * C * a.seq


def run_mode(a, mode):
    torch.manual_seed(a.seed)
    model = make_model(a)
    model.train()
    fwd = torch.compile(model) if mode == "compile" else model
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1)
    x, y = random_batch(a.vocab, a.batch, a.seq, a.seed + 1)

    def loss_of():
        out = fwd(input_ids=x)
        loss = next_token_loss(out.logits, y)
        if not a.dense:  # the router's auxiliary loss, weighted as MixtralForCausalLM does
            loss = loss + model.config.router_aux_loss_coef * out.aux_loss.float()
        return loss

    step = training_step(model, opt, loss_of, a.precision)
    times, losses = time_steps(step, mode, a.warmup, a.steps)
    return model, times, losses


def main(a):
    per_mode, best, results = run_modes(a.modes.split(","), lambda mode: run_mode(a, mode),
                                        a.batch * a.seq)
    for mode, (_, _, losses) in results.items():
        per_mode[mode]["loss_last"] = losses[-1]
    model = results[best][0]
    fpt = active_flops_per_token(model, a)
    print(json.dumps({
        "anchor": "transformers", "model": "MistralForCausalLM" if a.dense else "MixtralForCausalLM",
        "torch_version": torch.__version__, "transformers_version": transformers.__version__,
        "precision": a.precision, "threads": torch.get_num_threads(),
        "layers": a.layers, "hidden": a.hidden, "heads": a.heads, "kv_heads": a.kv_heads,
        "experts": 0 if a.dense else a.experts, "top_k": a.top_k, "expert_ffn": a.expert_ffn,
        "vocab": a.vocab, "seq": a.seq, "batch": a.batch,
        "params": sum(p.numel() for p in model.parameters()),
        "active_flops_per_token": fpt, "modes": per_mode, "best_mode": best,
        "tokens_per_s": per_mode[best]["tokens_per_s"], "warmup": a.warmup, "steps": a.steps,
    }), flush=True)


if __name__ == "__main__":
    main(args)
