"""Fine-tunes a tiny BERT, built from a config (nothing downloaded), with Hugging Face's Trainer on the CPU."""

import argparse
import tempfile
import time

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class Tokens(torch.utils.data.Dataset):
    """Random token ids; each sample takes `sample_ms` to read (a sleep)."""

    def __init__(self, length: int, sample_ms: float = 0.0) -> None:
        self.sample_s = sample_ms / 1e3
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 100, (length, 16), generator=generator)
        self.labels = torch.randint(0, 2, (length,), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if self.sample_s:
            time.sleep(self.sample_s)
        return {"input_ids": self.ids[index], "labels": self.labels[index]}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--sample-ms", type=float, default=0.0, help="each sample's read, a sleep")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                                                     num_attention_heads=2, intermediate_size=37))
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(output_dir=out, max_steps=args.steps, per_device_train_batch_size=4,
                                     use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
                                     disable_tqdm=True, dataloader_num_workers=0)
        trainer = Trainer(model=model, args=training, train_dataset=Tokens(256, args.sample_ms))
        result = trainer.train()
    print(f"hf_trainer: {result.global_step} steps", flush=True)
