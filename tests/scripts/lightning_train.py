"""Trains a small model with PyTorch Lightning's Trainer on the CPU: one process, or DDP over --devices processes
(gloo) that Lightning starts itself (strategy "ddp": the script run again; "ddp_spawn": torch.multiprocessing)."""

import argparse
import sys

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


def say(line: str) -> None:
    """One write for the whole line: ranks share stdout, and print() writes the newline apart."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Regression(L.LightningModule):
    def __init__(self, data: TensorDataset) -> None:
        super().__init__()
        self.data = data
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=32)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Report(L.Callback):
    def on_train_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        say(f"lightning_train: rank {trainer.global_rank} of {trainer.world_size} did {trainer.global_step} steps")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--steps", type=int, default=16)
    args = parser.parse_args()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(4096, 32), torch.randn(4096, 1))
    trainer = L.Trainer(accelerator="cpu", devices=args.devices, strategy=args.strategy, max_steps=args.steps,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[Report()])
    trainer.fit(Regression(data))
