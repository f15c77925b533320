"""MobileNetV3-small inference over a pinned-memory DataLoader of 8 batches, in torch.inference_mode: the shape of
a job whose process did not exit under gpudoctor once the profiler window, still open at the script's end, had
been closed with CUPTI's teardown pending."""

import torch
from torch.utils.data import DataLoader, TensorDataset
from torchvision.models import mobilenet_v3_small


def main() -> None:
    torch.manual_seed(0)
    model = mobilenet_v3_small().cuda().eval()
    loader = DataLoader(TensorDataset(torch.rand(2048, 3, 224, 224)), batch_size=256, pin_memory=True)
    seen = 0
    with torch.inference_mode():
        for (x,) in loader:
            model(x.cuda(non_blocking=True))
            seen += len(x)
    print(f"suite: mobilenet saw {seen} images", flush=True)


if __name__ == "__main__":
    main()
