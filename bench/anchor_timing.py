"""The timing shared by tetrad's PyTorch anchors (bench/pytorch_gpt2.py, bench/transformers_mixtral.py).

Whole training steps (forward, loss, backward, gradient clipping at 1, the optimizer's step) on
one batch of random tokens, timed one by one after untimed warm-up steps, each mode (eager,
torch.compile) on its own fresh model, the faster mode being what a user would pick. torch is
imported only inside the functions that need it: set_thread_env must run before it starts.
"""
import os
import statistics
import sys
import time


def set_thread_env(threads):
    """The thread counts of torch's OpenMP/BLAS pools, which read them when torch starts."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)


def random_batch(vocab, batch, seq, seed):
    """Inputs and next-token targets, batch x seq each, of uniformly random tokens."""
    import torch
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def next_token_loss(logits, y):
    """Mean cross-entropy of the logits (batch x seq x vocab, taken in fp32) against y."""
    import torch.nn.functional as F
    return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), y.view(-1))


def training_step(model, opt, loss_of, precision):
    """One training step as a function returning its loss: gradients zeroed, loss_of() (forward
    and loss) under bf16 autocast when precision is "bf16", backward, the gradient norm clipped
    at 1 and opt's step."""
    import torch

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = loss_of()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()
    return step


def time_steps(step, mode, warmup, steps):
    """Calls step() (one training step, returning its loss) warmup + steps times; returns the
    seconds of the timed steps and every step's loss. Each step is reported on stderr."""
    times, losses = [], []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        losses.append(step())
        dt = time.perf_counter() - t0
        if i >= warmup:
            times.append(dt)
        print(f"{mode} step {i}{' (warm-up)' if i < warmup else ''}: {dt:.3f} s, "
              f"loss {losses[-1]:.4f}", file=sys.stderr, flush=True)
    return times, losses


def run_modes(modes, run_mode, tokens_per_step):
    """run_mode(mode) -> (model, times, losses) for each mode. Returns per_mode (per mode its
    median step time, tokens/s and timed steps, or the error that stopped it: a compile failure
    must not hide the eager number), the fastest mode and {mode: (model, times, losses)} of the
    modes that ran. Exits when none ran."""
    per_mode, results, best = {}, {}, None
    for mode in modes:
        try:
            results[mode] = run_mode(mode)
        except Exception as e:
            print(f"{mode} failed: {e}", file=sys.stderr)
            per_mode[mode] = {"error": str(e)[:300]}
            continue
        times = results[mode][1]
        med = statistics.median(times)
        per_mode[mode] = {"median_step_s": med, "tokens_per_s": tokens_per_step / med,
                          "step_s": [round(x, 6) for x in times]}
        if best is None or per_mode[mode]["tokens_per_s"] > per_mode[best]["tokens_per_s"]:
            best = mode
    if best is None:
        sys.exit("no mode ran")
    return per_mode, best, results
