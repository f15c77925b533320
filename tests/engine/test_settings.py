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
