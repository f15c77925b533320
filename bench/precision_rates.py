"""How much faster each kind of a transformer step's GPU work runs a rung down the precision ladder, on this GPU.

    python3 bench/precision_rates.py [--json OUT]

Times, with CUDA events over repeated calls after a warm-up, the work a GPT-style training step is made of, at the
shapes of a GPT-2-small layer (8 sequences of 1024 tokens, width 768, 12 heads), forward and backward:

- `gemm`: the layer's four products (qkv, out, the MLP's two), in fp32 ("highest"), TF32 ("high") and bf16;
- `attention`: scaled_dot_product_attention, causal, in fp32 (PyTorch's memory-efficient kernel) and bf16 (flash);
- `elementwise`: LayerNorm and GELU over the MLP's activations, fp32 against bf16.

Prints each kind's time per call at each precision and the ratios the precision rule sizes its rungs by
(TF32 over bf16 for products, fp32 over bf16 for attention and elementwise work); `--json` writes them too
(bench/results/precision_rates.json: an H200's, which rules/precision.py's factors come from).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
from torch import nn

from figures import Figures, add_json_option

TOKENS, WIDTH, HEADS, SEQ = 8 * 1024, 768, 12, 1024
REPEATS, WARMUP = 20, 5


def timed(work: Callable[[], None]) -> float:
    """Seconds per call of `work`, the median of REPEATS timed with CUDA events after WARMUP calls."""
    for _ in range(WARMUP):
        work()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        work()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def gemm_work(dtype: torch.dtype) -> Callable[[], None]:
    """A layer's products, forward and backward (each product thrice: the output and its two gradients)."""
    shapes = [(WIDTH, 3 * WIDTH), (WIDTH, WIDTH), (WIDTH, 4 * WIDTH), (4 * WIDTH, WIDTH)]
    pairs = [(torch.randn(TOKENS, k, device="cuda", dtype=dtype), torch.randn(k, n, device="cuda", dtype=dtype))
             for k, n in shapes]
    grads = [torch.randn(TOKENS, n, device="cuda", dtype=dtype) for _, n in shapes]

    def work() -> None:
        for (x, w), g in zip(pairs, grads, strict=True):
            torch.mm(x, w)
            torch.mm(g, w.t())
            torch.mm(x.t(), g)
    return work


def attention_work(dtype: torch.dtype) -> Callable[[], None]:
    shape = (TOKENS // SEQ, HEADS, SEQ, WIDTH // HEADS)
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
    grad = torch.randn(shape, device="cuda", dtype=dtype)

    def work() -> None:
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(grad)
    return work


def elementwise_work(dtype: torch.dtype) -> Callable[[], None]:
    x = torch.randn(TOKENS, 4 * WIDTH, device="cuda", dtype=dtype, requires_grad=True)
    norm = nn.LayerNorm(4 * WIDTH, device="cuda", dtype=dtype)
    grad = torch.randn(TOKENS, 4 * WIDTH, device="cuda", dtype=dtype)

    def work() -> None:
        nn.functional.gelu(norm(x)).backward(grad)
    return work


def with_matmul_precision(precision: str, make: Callable[[], Callable[[], None]]) -> float:
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        return timed(make())
    finally:
        torch.set_float32_matmul_precision(before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_json_option(parser)
    figures = Figures("precision_rates", parser.parse_args().json, ["work", "precision", "ms per call"])
    seconds = {
        "gemm": {"fp32": with_matmul_precision("highest", lambda: gemm_work(torch.float32)),
                 "tf32": with_matmul_precision("high", lambda: gemm_work(torch.float32)),
                 "bf16": timed(gemm_work(torch.bfloat16))},
        "attention": {"fp32": with_matmul_precision("high", lambda: attention_work(torch.float32)),
                      "bf16": timed(attention_work(torch.bfloat16))},
        "elementwise": {"fp32": timed(elementwise_work(torch.float32)),
                        "bf16": timed(elementwise_work(torch.bfloat16))},
    }
    ratios = {"gemm_fp32_over_tf32": seconds["gemm"]["fp32"] / seconds["gemm"]["tf32"],
              "gemm_tf32_over_bf16": seconds["gemm"]["tf32"] / seconds["gemm"]["bf16"],
              "attention_fp32_over_bf16": seconds["attention"]["fp32"] / seconds["attention"]["bf16"],
              "elementwise_fp32_over_bf16": seconds["elementwise"]["fp32"] / seconds["elementwise"]["bf16"]}
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    for kind, by in seconds.items():
        for precision, value in by.items():
            figures.row(kind, precision, f"{value * 1e3:.3f}")
        print(kind, "  ".join(f"{p} {s * 1e3:.3f} ms" for p, s in by.items()))
    for name, ratio in ratios.items():
        figures.set(name, round(ratio, 3))
        print(f"{name}: {ratio:.2f}x")
    figures.write()


if __name__ == "__main__":
    main()
