#!/usr/bin/env python3
"""Makes small random mixture-of-experts models with transformers 5 for
scripts/check-hf-moe-parity.sh, and reports their losses.

    hf_moe.py make KIND OUT_DIR TOKENS.json
        save_pretrained(OUT_DIR) (the Hub's per-expert tensors; KIND *-fused: transformers 5's
        fused 3-D expert tensors, save_original_format=False), OUT_DIR/hf_logits.bin (float32
        little-endian [T, V], as `tetrad logits` writes) and OUT_DIR/hf_loss.json: the
        cross-entropy of TOKENS predicting their successors, transformers' auxiliary loss
        (load_balancing_loss_func over every layer's router logits at once), its loss with the
        aux term (output_router_logits=True), and the aux loss tetrad computes (each layer's
        Switch loss, averaged over the layers; docs/moe.md).

KIND: mixtral | mixtral-tied | mixtral-fused | qwen3-moe | qwen3-moe-norm | qwen3-moe-fused |
      qwen2-moe | qwen2-moe-tied | qwen2-moe-fused.
  mixtral        MixtralForCausalLM, 2 layers, hidden 64, 4 heads / 2 key-value heads, 4 experts of
                 width 96, top 2, vocabulary 8192, 128 positions, rope theta 1e6 (the defaults).
  mixtral-tied   tied embeddings, 8 experts, top 3, 4 key/value heads, theta 10000.
  mixtral-fused  mixtral saved with save_original_format=False (mlp.experts.gate_up_proj).
  qwen3-moe      Qwen3MoeForCausalLM: 2 layers, hidden 64, 4 heads of width 32 (q width 128 !=
                 hidden) / 2 key-value heads, q/k RMSNorm, 4 experts of width 48, top 2,
                 norm_topk_prob false, theta 1e6.
  qwen3-moe-norm norm_topk_prob true, tied embeddings, 8 experts, top 2.
  qwen3-moe-fused qwen3-moe saved with save_original_format=False.
  qwen2-moe      Qwen2MoeForCausalLM: 2 layers, hidden 64, 4 heads / 2 key-value heads, q/k/v
                 biases, 4 experts of width 48, top 2, norm_topk_prob false, a shared expert of
                 width 80 with its sigmoid gate, theta 1e6.
  qwen2-moe-tied norm_topk_prob true, tied embeddings, 8 experts, top 3, shared expert 32 wide.
  qwen2-moe-fused qwen2-moe saved with save_original_format=False.
Norm weights get noise (transformers starts them at 1) and the router weights are scaled up
(transformers draws them with std 0.02, which leaves every token's experts nearly tied, so the
top-k choice would hang on rounding) so that the checks see every part.
"""
import json
import struct
import sys


def build(kind):
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    common = dict(vocab_size=8192, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=128, rms_norm_eps=1e-6)
    if kind.startswith("mixtral"):
        tied = kind == "mixtral-tied"
        cfg = MixtralConfig(**common, intermediate_size=96, num_key_value_heads=4 if tied else 2,
                            num_local_experts=8 if tied else 4, num_experts_per_tok=3 if tied else 2,
                            tie_word_embeddings=tied, router_aux_loss_coef=0.02,
                            rope_parameters={"rope_type": "default",
                                             "rope_theta": 10000.0 if tied else 1e6})
        model = MixtralForCausalLM(cfg)
    elif kind.startswith("qwen2-moe"):
        from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM
        tied = kind == "qwen2-moe-tied"
        cfg = Qwen2MoeConfig(**common, intermediate_size=160, moe_intermediate_size=48,
                             shared_expert_intermediate_size=32 if tied else 80,
                             num_key_value_heads=2, num_experts=8 if tied else 4,
                             num_experts_per_tok=3 if tied else 2, norm_topk_prob=tied,
                             tie_word_embeddings=tied, router_aux_loss_coef=0.02,
                             rope_parameters={"rope_type": "default", "rope_theta": 1e6})
        model = Qwen2MoeForCausalLM(cfg)
    elif kind.startswith("qwen3-moe"):
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
        norm = kind == "qwen3-moe-norm"
        cfg = Qwen3MoeConfig(**common, intermediate_size=160, moe_intermediate_size=48,
                             num_key_value_heads=2, head_dim=32, num_experts=8 if norm else 4,
                             num_experts_per_tok=2, norm_topk_prob=norm, tie_word_embeddings=norm,
                             router_aux_loss_coef=0.02,
                             rope_parameters={"rope_type": "default", "rope_theta": 1e6})
        model = Qwen3MoeForCausalLM(cfg)
    else:
        raise SystemExit(f"hf_moe.py: unknown kind '{kind}'")
    experts = getattr(cfg, "num_local_experts", None) or cfg.num_experts
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(0.1 * torch.randn_like(p))
            if n.endswith("gate.weight") and p.dim() == 2 and p.shape[0] == experts:
                p.mul_(50.0)
            if n.endswith("shared_expert_gate.weight"):  # gates away from 1/2, both signs
                p.mul_(20.0)
            if n.endswith("_proj.bias"):  # transformers starts the q/k/v biases at 0
                p.add_(0.05 * torch.randn_like(p))
    return model


def tetrad_aux(router_logits, top_k):
    """tetrad's aux loss: each layer's E * sum_e f_e P_e, averaged over the layers."""
    import torch
    total = 0.0
    for logits in router_logits:
        p = torch.softmax(logits.double(), dim=-1)
        n, e = p.shape
        chosen = torch.topk(p, top_k, dim=-1).indices
        f = torch.zeros(e, dtype=torch.float64).scatter_add_(
            0, chosen.reshape(-1), torch.ones(chosen.numel(), dtype=torch.float64)) / n
        total += e * float((f * p.mean(dim=0)).sum())
    return total / len(router_logits)


def make(kind, out, tokens_path):
    import torch
    import transformers

    torch.manual_seed(1234)
    with open(tokens_path) as f:
        tokens = json.load(f)
    model = build(kind)
    model.eval()
    model.save_pretrained(out, save_original_format=not kind.endswith("-fused"))
    ids = torch.tensor([tokens], dtype=torch.long)
    with torch.no_grad():
        logits = model(ids).logits[0].float()
        out_aux = model(ids, labels=ids, output_router_logits=True)
        plain = model(ids, labels=ids, output_router_logits=False)
    with open(f"{out}/hf_logits.bin", "wb") as f:
        f.write(struct.pack(f"<{logits.numel()}f", *logits.flatten().tolist()))
    info = {
        "cross_entropy": float(plain.loss),
        "aux_loss": float(out_aux.aux_loss),
        "loss_with_aux": float(out_aux.loss),
        "router_aux_loss_coef": model.config.router_aux_loss_coef,
        "tetrad_aux_loss": tetrad_aux(out_aux.router_logits, model.config.num_experts_per_tok),
    }
    with open(f"{out}/hf_loss.json", "w") as f:
        json.dump(info, f, indent=1)
    print(f"{kind}: {type(model).__name__} saved to {out} with transformers "
          f"{transformers.__version__}; {json.dumps(info)}")


def main():
    if len(sys.argv) >= 5 and sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3], sys.argv[4])
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
