"""Compaction of sample files: bounded rows, extremes and counters kept, recent samples untouched."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from gpudoctor.bundle import read_jsonl
from gpudoctor.bundle.buckets import highest, lowest, merge_records
from gpudoctor.bundle.compaction import compact_file
from gpudoctor.bundle.tiers import DEFAULT_POLICY, Policy, Tier, plan
from gpudoctor.errors import BundleError

T0 = 1_700_000_000.0  # the first sample's time
HZ = 10
HOUR = 3600 * HZ  # samples in an hour
NOW = T0 + 3600.0  # just after the last sample of the hour
RECENT_S = DEFAULT_POLICY.full_resolution_s

MEM_DIP_AT, SWAP_SPIKE_AT, RSS_SPIKE_AT, UTIL_SPIKE_AT = 4_321, 17_777, 25_003, 30_001
WORKER_FROM, WORKER_TO = 12_345, 20_007  # a worker process that starts and ends mid-bucket
ROOT, WORKER = 100, 200
FILES = {"host": "host.jsonl", "procs": "procs.jsonl", "gpu": "gpu.jsonl"}
COUNTERS = ("swap_in", "swap_out")
PROC_COUNTERS = ("cpu_s", "ctx_vol", "ctx_invol", "thread_cpu", "run_delay_s")


# -- synthetic samples -----------------------------------------------------------------------------------
def at(i: int) -> float:
    return round(T0 + i / HZ, 3)


def host_sample(i: int) -> dict[str, Any]:
    return {
        "t": at(i), "cpu_pct": [float(i * 7 % 100), float(i * 13 % 50)], "load": [1.0 + i % 30 / 30, 1.5, 1.25],
        "mem_total": 16_000_000_000,
        "mem_available": 1_000_000_000 if i == MEM_DIP_AT else 8_000_000_000 + i * 7919 % 1000 * 1_000_000,
        "swap_used": 500_000_000 if i == SWAP_SPIKE_AT else i % 7 * 4096,
        "swap_in": i * 4096, "swap_out": i // 10 * 4096,
    }


def process(pid: int, ppid: int, name: str, i: int, rss: int) -> dict[str, Any]:
    return {"pid": pid, "ppid": ppid, "name": name, "cpu_s": round(i * 0.08, 3), "rss": rss, "threads": 10 + i % 3,
            "ctx_vol": i * 3, "ctx_invol": i // 4, "thread_cpu": {str(pid): round(i * 0.05, 3), str(pid + 1): i * 0.01},
            "run_delay_s": round(i * 0.002, 3)}


def procs_sample(i: int) -> dict[str, Any]:
    rss = 6_000_000_000 if i == RSS_SPIKE_AT else 2_000_000_000 + i % 50 * 1_000_000
    procs = [process(ROOT, 1, "python", i, rss)]
    if WORKER_FROM <= i < WORKER_TO:
        procs.append(process(WORKER, ROOT, "pt_data_worker", i - WORKER_FROM, 300_000_000 + i % 11 * 1000))
    return {"t": at(i), "procs": procs}


def gpu_sample(i: int) -> dict[str, Any]:
    gpus = []
    for index in (0, 1):
        row: dict[str, Any] = {"gpu": index, "util": 100 if (index, i) == (1, UTIL_SPIKE_AT) else i * 37 % 90,
                               "mem_util": i % 40, "mem_used": 10_000_000_000 + i % 100 * 1_000_000,
                               "sm_mhz": 1980, "power_w": 250.0 + i % 13}
        if i % 10 == 0:  # PCIe is read on one sample in ten
            row["pcie_tx_kbs"], row["pcie_rx_kbs"] = i % 1000, i % 700
        gpus.append(row)
    return {"t": at(i), "gpus": gpus}


SAMPLERS = {"host": host_sample, "procs": procs_sample, "gpu": gpu_sample}


def line(record: dict[str, Any]) -> str:
    return orjson.dumps(record).decode() + "\n"  # compact, one object a line, as JsonlWriter writes


@pytest.fixture(scope="module")
def hour_lines() -> dict[str, list[str]]:
    return {kind: [line(sample(i)) for i in range(HOUR)] for kind, sample in SAMPLERS.items()}


@pytest.fixture(scope="module")
def compacted(hour_lines: dict[str, list[str]], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The hour, written and compacted once for the tests that only read the result."""
    directory = tmp_path_factory.mktemp("samples")
    out: dict[str, Any] = {}
    for kind, lines in hour_lines.items():
        path = directory / FILES[kind]
        path.write_text("".join(lines))
        out[kind] = compact_file(path, kind, NOW)
        out[kind + "_rows"] = list(read_jsonl(path))
        out[kind + "_text"] = path.read_text()
    return out


def entry(row: dict[str, Any], key: str, ident: int) -> dict[str, Any] | None:
    id_key = "pid" if key == "procs" else "gpu"
    return next((e for e in row[key] if e[id_key] == ident), None)


def assert_close(a: Any, b: Any, path: str = "") -> None:
    """Equal, but for the rounding of means to three decimals."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for key in a:
            assert_close(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-12, abs=2e-3), path
    else:
        assert a == b, path


# -- an hour at 10 Hz ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", FILES)
def test_an_hour_compacts_to_a_bounded_row_count(compacted: dict[str, Any], kind: str) -> None:
    stats = compacted[kind]
    recent_rows = RECENT_S * HZ
    older_seconds = 3600 - RECENT_S
    assert stats.rows_before == HOUR and stats.rewritten
    assert stats.rows_after == len(compacted[kind + "_rows"])
    assert recent_rows <= stats.rows_after <= recent_rows + older_seconds + 2  # raw, then one row a second
    assert stats.bytes_after < stats.bytes_before * 0.6


def test_extremes_survive_compaction(compacted: dict[str, Any]) -> None:
    host, procs, gpu = compacted["host_rows"], compacted["procs_rows"], compacted["gpu_rows"]
    assert min(lowest(r, "mem_available") for r in host) == 1_000_000_000
    assert max(highest(r, "swap_used") for r in host) == 500_000_000
    assert max(highest(r, "cpu_pct")[0] for r in host) == 99.0
    assert max(highest(entry(r, "procs", ROOT), "rss") for r in procs) == 6_000_000_000
    worker_rss = [highest(e, "rss") for r in procs if (e := entry(r, "procs", WORKER))]
    assert max(worker_rss) == max(procs_sample(i)["procs"][1]["rss"] for i in range(WORKER_FROM, WORKER_TO))
    assert max(highest(entry(r, "gpus", 1), "util") for r in gpu) == 100
    assert max(highest(entry(r, "gpus", 0), "util") for r in gpu) == 89
    assert min(lowest(r, "mem_available") for r in host if "n" in r) == 1_000_000_000  # the dip is in a merged row


def test_merged_rows_look_like_raw_ones_with_their_extremes(compacted: dict[str, Any]) -> None:
    row = next(r for r in compacted["host_rows"] if r.get("n") == HZ)
    raw = [host_sample(i) for i in range(round((row["t0"] - T0) * HZ), round((row["t"] - T0) * HZ) + 1)]
    assert len(raw) == HZ and raw[0]["t"] == row["t0"] and raw[-1]["t"] == row["t"]
    assert set(row) == set(raw[0]) | {"t0", "n", "lo", "hi"}
    assert row["mem_available"] == pytest.approx(sum(r["mem_available"] for r in raw) / HZ)
    assert row["lo"]["cpu_pct"] == [min(r["cpu_pct"][core] for r in raw) for core in (0, 1)]
    assert row["hi"]["load"] == [max(r["load"][k] for r in raw) for k in range(3)]
    assert row["mem_total"] == 16_000_000_000 and isinstance(row["mem_total"], int)  # a constant stays exact


@pytest.mark.parametrize("kind", ["host", "procs"])
def test_counters_hold_at_each_rows_time_so_rates_stay_exact(compacted: dict[str, Any], kind: str) -> None:
    raw = {at(i): SAMPLERS[kind](i) for i in range(HOUR)}
    rows = compacted[kind + "_rows"]
    for row in rows:
        sample = raw[row["t"]]
        if kind == "host":
            assert {k: row[k] for k in COUNTERS} == {k: sample[k] for k in COUNTERS}
        else:
            for proc in sample["procs"]:
                assert {k: entry(row, "procs", proc["pid"])[k] for k in PROC_COUNTERS} == \
                       {k: proc[k] for k in PROC_COUNTERS}
    first, middle, last = rows[0], rows[len(rows) // 6], rows[-1]
    assert "n" in middle and last == raw[at(HOUR - 1)]
    if kind == "host":  # the swap-in rate between two far-apart rows is the raw samples' one
        rate = (middle["swap_in"] - first["swap_in"]) / (middle["t"] - first["t"])
        assert rate == pytest.approx(4096 * HZ)


def test_a_process_that_ends_mid_bucket_keeps_its_last_counters(compacted: dict[str, Any]) -> None:
    rows = [r for r in compacted["procs_rows"] if "n" in r and r["t0"] <= at(WORKER_TO - 1) <= r["t"]]
    assert len(rows) == 1
    row = rows[0]
    worker = entry(row, "procs", WORKER)
    last_sample = procs_sample(WORKER_TO - 1)["procs"][1]
    assert worker["n"] < row["n"] and worker["cpu_s"] == last_sample["cpu_s"]
    assert worker["thread_cpu"] == last_sample["thread_cpu"]


@pytest.mark.parametrize("kind", FILES)
def test_the_last_ten_minutes_stay_raw_and_untouched(hour_lines: dict[str, list[str]], compacted: dict[str, Any],
                                                     kind: str) -> None:
    recent = [text for text in hour_lines[kind] if json.loads(text)["t"] >= NOW - RECENT_S]
    assert len(recent) == RECENT_S * HZ
    assert compacted[kind + "_text"].endswith("".join(recent))


def test_host_and_process_rows_keep_the_same_times(compacted: dict[str, Any]) -> None:
    assert [r["t"] for r in compacted["host_rows"]] == [r["t"] for r in compacted["procs_rows"]]
    assert [r["t"] for r in compacted["host_rows"]] == [r["t"] for r in compacted["gpu_rows"]]


# -- merging -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", FILES)
def test_merging_is_associative(kind: str) -> None:
    raw = [SAMPLERS[kind](i) for i in range(WORKER_FROM - 37, WORKER_FROM + 63)]  # the worker starts at 37
    whole = merge_records(raw, kind)
    parts = [merge_records(raw[a:b], kind) for a, b in ((0, 3), (3, 40), (40, 41), (41, 100))]
    assert_close(merge_records(parts, kind), whole)
    nested = merge_records([merge_records(parts[:2], kind), merge_records(parts[2:], kind)], kind)
    assert_close(nested, whole)
    assert_close(merge_records([merge_records(raw[:50], kind), *raw[50:]], kind), whole)  # raw and merged mix


def test_a_process_that_appears_mid_bucket_is_kept_with_its_own_values() -> None:
    raw = [procs_sample(i) for i in range(WORKER_FROM - 5, WORKER_FROM + 5)]
    row = merge_records(raw, "procs")
    root, worker = entry(row, "procs", ROOT), entry(row, "procs", WORKER)
    own = [s["procs"][1] for s in raw[5:]]
    assert row["n"] == 10 and "n" not in root and worker["n"] == 5
    assert worker["rss"] == pytest.approx(sum(p["rss"] for p in own) / 5, abs=1e-3)
    assert worker["hi"]["rss"] == max(p["rss"] for p in own) and worker["lo"]["rss"] == min(p["rss"] for p in own)
    assert worker["cpu_s"] == own[-1]["cpu_s"] and worker["name"] == "pt_data_worker" and worker["ppid"] == ROOT
    assert [p["pid"] for p in row["procs"]] == [ROOT, WORKER]  # the first seen (the root) stays first


def test_missing_keys_stay_missing() -> None:
    without_pcie = merge_records([gpu_sample(i) for i in range(1, 10)], "gpu")
    assert all("pcie_tx_kbs" not in g and "pcie_tx_kbs" not in g["hi"] for g in without_pcie["gpus"])
    with_some = merge_records([gpu_sample(i) for i in range(20)], "gpu")
    first = with_some["gpus"][0]
    assert first["pcie_tx_kbs"] == pytest.approx((0 + 10) / 2) and first["counts"] == {"pcie_tx_kbs": 2,
                                                                                         "pcie_rx_kbs": 2}
    no_swap = [{k: v for k, v in host_sample(i).items() if k != "swap_in"} for i in range(5)]
    assert "swap_in" not in merge_records(no_swap, "host")


def test_a_single_row_is_left_as_it_is() -> None:
    sample = host_sample(3)
    assert merge_records([sample], "host") is sample
    with pytest.raises(ValueError):
        merge_records([], "host")
    with pytest.raises(ValueError):
        merge_records([sample, sample], "disk")


# -- the file ----------------------------------------------------------------------------------------------
def write_minutes(path: Path, kind: str, minutes: int) -> None:
    path.write_text("".join(line(SAMPLERS[kind](i)) for i in range(minutes * 60 * HZ)))


def test_a_last_line_cut_short_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "host.jsonl"
    write_minutes(path, "host", 20)
    with open(path, "a") as f:
        f.write(line(host_sample(12_000))[:40])
    stats = compact_file(path, "host", T0 + 20 * 60)
    assert stats.rewritten and stats.rows_before == 12_000
    assert path.read_text().endswith("\n") and len(list(read_jsonl(path))) == stats.rows_after
    assert not list(tmp_path.glob("*.tmp"))


def test_a_cut_short_line_alone_is_enough_to_rewrite(tmp_path: Path) -> None:
    path = tmp_path / "host.jsonl"
    path.write_text(line(host_sample(0)) + line(host_sample(1))[:30])
    stats = compact_file(path, "host", T0 + 1)
    assert stats.rewritten and stats.rows_after == 1 and path.read_text() == line(host_sample(0))


def test_a_corrupt_line_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "host.jsonl"
    text = line(host_sample(0)) + "{not json\n" + line(host_sample(1))
    path.write_text(text)
    with pytest.raises(BundleError):
        compact_file(path, "host", T0 + 3600)
    assert path.read_text() == text and not list(tmp_path.glob("*.tmp"))


def test_a_failed_rewrite_leaves_the_file_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "host.jsonl"
    write_minutes(path, "host", 20)
    text = path.read_text()

    def crash(*args: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("gpudoctor.bundle.compaction.os.replace", crash)
    with pytest.raises(OSError):
        compact_file(path, "host", T0 + 20 * 60)
    assert path.read_text() == text and [p.name for p in tmp_path.iterdir()] == ["host.jsonl"]


def test_compacting_again_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "procs.jsonl"
    write_minutes(path, "procs", 30)
    now = T0 + 30 * 60
    first = compact_file(path, "procs", now)
    text = path.read_text()
    again = compact_file(path, "procs", now)
    assert first.rewritten and not again.rewritten and again.rows_after == first.rows_after
    assert path.read_text() == text


def test_compacting_later_only_merges_what_aged(tmp_path: Path) -> None:
    path, reference = tmp_path / "host.jsonl", tmp_path / "reference.jsonl"
    write_minutes(path, "host", 30)
    write_minutes(reference, "host", 30)
    for minutes in (12, 15, 21, 30):  # compacted along the way, or once at the end: the same rows
        compact_file(path, "host", T0 + minutes * 60)
    compact_file(reference, "host", T0 + 30 * 60)
    assert_close(list(read_jsonl(path)), list(read_jsonl(reference)))


def test_rows_only_the_json_module_reads_are_read(tmp_path: Path) -> None:
    path = tmp_path / "gpu.jsonl"
    odd = {"t": T0 + 1, "gpus": [{"gpu": 0, "power_w": float("nan"), "mem_used": 2 ** 70}]}
    path.write_text(line(gpu_sample(0)) + json.dumps(odd) + "\n")  # NaN and a 70-bit integer: not for orjson
    stats = compact_file(path, "gpu", T0 + 2)
    assert not stats.rewritten and stats.rows_after == 2


def test_an_empty_file_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "gpu.jsonl"
    path.write_text("")
    stats = compact_file(path, "gpu", NOW)
    assert not stats.rewritten and stats.rows_after == 0


# -- long runs -------------------------------------------------------------------------------------------
def run_a_day(path: Path, policy: Policy, hz: int = 1) -> list[int]:
    """A day of host samples appended an hour at a time, each hour followed by a compaction."""
    rows_after = []
    for hour in range(24):
        with open(path, "a") as f:
            f.writelines(line({**host_sample(i), "t": T0 + i / hz}) for i in range(hour * 3600 * hz,
                                                                                 (hour + 1) * 3600 * hz))
        stats = compact_file(path, "host", T0 + (hour + 1) * 3600, policy)
        rows_after.append(stats.rows_after)
    assert rows_after[-1] == len(path.read_bytes().splitlines())
    return rows_after


def test_a_day_stays_under_the_row_cap(tmp_path: Path) -> None:
    # At 1 Hz, with tiers and cap ten times smaller than the defaults: the cap binds from the 5th hour on.
    policy = Policy(tiers=(Tier(1.0, 60.0), Tier(10.0, 600.0), Tier(60.0, 3600.0)), max_rows=1_200)
    rows_after = run_a_day(tmp_path / "host.jsonl", policy)
    assert max(rows_after) <= policy.max_rows and rows_after[-1] > policy.max_rows * 0.8
    assert not compact_file(tmp_path / "host.jsonl", "host", T0 + 24 * 3600, policy).rewritten  # nothing more
    rows = list(read_jsonl(tmp_path / "host.jsonl"))
    assert rows[-1] == {**host_sample(24 * 3600 - 1), "t": T0 + 24 * 3600 - 1}
    assert min(lowest(r, "mem_available") for r in rows) == 1_000_000_000
    assert max(highest(r, "swap_used") for r in rows) == 500_000_000
    assert sum(r.get("n", 1) for r in rows) == 24 * 3600  # every sample is in exactly one row
    assert max(r["t"] - r["t0"] for r in rows if "n" in r) > 240  # the coarsest buckets doubled
    times = [r["t"] for r in rows]
    assert times == sorted(times) and all(r["t0"] <= r["t"] for r in rows if "n" in r)
    swap_in_rate = (rows[-1]["swap_in"] - rows[0]["swap_in"]) / (rows[-1]["t"] - rows[0]["t"])
    assert swap_in_rate == pytest.approx(4096)


def test_a_day_at_ten_hertz_stays_under_the_default_cap() -> None:
    times = [T0 + i / HZ for i in range(24 * 3600 * HZ)]  # the plan alone, which needs only the times
    layout = plan(times, times[-1] + 0.1)
    assert layout.rows <= DEFAULT_POLICY.max_rows
    assert layout.widths == tuple(tier.width_s for tier in DEFAULT_POLICY.tiers)


def test_a_month_doubles_the_coarsest_buckets_to_stay_under_the_cap() -> None:
    times = [T0 + i * 20.0 for i in range(30 * 24 * 180)]  # 30 days, one sample every 20 s
    layout = plan(times, times[-1] + 1)
    assert layout.rows <= DEFAULT_POLICY.max_rows
    assert layout.widths[:2] == (1.0, 10.0) and layout.widths[2] == 240.0  # 120 s would leave 23,400 rows


def test_the_cap_cannot_shrink_the_raw_rows() -> None:
    times = [T0 + i / HZ for i in range(3000)]
    layout = plan(times, times[-1] + 1, Policy(max_rows=100))
    assert layout.rows == 3000 and all(key is None for key in layout.keys)


def test_buckets_are_merged_whole_never_in_part() -> None:
    times = [T0 + i / HZ for i in range(HOUR)]
    now = T0 + 1234.56
    keys = plan(times, now).keys
    merged = [t for t, key in zip(times, keys) if key is not None]
    assert merged and max(merged) < now - RECENT_S and int(max(merged) + 1e-6) != int(now - RECENT_S)


def test_policy_rejects_tiers_that_do_not_nest() -> None:
    with pytest.raises(ValueError):
        Policy(tiers=(Tier(1.0, 600.0), Tier(15.0, 3600.0), Tier(20.0, 7200.0)))
    with pytest.raises(ValueError):
        Policy(tiers=(Tier(10.0, 3600.0), Tier(1.0, 600.0)))
    assert Policy(tiers=(Tier(2.0, 300.0),)).full_resolution_s == 300.0


def test_rows_inside_a_kept_span_stay_raw(tmp_path: Path) -> None:
    path = tmp_path / "host.jsonl"
    write_minutes(path, "host", 30)
    raw = path.read_text().splitlines()
    window = (T0 + 5 * 60, T0 + 5 * 60 + 3.0)  # a profiling window 25 minutes before `now`
    compact_file(path, "host", T0 + 30 * 60, keep=[window])
    rows = list(read_jsonl(path))
    inside = [r for r in rows if window[0] <= r["t"] <= window[1]]
    assert inside and all("n" not in r for r in inside)
    assert [json.dumps(r, separators=(",", ":")) for r in inside] == [
        line for line in raw if window[0] <= json.loads(line)["t"] <= window[1]]
    assert any("n" in r for r in rows if r["t"] < window[0])  # and the rows around it were merged
