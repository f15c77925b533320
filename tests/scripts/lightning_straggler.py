"""Data-parallel training with PyTorch Lightning (strategy "ddp", gloo, 2 CPU processes) where one rank loads its
batches in the main process: the straggler. Lightning runs the script again for rank 1, and builds each rank's
DataLoader again from the arguments train_dataloader() gave it, to add a DistributedSampler.

Each sample takes --sample-ms to read (a sleep, as a slow disk would: the loader is I/O-bound), and each step's
device work is a --device-ms sleep, as a GPU's would be on a machine that has none: on shared cores the timings
then hold still. The ranks in --slow-ranks build their DataLoader with num_workers=0, the others with --workers.
`--slow-ranks "" --workers N --persistent` is the fixed twin: every rank has N persistent workers.

Each rank prints one line, `lightning_straggler: {"rank": R, "mean_step_s": S}`: the mean time of its steps after
the first WARMUP, as the script measures them itself: the steps gpudoctor's pace is the mean of, after its default
profiling window (5 steps' wait, 2 of warm-up, 5 active, 5 detail).
"""

import argparse
import json
import sys
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

WARMUP = 17


class SlowDisk(Dataset):
    def __init__(self, size: int, sample_ms: float) -> None:
        self.size, self.sample_s = size, sample_ms / 1e3

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.sample_s)
        return torch.full((32,), float(index % 7)), torch.tensor([float(index % 4)])


class Regression(L.LightningModule):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        x, y = batch
        time.sleep(self.args.device_ms / 1e3)
        return torch.nn.functional.mse_loss(self.net(x), y)

    def train_dataloader(self) -> DataLoader:
        args = self.args
        slow = self.trainer.global_rank in {int(r) for r in args.slow_ranks.split(",") if r}
        data = SlowDisk(args.steps * args.batch_size * self.trainer.world_size, args.sample_ms)
        workers = 0 if slow else args.workers
        persistent = workers > 0 and args.persistent
        return DataLoader(data, batch_size=args.batch_size, num_workers=workers, persistent_workers=persistent)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class StepTimes(L.Callback):
    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        self.ends.append(time.perf_counter())

    def on_train_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        steady = self.ends[WARMUP:]
        mean = (steady[-1] - steady[0]) / (len(steady) - 1)
        said = json.dumps({"rank": trainer.global_rank, "mean_step_s": mean})
        sys.stdout.write(f"lightning_straggler: {said}\n")  # one write: the ranks share stdout
        sys.stdout.flush()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--sample-ms", type=float, default=10.0)
    parser.add_argument("--device-ms", type=float, default=40.0)
    parser.add_argument("--slow-ranks", default="1", help="comma-separated ranks that load without workers")
    parser.add_argument("--workers", type=int, default=2, help="the DataLoader workers of the other ranks")
    parser.add_argument("--persistent", action="store_true", help="the other ranks' workers are persistent")
    args = parser.parse_args()
    torch.manual_seed(0)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=args.steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[StepTimes()])
    trainer.fit(Regression(args))
