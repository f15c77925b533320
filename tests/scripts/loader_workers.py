"""Iterates a DataLoader with two worker processes and sums what they return."""

import torch
from torch.utils.data import DataLoader, Dataset


class Numbers(Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(float(index))


if __name__ == "__main__":
    total = sum(batch.sum().item() for batch in DataLoader(Numbers(), batch_size=4, num_workers=2))
    print(f"loader_workers: total {total:.0f}")
