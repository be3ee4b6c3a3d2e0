"""nsa.bench.baselines: file format, machine identity, and the regression rule."""

from __future__ import annotations

import json

import pytest

from nsa.bench import baselines as bl
from pytest_nsa.hardware import GPUInfo, HardwareInfo
from pytest_nsa.versions import SoftwareInfo

MACHINE = {"profile": "h200", "device": "NVIDIA H200", "capability": "9.0", "cpu_count": None,
           "driver": "580.159.04", "cuda": "13.0", "torch": "2.11.0", "triton": "3.6.0", "python": "3.12"}


def entry(median: float, iqr: float = 0.0, length: int = 4096) -> bl.Entry:
    return bl.Entry(median, iqr, median - iqr / 2, median + iqr / 2, median, median - iqr, median + iqr, iqr, 20,
                    {"kind": "decode", "shape": {"length": length}})


def test_machine_fields_for_a_gpu_and_a_cpu():
    gpu = HardwareInfo((GPUInfo(0, "NVIDIA H200", (9, 0), 139.8),), "580.159.04", "13.0")
    sw = SoftwareInfo(python="3.12.3", torch="2.11.0", triton="3.6.0")
    assert bl.machine_fields("h200", gpu, sw) == MACHINE
    cpu = bl.machine_fields("cpu", HardwareInfo(), sw)
    assert cpu["device"].startswith("CPU ") and cpu["cpu_count"] >= 1 and cpu["capability"] is None


def test_save_load_round_trip(tmp_path):
    path = bl.path_for(tmp_path, "h200")
    assert path == tmp_path / "h200" / "benchmarks.json"
    base = bl.Baseline("h200", MACHINE, {"a": entry(1e-5, 1e-7), "b": entry(2e-3)}, "2026-11-22T00:00:00+00:00")
    bl.save(base, path)
    assert bl.load(path) == base
    assert json.loads(path.read_text())["schema"] == bl.SCHEMA_VERSION


@pytest.mark.parametrize("text, message", [
    ("{", "not valid JSON"),
    ("[]", "expected a JSON object"),
    ('{"schema": 99}', "schema 99 is not the one this nsa reads"),
    ('{"schema": 1, "profile": "x", "machine": {}}', "needs 'profile'"),
    ('{"schema": 1, "profile": "x", "machine": {}, "benchmarks": {"t": {"median": 1}}}', "lacks numeric iqr"),
    ('{"schema": 1, "profile": "x", "machine": {}, "benchmarks": {"t": {"median": -1, "iqr": 0, "q1": 0, '
     '"q3": 0, "mean": 0, "min": 0, "max": 0, "stddev": 0, "rounds": 3}}}', "negative or non-finite"),
])  # fmt: skip
def test_bad_files_are_refused_naming_the_file(tmp_path, text, message):
    path = tmp_path / "benchmarks.json"
    path.write_text(text)
    with pytest.raises(bl.BaselineError, match=message) as err:
        bl.load(path)
    assert str(path) in str(err.value)


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        bl.load(tmp_path / "none.json")


def test_differences_name_every_field():
    other = {**MACHINE, "device": "NVIDIA H100 80GB HBM3", "torch": "2.10.0"}
    diff = bl.differences(MACHINE, other)
    assert diff == ["device ('NVIDIA H200' in the baseline, 'NVIDIA H100 80GB HBM3' here)",
                    "torch ('2.11.0' in the baseline, '2.10.0' here)"]  # fmt: skip
    assert bl.differences(MACHINE, dict(MACHINE)) == []


def test_compare_verdicts():
    base = bl.Baseline("h200", MACHINE, {
        "same": entry(100e-6, 2e-6), "slower": entry(100e-6, 2e-6), "faster": entry(100e-6, 2e-6),
        "noisy": entry(100e-6, 40e-6), "reshaped": entry(100e-6), "gone": entry(1.0),
    })  # fmt: skip
    now = {"same": entry(105e-6, 2e-6), "slower": entry(120e-6, 2e-6), "faster": entry(50e-6, 1e-6),
           "noisy": entry(150e-6, 40e-6), "reshaped": entry(300e-6, length=8192), "fresh": entry(1e-3)}
    rows = {r.name: r for r in bl.compare(base, now, threshold_pct=10)}
    assert {n: r.verdict for n, r in rows.items()} == {
        "same": bl.OK, "slower": bl.REGRESSION, "faster": bl.IMPROVED,
        "noisy": bl.OK,  # +50% but within 1.5 x the 40 us IQR: noise, not a regression
        "reshaped": bl.CHANGED, "fresh": bl.NEW,
    }  # fmt: skip
    assert rows["slower"].limit == pytest.approx(110e-6) and rows["slower"].change == pytest.approx(0.2)
    lines = bl.table(list(rows.values()))
    assert lines[0].split() == ["benchmark", "baseline", "now", "change", "verdict"]
    assert any("slower" in l and "+20.0%" in l and "REGRESSION (limit 110 us)" in l for l in lines)


def test_compare_judges_host_bound_benchmarks_by_their_threshold():
    """A benchmark whose baseline or run recorded a host share of at least HOST_BOUND_SHARE takes
    the host-bound threshold; without one (or without the threshold) the plain one."""
    def timed(median, share):
        return bl.Entry(median=median, iqr=1e-6, q1=median, q3=median, mean=median, min=median, max=median,
                        stddev=0.0, rounds=10, info={"shape": {"length": 1}, "host_share": share})  # fmt: skip

    base = bl.Baseline("h200", MACHINE, {
        "host": timed(400e-6, 0.9), "host_now": timed(400e-6, None), "device": timed(400e-6, 0.1),
        "host_far": timed(400e-6, 0.9), "unknown": timed(400e-6, None),
    })  # fmt: skip
    now = {"host": timed(760e-6, 0.8), "host_now": timed(760e-6, 0.7), "device": timed(760e-6, 0.1),
           "host_far": timed(1100e-6, 0.9), "unknown": timed(760e-6, None)}
    rows = {r.name: r for r in bl.compare(base, now, threshold_pct=10, host_bound_threshold_pct=150)}
    assert {n: (r.verdict, r.host_bound) for n, r in rows.items()} == {
        "host": (bl.OK, True), "host_now": (bl.OK, True), "device": (bl.REGRESSION, False),
        "host_far": (bl.REGRESSION, True), "unknown": (bl.REGRESSION, False),
    }  # fmt: skip
    assert rows["host_far"].limit == pytest.approx(1000e-6)
    assert any("host_far" in line and "REGRESSION (limit 1 ms), host-bound" in line for line in bl.table(list(rows.values())))
    # without a host-bound threshold every benchmark takes the plain one
    plain = {r.name: r.verdict for r in bl.compare(base, now, threshold_pct=10)}
    assert plain["host"] == bl.REGRESSION
    assert bl.host_bound(timed(1.0, bl.HOST_BOUND_SHARE)) and not bl.host_bound(timed(1.0, 0.49), timed(1.0, None))


def test_updated_merges_same_machine_and_replaces_another():
    old = bl.Baseline("h200", MACHINE, {"a": entry(1.0), "b": entry(2.0)})
    merged, note = bl.updated(old, "h200", MACHINE, {"b": entry(3.0)})
    assert merged.entries["a"] == entry(1.0) and merged.entries["b"] == entry(3.0)
    assert note == "updated 1, kept 1 from the earlier run" and merged.created
    fresh, note = bl.updated(old, "h200", {**MACHINE, "driver": "590.1"}, {"b": entry(3.0)})
    assert set(fresh.entries) == {"b"} and "driver ('580.159.04' in the baseline, '590.1' here)" in note
    first, note = bl.updated(None, "h200", MACHINE, {"b": entry(3.0)})
    assert note == "new baseline with 1 benchmarks"


@pytest.mark.parametrize("seconds, text", [(None, "-"), (2.5, "2.5 s"), (0.0123, "12.3 ms"), (4.2e-5, "42 us"),
                                           (3e-9, "3 ns")])  # fmt: skip
def test_format_seconds(seconds, text):
    assert bl.format_seconds(seconds) == text
