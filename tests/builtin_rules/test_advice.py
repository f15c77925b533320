"""Advice fitted to the run: a fix names only settings that apply to this machine, and `rules explain` says how a
rule's severity is chosen."""

from __future__ import annotations

from pathlib import Path

from conftest import Gpudoctor
from gpudoctor.testing import BundleBuilder, assert_fires


def _starved(tmp_path: Path, *, gpu: bool) -> BundleBuilder:
    b = BundleBuilder(tmp_path)
    b.loader(num_workers=0, batch_size=32, site=("train.py", 41, "main"))
    b.steps(8, wall_s=0.1, data_wait_s=0.07, gpu_busy_s=0.02 if gpu else None)
    b.process(1.0)
    return b


def test_pinned_batches_are_suggested_only_when_the_script_uses_a_gpu(tmp_path: Path) -> None:
    on_gpu = assert_fires("GD101", _starved(tmp_path / "gpu", gpu=True).build())[0]
    on_cpu = assert_fires("GD101", _starved(tmp_path / "cpu", gpu=False).build())[0]
    assert "pin_memory=True" in on_gpu["fix"] and "num_workers=" in on_gpu["fix"]
    assert "pin_memory" not in on_cpu["fix"] and "num_workers=" in on_cpu["fix"]


def test_rules_explain_says_how_the_severity_is_chosen(gd: Gpudoctor) -> None:
    explained = gd.run("rules", "explain", "GD101")
    assert explained.returncode == 0
    assert "(data_starvation, warning by default, see Severity below)" in explained.stdout
    severity = "Severity: critical when the GPU idles at least half of each step waiting for data, else warning."
    assert severity in explained.stdout
    fixed = gd.run("rules", "explain", "GD201")
    assert "(blocking_copy, warning) from built-in" in fixed.stdout


IMAGENET_WORKERS = '''\
import argparse
import torch

parser = argparse.ArgumentParser()
parser.add_argument("-j", "--workers", default=4, type=int, metavar="N")


def main_worker(gpu, ngpus_per_node, args):
    if args.distributed:
        args.workers = int((args.workers + ngpus_per_node - 1) / ngpus_per_node)
    train_loader = torch.utils.data.DataLoader(range(10), batch_size=32,
                                               num_workers=args.workers, pin_memory=True)
'''


def test_a_flag_the_script_divides_among_its_ranks_is_given_as_the_value_that_yields_the_workers(
        tmp_path: Path) -> None:
    """pytorch/examples' ImageNet divides -j among the GPUs of the node: 15 workers a rank on two GPUs is -j 30."""
    script = tmp_path / "main.py"
    script.write_text(IMAGENET_WORKERS, encoding="utf-8")
    b = BundleBuilder(tmp_path / "run", script=str(script), args=["-j", "0", "--multiprocessing-distributed"])
    b.env(cores=32, ranks_on_host=2)
    b.loader(num_workers=0, batch_size=32, site=(str(script), 11, "main_worker"))
    b.steps(8, wall_s=0.1, data_wait_s=0.095, gpu_busy_s=0.005)
    b.process(1.0)
    fix = assert_fires("GD101", b.build())[0]["fix"]
    assert fix.startswith("run with -j 30 (the script changes it before it feeds num_workers=args.workers at "), fix
    assert "line 10: args.workers = int((args.workers + ngpus_per_node - 1) / ngpus_per_node)" in fix, fix
    assert "with ngpus_per_node=2, so 30 gives 15" in fix and "the flag is declared at line 5" in fix, fix
    assert "and pin_memory=True, persistent_workers=True in the DataLoader: 15 workers" in fix, fix


def _pageable_copies(path: Path, *, loader: bool, pinned_batches: bool = False) -> BundleBuilder:
    b = BundleBuilder(path)
    if loader:
        b.loader(num_workers=2, pin_memory=pinned_batches)
    b.copy(pinned=False, non_blocking=True, host_s=0.02)
    b.steps(8, wall_s=0.1, gpu_busy_s=0.05)
    b.process(1.0)
    return b


def test_a_copy_from_a_tensor_the_script_made_is_not_told_of_a_dataloader(tmp_path: Path) -> None:
    """No DataLoader runs (the script copies a tensor it made), or its batches are pinned already: the fix pins the
    tensor where the script makes it, never a DataLoader option that would change nothing."""
    for name, built in (("none", _pageable_copies(tmp_path / "none", loader=False)),
                        ("pinned", _pageable_copies(tmp_path / "pinned", loader=True, pinned_batches=True))):
        for code in ("GD201", "GD202"):
            fix = assert_fires(code, built.build())[0]["fix"]
            assert "DataLoader" not in fix, (name, fix)
            assert "tensor.pin_memory() where the script makes the tensor" in fix, (name, fix)
    batches = _pageable_copies(tmp_path / "batches", loader=True).build()
    assert "DataLoader(..., pin_memory=True)" in assert_fires("GD201", batches)[0]["fix"]


LIGHTNING_FIT = '''\
import lightning as L

trainer = L.Trainer(max_epochs=1, accelerator="gpu", devices=2, strategy="ddp")
trainer.fit(model, loader)
'''


def test_a_sync_made_by_lightnings_loop_names_lightnings_setting_where_the_trainer_is_built(tmp_path: Path) -> None:
    """Lightning's loop makes the call inside trainer.fit(...): the fix is Lightning's setting, at Trainer(...), not
    "call this line every N steps" of the call to fit."""
    script = tmp_path / "fit.py"
    script.write_text(LIGHTNING_FIT, encoding="utf-8")
    b = BundleBuilder(tmp_path / "run", script=str(script))
    b.sync("item", host_s=0.004, site=(str(script), 4, "<module>"), via="lightning.fabric.utilities.apply_func")
    b.steps(8, wall_s=0.1, gpu_busy_s=0.05)
    b.process(1.0)
    finding = assert_fires("GD211", b.build())[0]
    assert finding["location"]["line"] == 3, finding["location"]  # Trainer(...), where its settings go
    assert "Trainer(log_every_n_steps=N)" in finding["fix"] and "every N steps" not in finding["fix"], finding["fix"]
    assert "TQDMProgressBar(refresh_rate=N)" in finding["fix"]
    # A module of Lightning's without a known setting: still at Trainer(...), never "call this line every N steps".
    b = BundleBuilder(tmp_path / "other", script=str(script))
    b.sync("item", host_s=0.004, site=(str(script), 4, "<module>"), via="lightning.pytorch.loops.fetchers")
    b.steps(8, wall_s=0.1, gpu_busy_s=0.05)
    b.process(1.0)
    other = assert_fires("GD211", b.build())[0]
    assert other["location"]["line"] == 3 and "call this line" not in other["fix"], other


def test_workers_on_two_cores_do_not_claim_a_core_kept_for_the_training_process(tmp_path: Path) -> None:
    b = BundleBuilder(tmp_path)
    b.env(cores=2)
    b.loader(num_workers=0, batch_size=32, site=("train.py", 41, "main"))
    b.steps(8, wall_s=0.1, data_wait_s=0.09)
    b.process(1.0)
    fix = assert_fires("GD101", b.build())[0]["fix"]
    assert ": 2 workers, on 2 cores: more workers than the cores left beside the training process" in fix, fix
    assert "one kept for the training process" not in fix, fix
