"""Where a script sets the value a fix changes: the keyword of the call at a line, and the command-line flag that
feeds it (gpudoctor.analysis.settings)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from gpudoctor.analysis import Location, setting_at

SCRIPT = '''\
import argparse
from torch.utils.data import DataLoader

parser = argparse.ArgumentParser()
parser.add_argument("-w", "--num-workers", type=int, default=2)
parser.add_argument("--batch", dest="batch_size", type=int, default=8)
args = parser.parse_args()
loader = DataLoader(range(10), batch_size=args.batch_size,
                    num_workers=args.num_workers)
plain = DataLoader(range(10), num_workers=4)
'''


def _script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(SCRIPT), encoding="utf-8")
    return str(path)


def test_the_flag_that_feeds_a_keyword_is_found_by_its_destination(tmp_path: Path) -> None:
    file = _script(tmp_path)
    workers = setting_at(Location(file, 8, "<module>"), "num_workers")  # the call spans lines 8-9
    batch = setting_at(Location(file, 9, "<module>"), "batch_size")
    assert (workers.expression, workers.flag, workers.flag_line) == ("args.num_workers", "--num-workers", 5)
    assert (batch.expression, batch.flag, batch.flag_line) == ("args.batch_size", "--batch", 6)


def test_a_value_written_in_the_call_has_no_flag(tmp_path: Path) -> None:
    plain = setting_at(Location(_script(tmp_path), 10, "<module>"), "num_workers")
    assert (plain.expression, plain.flag) == ("4", None)


def test_no_setting_without_the_keyword_or_the_file(tmp_path: Path) -> None:
    file = _script(tmp_path)
    assert setting_at(Location(file, 10, "<module>"), "pin_memory") is None
    assert setting_at(Location(str(tmp_path / "gone.py"), 3, "<module>"), "num_workers") is None
    assert setting_at(None, "num_workers") is None


def test_a_call_is_found_with_the_function_it_is_in(tmp_path: Path) -> None:
    from gpudoctor.analysis.settings import call_of

    path = tmp_path / "finetune.py"
    path.write_text(textwrap.dedent('''\
        from transformers import Trainer, TrainingArguments


        def main():
            args = TrainingArguments(output_dir="out",
                                     per_device_train_batch_size=4)
            Trainer(args=args).train()
        '''), encoding="utf-8")
    assert call_of(str(path), "TrainingArguments") == Location(str(path), 5, "main")
    assert call_of(str(path), "DataLoader") is None


# pytorch/examples' imagenet/main.py, as far as its workers go: -j is divided among the GPUs of the node before
# each rank's DataLoader reads it.
IMAGENET = '''\
import argparse
import torch
import torch.multiprocessing as mp

parser = argparse.ArgumentParser()
parser.add_argument("-j", "--workers", default=4, type=int, metavar="N")
parser.add_argument("--multiprocessing-distributed", action="store_true")


def main():
    args = parser.parse_args()
    ngpus_per_node = torch.cuda.device_count()
    mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))


def main_worker(gpu, ngpus_per_node, args):
    if args.multiprocessing_distributed:
        args.workers = int((args.workers + ngpus_per_node - 1) / ngpus_per_node)
    loader = torch.utils.data.DataLoader(range(10), batch_size=4,
                                         num_workers=args.workers, pin_memory=True)
'''


def test_a_flag_rewritten_before_use_is_followed_to_the_value_that_gives_the_setting(tmp_path: Path) -> None:
    from gpudoctor.analysis import flag_value

    path = tmp_path / "main.py"
    path.write_text(IMAGENET, encoding="utf-8")
    fed = setting_at(Location(str(path), 19, "main_worker"), "num_workers")
    assert (fed.flag, fed.options, fed.default) == ("--workers", ("-j", "--workers"), "4")
    assert [r.line for r in fed.rewrites] == [18]
    # -j 4 on 2 GPUs gave each rank 2 workers; 15 a rank takes -j 30, as typed (-j), not 15.
    args = ["-j", "4", "--multiprocessing-distributed"]
    followed = flag_value(fed, 15, 2, args, {"ranks_on_host": 2})
    assert (followed.option, followed.value) == ("-j", 30)
    assert followed.names == (("ngpus_per_node", 2),)
    # The rewrite is under a condition: a run where it did not run (4 workers from -j 4) gets the flag as it is.
    plain = flag_value(fed, 15, 4, ["--workers=4"], {"ranks_on_host": 1})
    assert (plain.option, plain.value, plain.through) == ("--workers", 15, ())
    # What the run had matches neither: nothing is promised.
    assert flag_value(fed, 15, 3, args, {"ranks_on_host": 2}) is None
    # Without the ranks per node the division cannot be followed, and the flag as it is gave 4, not 2.
    assert flag_value(fed, 15, 2, args, {}) is None
    # -j 0: no worker either way; on two ranks a node the division is what the script does with the flag.
    none = flag_value(fed, 15, 0, ["-j", "0", "--multiprocessing-distributed"], {"ranks_on_host": 2})
    assert (none.value, [r.line for r in none.through]) == (30, [18])
