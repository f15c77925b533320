"""Hugging Face Trainer on the GPU: a tiny BERT built from a config (nothing downloaded), random tokens."""

import tempfile

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class Tokens(torch.utils.data.Dataset):
    def __init__(self, length: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 1000, (length, 64), generator=generator)
        self.labels = torch.randint(0, 2, (length,), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.labels[index]}


def main() -> None:
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2,
                                                     num_attention_heads=2, intermediate_size=256))
    with tempfile.TemporaryDirectory() as out:
        arguments = TrainingArguments(output_dir=out, max_steps=60, per_device_train_batch_size=32, report_to=[],
                                      save_strategy="no", logging_strategy="no", disable_tqdm=True,
                                      dataloader_num_workers=2)
        result = Trainer(model=model, args=arguments, train_dataset=Tokens(32 * 60)).train()
    print(f"suite: hf trainer {result.global_step} steps", flush=True)


if __name__ == "__main__":
    main()
