"""PyTorch Lightning on the GPU: one device, or DDP over --devices (Lightning runs the script again per rank)."""

import argparse

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64 * args.steps, 256), torch.randn(64 * args.steps, 1))
    trainer = L.Trainer(accelerator="gpu", devices=args.devices, strategy="ddp" if args.devices > 1 else "auto",
                        max_steps=args.steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(Regression(), DataLoader(data, batch_size=64, num_workers=2, pin_memory=True))
    if trainer.is_global_zero:
        print(f"suite: lightning fit {trainer.global_step} steps on {args.devices} device(s)", flush=True)


if __name__ == "__main__":
    main()
