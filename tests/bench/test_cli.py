"""``nsa-bench`` on the CPU with tiny sizes: tables, CSV, PNG, baseline drawn or refused."""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys

import pytest
import torch

from nsa.bench import baselines as bl
from nsa.bench.cli import DECODE_COLUMNS, PACKED_COLUMNS, PREFILL_COLUMNS, Bench, main, parse_sizes
from nsa.bench.workloads import Shape, default_config, point_info

TINY = ["--heads", "2", "--kv-heads", "1", "--head-dim", "16", "--dtype", "fp32", "--rounds", "2", "--warmup", "1",
        "--device", "cpu", "--profile", "cpu"]  # fmt: skip
PNG = b"\x89PNG\r\n\x1a\n"
# The CSV writes 4 significant digits (up to 5e-4 relative rounding each), and a ratio
# column is checked against two other rounded columns: three roundings, at most ~1.5e-3.
RATIO_REL = 2e-3


def rows_of(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_parse_sizes():
    assert parse_sizes("8k, 16K,512,1m") == (8192, 16384, 512, 1 << 20)
    for bad in ("8x", "0", "", "k"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_sizes(bad)


def test_decode_writes_table_csv_and_png(tmp_path, capsys):
    out_csv, out_png = tmp_path / "d.csv", tmp_path / "d.png"
    assert main(["decode", "--contexts", "256,300", "--batch", "1", *TINY, "--baseline", "none",
                 "--csv", str(out_csv), "--plot", str(out_png)]) == 0  # fmt: skip
    captured = capsys.readouterr()
    assert "[1/2] decode B=1 S=256" in captured.err and "[2/2] decode B=1 S=300" in captured.err
    assert captured.out.split("\n")[0].split() == list(DECODE_COLUMNS)
    rows = rows_of(out_csv)
    assert [r["context"] for r in rows] == ["256", "300"] and all(r["status"] == "ok" for r in rows)
    config = default_config(torch.device("cpu"))
    assert rows[0]["reads_actual"] == rows[0]["reads_expected"] == str(config.decode_reads(256))
    assert float(rows[1]["reads_actual"]) < float(rows[1]["reads_expected"])  # partial own block at 300
    for r in rows:
        assert float(r["nsa_ms"]) > 0 and float(r["dense_ms"]) > 0
        assert float(r["nsa_over_dense"]) == pytest.approx(float(r["nsa_ms"]) / float(r["dense_ms"]), rel=RATIO_REL)
        assert all(float(r[f"{b}_ms"]) > 0 for b in ("cmp", "select", "slc", "win"))
    assert out_png.read_bytes()[:8] == PNG


def _baseline(tmp_path, machine, length=256):
    shape = Shape(1, length, 2, 1, 16, torch.float32)
    info = {"kind": "decode", "mode": "eager", "shape": point_info(shape, default_config(torch.device("cpu")))}
    entries = {f"t[{impl}]": bl.Entry(1e-3, 0, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 0, 3, {**info, "impl": impl})
               for impl in ("nsa", "dense")}  # fmt: skip
    path = tmp_path / "base.json"
    bl.save(bl.Baseline("cpu", machine, entries), path)
    return path


def test_decode_draws_the_matching_baseline(tmp_path, capsys):
    args = argparse.Namespace(device="cpu", profile="cpu", warmup=None, rounds=None)
    machine = Bench(args).machine
    path = _baseline(tmp_path, machine)
    out_csv = tmp_path / "d.csv"
    main(["decode", "--contexts", "256", "--batch", "1", *TINY, "--no-branches", "--baseline", str(path),
          "--csv", str(out_csv), "--plot", str(tmp_path / "d.png")])  # fmt: skip
    err = capsys.readouterr().err
    assert "2 baseline points drawn" in err
    row = rows_of(out_csv)[0]
    assert float(row["baseline_nsa_ms"]) == pytest.approx(1.0) and row["cmp_ms"] == ""


def test_decode_refuses_a_baseline_from_another_machine(tmp_path, capsys):
    args = argparse.Namespace(device="cpu", profile="cpu", warmup=None, rounds=None)
    path = _baseline(tmp_path, {**Bench(args).machine, "torch": "1.0.0"})
    main(["decode", "--contexts", "256", "--batch", "1", *TINY, "--no-branches", "--baseline", str(path)])
    err = capsys.readouterr().err
    assert "refused" in err and "torch ('1.0.0' in the baseline" in err


def test_prefill_and_replot(tmp_path, capsys):
    out_csv, out_png = tmp_path / "p.csv", tmp_path / "p.png"
    main(["prefill", "--lengths", "64,128", *TINY, "--baseline", "none", "--csv", str(out_csv),
          "--plot", str(out_png)])  # fmt: skip
    rows = rows_of(out_csv)
    assert list(rows[0]) == list(PREFILL_COLUMNS) and [r["length"] for r in rows] == ["64", "128"]
    for r in rows:
        assert float(r["fwd_speedup"]) == pytest.approx(float(r["dense_fwd_ms"]) / float(r["nsa_fwd_ms"]), rel=RATIO_REL)
        assert float(r["nsa_fwdbwd_ms"]) > 0
    assert out_png.read_bytes()[:8] == PNG
    again = tmp_path / "again.png"
    assert main(["plot", "--csv", str(out_csv), "--plot", str(again), "--title", "t"]) == 0
    assert again.read_bytes()[:8] == PNG and "wrote" in capsys.readouterr().err


@pytest.mark.parametrize("flags, queued", [([], True), (["--sync-calls"], False)], ids=["queued", "sync-calls"])
def test_prefill_queues_its_calls_unless_asked_to_sync(flags, queued, tmp_path, monkeypatch):
    """The prefill table is device time, as do_bench takes it, unless --sync-calls."""
    import nsa.bench.cli as cli

    seen = []
    real = cli.prefill_runner
    monkeypatch.setattr(cli, "prefill_runner", lambda *a, **k: (seen.append(k["queued"]), real(*a, **k))[1])
    out_csv = tmp_path / "p.csv"
    main(["prefill", "--lengths", "64", *TINY, "--baseline", "none", "--csv", str(out_csv), *flags])
    assert seen and set(seen) == {queued}
    assert rows_of(out_csv)[0]["timing"].startswith("cpu perf_counter")  # a CPU has no device queue


def test_packed_table_csv_and_plot(tmp_path, capsys):
    """Packs of documents, NSA against dense attention over the same pack: one row a kind, a
    plot of them, and the plot drawn again from the CSV."""
    out_csv, out_png = tmp_path / "k.csv", tmp_path / "k.png"
    assert main(["packed", "--total", "512", "--packs", "lognormal,one_long", *TINY, "--csv", str(out_csv),
                 "--plot", str(out_png)]) == 0  # fmt: skip
    assert out_png.read_bytes()[:8] == PNG
    again = tmp_path / "again.png"
    assert main(["plot", "--csv", str(out_csv), "--plot", str(again)]) == 0
    assert again.read_bytes()[:8] == PNG and "wrote" in capsys.readouterr().err
    rows = rows_of(out_csv)
    assert list(rows[0]) == list(PACKED_COLUMNS) and [r["pack"] for r in rows] == ["lognormal", "one_long"]
    for r in rows:
        assert r["status"] == "ok" and r["boundaries"] == "host" and r["dense"] == "sdpa per sequence"
        assert int(r["sequences"]) > 2 and int(r["batches"]) >= 1 and 1 <= float(r["padded_ratio"]) < 2 ** 0.5
        for mode in ("fwd", "fwdbwd"):
            ratio = float(r[f"dense_{mode}_ms"]) / float(r[f"nsa_{mode}_ms"])
            assert float(r[f"{mode}_speedup"]) == pytest.approx(ratio, rel=RATIO_REL)


def test_module_entry_point_runs():
    done = subprocess.run([sys.executable, "-m", "nsa.bench", "--help"], capture_output=True, text=True, check=True)
    assert all(command in done.stdout for command in ("decode", "prefill", "packed", "plot"))


@pytest.mark.parametrize("extra, message", [
    (["--heads", "6", "--kv-heads", "4"], "Shape.heads=6 must be a multiple of kv_heads=4"),
    (["--profile", "nope"], "unknown GPU profile 'nope'"),
])  # fmt: skip
def test_user_errors_exit_2_with_the_reason(extra, message, capsys):
    with pytest.raises(SystemExit) as done:
        main(["decode", "--contexts", "64", "--device", "cpu", *extra])
    assert done.value.code == 2 and message in capsys.readouterr().err


def test_packed_names_a_bad_kind(capsys):
    with pytest.raises(SystemExit) as done:
        main(["packed", "--packs", "lognormal,short", *TINY])
    assert done.value.code == 2 and "--packs takes kinds of lognormal, long, uniform, one_long" in capsys.readouterr().err


def test_decode_plot_draws_each_batch_apart_with_its_ratio(tmp_path, monkeypatch):
    """Every batch size of a decode plot has its own line style and marker (NSA and dense of one
    batch share them), and its dense / NSA at the longest context is written beside the NSA line."""
    from nsa.bench import plot

    drawn = []
    monkeypatch.setattr(plot, "_save", lambda fig, ax, path: drawn.append(ax))
    rows = [{"batch": b, "context": c, "nsa_ms": 0.01 * b * (1 + c / 65536), "dense_ms": 0.05 * b * c / 8192, "status": "ok"}
            for b in (1, 16, 32, 64) for c in (8192, 65536)]  # fmt: skip
    plot.decode_plot(rows, None, tmp_path / "d.png", "t")
    (ax,) = drawn
    style = {line.get_label(): (line.get_linestyle(), line.get_marker()) for line in ax.lines}
    assert len({style[f"NSA B={b}"] for b in (1, 16, 32, 64)}) == 4
    assert all(style[f"NSA B={b}"] == style[f"dense SDPA B={b}"] for b in (1, 16, 32, 64))
    ratios = sorted(t.get_text() for t in ax.texts)
    want = sorted(f"{(0.05 * b * 8) / (0.01 * b * 2):.2f}x" for b in (1, 16, 32, 64))
    assert ratios == want
