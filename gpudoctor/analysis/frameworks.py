"""Advice in the terms of the framework a script trains through: the setting its users change, where the framework
builds the torch objects itself (Hugging Face's Trainer builds the DataLoader from its TrainingArguments), and the
usual way to compile a model it trains (Lightning trains a compiled LightningModule as it is)."""

from __future__ import annotations

from gpudoctor.analysis.run import Run
from gpudoctor.analysis.settings import call_of
from gpudoctor.analysis.views import LoaderInfo, Location

TRAINER = "transformers"  # Hugging Face's Trainer, as Env.frameworks and LoaderInfo.made_by name it
LIGHTNING = "lightning"


def settings_location(run: Run, loader: LoaderInfo | None) -> Location | None:
    """Where the script sets what the framework builds from: its `TrainingArguments(...)` (in the file whose line
    led to the loader, or to the model's call), where it trains through Hugging Face's Trainer."""
    if TRAINER not in run.host.env.frameworks:
        return None
    near = (loader.location if loader is not None else None) or run.sites.forward_location
    return call_of(near.file, "TrainingArguments") if near is not None else None


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
    if TRAINER not in run.host.env.frameworks:
        return None
    return f"TrainingArguments(per_device_train_batch_size={batch})" if batch else (
        "TrainingArguments(per_device_train_batch_size=...)")


def compile_setting(run: Run) -> str | None:
    """How the framework compiles the model it trains."""
    if TRAINER in run.host.env.frameworks:
        return "TrainingArguments(torch_compile=True)"
    if LIGHTNING in run.host.env.frameworks:
        return "model = torch.compile(model) before trainer.fit(model)"
    return None
