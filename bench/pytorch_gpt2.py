#!/usr/bin/env python3
"""PyTorch anchor for tetrad's training benchmarks (docs/benchmarks.md).

Trains the same model tetrad trains -- GPT-2 or Llama, built from arguments -- on random tokens
and times whole training steps: forward, loss, backward, gradient clipping and the AdamW step.
Prints one JSON line with the median step time and tokens/s, to be set beside tetrad's own
numbers for the same configuration, thread count and step count.

The anchor is a current PyTorch 2.x from PyPI in a venv (bench/setup-pytorch.sh makes it:
.venv-pytorch/bin/python bench/pytorch_gpt2.py). With PyTorch 2 attention is
F.scaled_dot_product_attention (causal); --modes eager,compile times the eager model and the
torch.compile'd one (each after its own warm-up) and reports both, "tokens_per_s" being the faster
(what a user would pick). Debian 12's PyTorch 1.13 still runs (explicit masked softmax, eager
only), but is no longer the anchor.

What it deliberately does not do: no dropout, no data loading, no mixed-precision loss scaling
(bf16 needs none).
"""
import argparse
import json
import math
import os
import resource
import statistics
import sys

from anchor_timing import (next_token_loss, random_batch, run_modes, set_thread_env, time_steps,
                           training_step)

# name: (family, layers, hidden, heads, kv_heads, ffn, vocab, seq, batch) -- docs/benchmarks.md
# and tetrad's named_model() (src/tetrad/model/model_config.cpp).
CONFIGS = {
    "tiny": ("gpt2", 2, 64, 4, 4, 256, 512, 64, 4),
    "small": ("gpt2", 6, 512, 8, 8, 2048, 8192, 512, 4),
    "gpt2-124m": ("gpt2", 12, 768, 12, 12, 3072, 50304, 1024, 1),
    "llama-tiny": ("llama", 2, 64, 4, 2, 192, 512, 64, 4),
    "llama-small": ("llama", 6, 512, 8, 4, 1408, 8192, 512, 4),
}
FIELDS = ("family", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq", "batch")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", choices=sorted(CONFIGS), help="named configuration (explicit "
                   "size arguments override its fields)")
    p.add_argument("--family", choices=["gpt2", "llama"])
    p.add_argument("--layers", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--kv-heads", type=int, help="Llama grouped-query attention (default: heads)")
    p.add_argument("--ffn", type=int, help="MLP inner size (default: 4*hidden)")
    p.add_argument("--vocab", type=int)
    p.add_argument("--seq", type=int)
    p.add_argument("--batch", type=int)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="bf16 = torch.autocast('cpu', dtype=torch.bfloat16) around forward+loss")
    p.add_argument("--steps", type=int, default=5, help="timed steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before the timed ones")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--modes", default="eager,compile",
                   help="comma list of eager, compile (torch.compile); the faster is reported")
    p.add_argument("--attention", choices=["sdpa", "explicit"], default="sdpa",
                   help="sdpa = F.scaled_dot_product_attention (PyTorch 2), explicit = masked "
                   "softmax (what PyTorch 1.13 offers)")
    a = p.parse_args(argv)
    given = {f: getattr(a, f) for f in FIELDS}
    base = dict(zip(FIELDS, CONFIGS[a.config or "tiny"]))
    for f in FIELDS:
        if getattr(a, f) is None:
            setattr(a, f, base[f])
    # Sizes derived from others follow them unless the named configuration fixes them.
    if given["kv_heads"] is None and (a.config is None or given["heads"] is not None):
        a.kv_heads = a.heads
    if given["ffn"] is None and (a.config is None or given["hidden"] is not None):
        a.ffn = 4 * a.hidden
    if a.family == "gpt2" and a.kv_heads != a.heads:
        p.error("--kv-heads: GPT-2 has no grouped-query attention")
    if a.hidden % a.heads or a.heads % a.kv_heads:
        p.error("heads must divide hidden and kv-heads must divide heads")
    if a.steps < 1 or a.warmup < 0 or a.threads < 1:
        p.error("need --steps >= 1, --warmup >= 0, --threads >= 1")
    return a


args = parse_args(sys.argv[1:])
for _m in args.modes.split(","):
    if _m not in ("eager", "compile"):
        sys.exit(f"--modes: expected eager and/or compile, got {_m!r}")
set_thread_env(args.threads)  # before torch (and its OpenMP/BLAS) start

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")
if args.attention == "sdpa" and not HAVE_SDPA:
    args.attention = "explicit"  # PyTorch 1.x

torch.set_num_threads(args.threads)
torch.set_num_interop_threads(args.threads)


# ------------------------------------------------------------------------------------- GPT-2

class CausalSelfAttention(nn.Module):
    """GPT-2 attention: fused qkv projection (c_attn), explicit masked softmax, c_proj."""

    def __init__(self, C, nh, seq):
        super().__init__()
        self.nh = nh
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq, dtype=torch.bool))
                             .view(1, 1, seq, seq), persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.nh, C // self.nh).transpose(1, 2)  # (B, nh, T, hd)
        k = k.view(B, T, self.nh, C // self.nh).transpose(1, 2)
        v = v.view(B, T, self.nh, C // self.nh).transpose(1, 2)
        if args.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class GPT2Block(nn.Module):
    def __init__(self, C, nh, ffn, seq):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.attn = CausalSelfAttention(C, nh, seq)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.c_fc = nn.Linear(C, ffn)
        self.c_proj = nn.Linear(ffn, C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    """GPT-2: learned positions, pre-LayerNorm with bias, GELU-tanh, tied output head."""

    def __init__(self, a):
        super().__init__()
        self.wte = nn.Embedding(a.vocab, a.hidden)
        self.wpe = nn.Embedding(a.seq, a.hidden)
        self.h = nn.ModuleList(GPT2Block(a.hidden, a.heads, a.ffn, a.seq) for _ in range(a.layers))
        self.ln_f = nn.LayerNorm(a.hidden, eps=1e-5)
        self.lm_head = nn.Linear(a.hidden, a.vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for name, p in self.named_parameters():  # GPT-2 initialisation
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * a.layers) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# ------------------------------------------------------------------------------------- Llama

class RMSNorm(nn.Module):
    def __init__(self, C, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(C))

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.type_as(x)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LlamaAttention(nn.Module):
    """Llama attention as in Hugging Face: q/k/v/o without bias, rotary (rotate_half), GQA."""

    def __init__(self, C, nh, nkv, seq, theta=10000.0):
        super().__init__()
        self.nh, self.nkv, self.hd = nh, nkv, C // nh
        self.q_proj = nn.Linear(C, nh * self.hd, bias=False)
        self.k_proj = nn.Linear(C, nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(C, nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(nh * self.hd, C, bias=False)
        inv_freq = 1.0 / (theta ** (torch.arange(0, self.hd, 2).float() / self.hd))
        freqs = torch.outer(torch.arange(seq).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)  # (seq, hd)
        self.register_buffer("cos", emb.cos()[None, None], persistent=False)
        self.register_buffer("sin", emb.sin()[None, None], persistent=False)
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq, dtype=torch.bool))
                             .view(1, 1, seq, seq), persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        cos, sin = self.cos[:, :, :T].to(q.dtype), self.sin[:, :, :T].to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.nkv != self.nh:  # HF repeat_kv
            k = k.repeat_interleave(self.nh // self.nkv, dim=1)
            v = v.repeat_interleave(self.nh // self.nkv, dim=1)
        if args.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o_proj(y.transpose(1, 2).contiguous().view(B, T, self.nh * self.hd))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hd))
        att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
        att = F.softmax(att.float(), dim=-1).to(q.dtype)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, self.nh * self.hd)
        return self.o_proj(y)


class LlamaBlock(nn.Module):
    def __init__(self, a, eps):
        super().__init__()
        self.input_layernorm = RMSNorm(a.hidden, eps)
        self.self_attn = LlamaAttention(a.hidden, a.heads, a.kv_heads, a.seq)
        self.post_attention_layernorm = RMSNorm(a.hidden, eps)
        self.gate_proj = nn.Linear(a.hidden, a.ffn, bias=False)
        self.up_proj = nn.Linear(a.hidden, a.ffn, bias=False)
        self.down_proj = nn.Linear(a.ffn, a.hidden, bias=False)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    """Llama: RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention, untied head."""

    def __init__(self, a, eps=1e-6):
        super().__init__()
        self.embed_tokens = nn.Embedding(a.vocab, a.hidden)
        self.layers = nn.ModuleList(LlamaBlock(a, eps) for _ in range(a.layers))
        self.norm = RMSNorm(a.hidden, eps)
        self.lm_head = nn.Linear(a.hidden, a.vocab, bias=False)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx):
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


# ------------------------------------------------------------------------------------- timing

def flops_per_token(model, a):
    """tetrad's convention (model_config.cpp): 6*N_matmul + 12*L*C*T, causal not discounted."""
    n = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    return 6.0 * n + 12.0 * a.layers * a.hidden * a.seq


def loaded_blas():
    """The BLAS/oneDNN libraries mapped into this process (Debian's torch uses libblas.so.3)."""
    libs = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                if any(s in path for s in ("blas", "mkl", "dnnl")):
                    libs.add(os.path.realpath(path))
    except OSError:
        pass
    return sorted(libs)


def run_mode(a, mode):
    """Median step time and losses of one mode (eager or torch.compile) on a fresh model."""
    torch.manual_seed(a.seed)
    model = GPT2(a) if a.family == "gpt2" else Llama(a)
    model.train()
    fwd = torch.compile(model) if mode == "compile" else model
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    x, y = random_batch(a.vocab, a.batch, a.seq, a.seed + 1)
    step = training_step(model, opt, lambda: next_token_loss(fwd(x), y), a.precision)
    times, losses = time_steps(step, mode, a.warmup, a.steps)
    return model, times, losses


def main(a):
    modes = a.modes.split(",")
    if "compile" in modes and not hasattr(torch, "compile"):
        print("torch.compile unavailable (PyTorch 1.x): eager only", file=sys.stderr)
        modes = [m for m in modes if m != "compile"]
    per_mode, best, results = run_modes(modes, lambda mode: run_mode(a, mode), a.batch * a.seq)
    model, times, losses = results[best]

    med = statistics.median(times)
    n_params = sum(p.numel() for p in model.parameters())
    fpt = flops_per_token(model, a)
    tps = a.batch * a.seq / med
    out = {
        "anchor": "pytorch",
        "torch_version": torch.__version__,
        "family": a.family,
        "config": a.config,
        "layers": a.layers, "hidden": a.hidden, "heads": a.heads, "kv_heads": a.kv_heads,
        "ffn": a.ffn, "vocab": a.vocab, "seq": a.seq, "batch": a.batch,
        "params": n_params,
        "threads": torch.get_num_threads(),
        "precision": a.precision,
        "attention": a.attention,
        "best_mode": best,
        "modes": per_mode,
        "warmup": a.warmup, "steps": a.steps,
        "step_s": [round(t, 6) for t in times],
        "median_step_s": med,
        "tokens_per_s": tps,
        "flops_per_token": fpt,
        "flops_formula": "6*N_matmul + 12*L*C*T",
        "model_gflops_per_s": fpt * tps * 1e-9,
        "loss_first": losses[0], "loss_last": losses[-1],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "blas": loaded_blas(),
    }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(args)
