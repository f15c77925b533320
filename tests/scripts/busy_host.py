"""A training loop whose host spends most of each step in a pure-Python loop (parsing, bookkeeping): the line
`run.sites.host_lines` should name."""

import time

import torch

model = torch.nn.Linear(8, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


def bookkeeping(ms: float) -> None:
    deadline = time.perf_counter() + ms / 1e3
    while time.perf_counter() < deadline:  # BUSY
        pass


for _ in range(30):
    bookkeeping(20)
    loss = model(torch.randn(4, 8)).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
