"""A realistic GPU training loop for the overhead benchmark: a small transformer language model on synthetic tokens.

    python3 bench/workload_transformer.py --steps 200 --batch-size 64 [--small]

Four pre-norm nn.TransformerEncoder layers (d_model 512, 8 heads, causal mask) over sequences of 256
tokens (vocabulary 8192), fused AdamW, bf16 autocast on a GPU. Prints the same one JSON line as
workload_resnet.py: steps, wall time, and the throughput of the steps after the profiling window (steps 20
onwards). --small shrinks the model and the sequences for a quick try on a CPU.
"""

import time

STARTED_AT = time.time()  # before torch's import: what runs before the script itself ends here

import argparse  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

from workload_common import make_loader, pick_device, print_result, train  # noqa: E402

SEQUENCES = 2048


@dataclass(frozen=True)
class Shape:
    vocab: int = 8192
    d_model: int = 512
    heads: int = 8
    layers: int = 4
    seq_len: int = 256


FULL = Shape()
SMALL = Shape(vocab=1024, d_model=128, heads=4, layers=2, seq_len=64)


class TinyLanguageModel(nn.Module):
    def __init__(self, shape: Shape) -> None:
        super().__init__()
        self.embed = nn.Embedding(shape.vocab, shape.d_model)
        self.position = nn.Parameter(torch.zeros(shape.seq_len, shape.d_model))
        layer = nn.TransformerEncoderLayer(shape.d_model, shape.heads, dim_feedforward=4 * shape.d_model,
                                           dropout=0.1, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, shape.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(shape.d_model)
        self.head = nn.Linear(shape.d_model, shape.vocab)
        self.register_buffer("causal_mask", nn.Transformer.generate_square_subsequent_mask(shape.seq_len),
                             persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position
        x = self.encoder(x, mask=self.causal_mask, is_causal=True)
        return self.head(self.norm(x))


def synthetic_tokens(shape: Shape) -> TensorDataset:
    """Next-token pairs: each sequence's input and the same sequence shifted by one."""
    tokens = torch.randint(0, shape.vocab, (SEQUENCES, shape.seq_len + 1))
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--small", action="store_true", help="a smaller model and shorter sequences for a CPU try")
    args = parser.parse_args()
    device = pick_device()
    shape = SMALL if args.small else FULL
    torch.manual_seed(0)
    loader = make_loader(synthetic_tokens(shape), args.batch_size, device)
    model = TinyLanguageModel(shape).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=device == "cuda")

    def train_step(batch: list[torch.Tensor]) -> torch.Tensor:
        inputs, targets = batch
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
            logits = model(inputs)
        loss = nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()

    print_result(train(loader, train_step, args.steps, device), STARTED_AT)


if __name__ == "__main__":
    main()
