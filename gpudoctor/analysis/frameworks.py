"""Advice in the terms of the framework a script trains through: the setting its users change, where the framework
builds the torch objects itself (Hugging Face's Trainer builds the DataLoader from its TrainingArguments), and the
usual way to compile a model it trains (Lightning trains a compiled LightningModule as it is)."""

from __future__ import annotations

from gpudoctor.analysis.run import Run
from gpudoctor.analysis.views import LoaderInfo

TRAINER = "transformers"  # Hugging Face's Trainer, as Env.frameworks and LoaderInfo.made_by name it
LIGHTNING = "lightning"


def builds_the_loader(loader: LoaderInfo) -> str | None:
    """The framework that built `loader` from its own settings, if one did (the Trainer's DataLoader)."""
    return TRAINER if loader.made_by == TRAINER else None


def loader_setting(loader: LoaderInfo, workers: int, pin: bool) -> str | None:
    """The framework's setting for the loader's workers, where the framework builds the loader."""
    if builds_the_loader(loader) != TRAINER:
        return None
    pinning = "" if loader.pin_memory or not pin else ", dataloader_pin_memory=True"
    return f"TrainingArguments(dataloader_num_workers={workers}{pinning}, dataloader_persistent_workers=True)"


def batch_setting(run: Run, batch: int | None) -> str | None:
    """The framework's setting for the batch size: the Trainer's per-device batch."""
    if TRAINER not in run.env.frameworks:
        return None
    return f"TrainingArguments(per_device_train_batch_size={batch})" if batch else (
        "TrainingArguments(per_device_train_batch_size=...)")


def compile_setting(run: Run) -> str | None:
    """How the framework compiles the model it trains."""
    if TRAINER in run.env.frameworks:
        return "TrainingArguments(torch_compile=True)"
    if LIGHTNING in run.env.frameworks:
        return "model = torch.compile(model) before trainer.fit(model)"
    return None
