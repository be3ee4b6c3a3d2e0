"""The scripts around the library: those that edit a copy of its source must still find their places
in it, and the GPU sessions' scripts must parse and document their steps."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import shutil
import subprocess

import pytest

SCRIPTS = pathlib.Path(__file__).resolve().parents[1] / "scripts"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_decode_trace_probe_finds_every_stamp_place():
    """``scripts/gpu_decode_trace.py`` inserts its timer stamps at anchors in the decode kernels'
    source (each must occur once, or it stops): a kernel edit that moves one breaks the probe here,
    not on the GPU machine. Every kernel of the copy then takes a ``trace`` argument."""
    probe = _script("gpu_decode_trace")
    tree = probe.instrumented_tree()
    try:
        decode = tree / "nsa" / "ops" / "decode"
        for name in ("compressed_pass.py", "score.py", "selected.py", "combine.py"):
            source = (decode / name).read_text()
            assert " trace,\n):" in source and "trace_stamp(p_tr, 4" in source, name
        assert (decode / "kernel.py").read_text().count("trace=TRACE[") == 4
    finally:
        shutil.rmtree(tree)


def test_gpu_session_scripts_parse_and_document_their_steps():
    """Each ``scripts/gpu_sessionNN.sh`` (the record of a session's GPU calls, re-run from its
    header) parses as bash, and its header documents exactly the steps its ``case`` handles: a
    typo there would otherwise surface on the GPU machine, in device time."""
    scripts = sorted(SCRIPTS.glob("gpu_session*.sh"))
    assert scripts
    for path in scripts:
        parsed = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert parsed.returncode == 0, f"{path.name}: {parsed.stderr}"
        source = path.read_text()
        header = set(re.findall(rf"^#\s+(?:[A-Z_]+=\S+\s+)*bash scripts/{re.escape(path.name)}\s+(\w+)", source, re.M))
        body = re.search(r"^case [^\n]* in\n(.*?)^esac", source, re.M | re.S)
        assert body, f"{path.name}: no case over its steps"
        handled = {step.strip() for labels in re.findall(r"^([\w][\w |]*)\)", body.group(1), re.M)
                   for step in labels.split("|")}  # fmt: skip
        assert header == handled, f"{path.name}: documented {sorted(header)}, handled {sorted(handled)}"


def test_decode_trace_reports_each_row_groups_last_compressed_program():
    """The trace's "row-group done" is, per (row, KV group), the end of its last compressed
    program (what a score program waiting for its own row-group would wait for): here two
    row-groups of three splits, whose programs end out of order."""
    import torch

    probe = _script("gpu_decode_trace")
    trace = torch.full((4, 6 * 8), -1, dtype=torch.int64)
    cmp = trace[0].view(6, 8)
    ends = {(0, 0): 5000, (1, 0): 9000, (2, 0): 7000, (0, 1): 12000, (1, 1): 3000, (2, 1): 4000}
    for i, ((split, row_group), end) in enumerate(ends.items()):
        cmp[i, 0], cmp[i, 1], cmp[i, 4], cmp[i, 5], cmp[i, 6] = 0, 1000, end, split, row_group
    stats = probe.analyse(trace)["cmp"]
    assert sorted(stats["row-group done"]) == [8.0, 11.0]  # us after the first start (1000 ns)
    assert sorted(stats["end"]) == [2.0, 3.0, 4.0, 6.0, 8.0, 11.0]


def test_ncu_stalls_adds_launches_and_weighs_their_ratios_by_instructions(tmp_path):
    """``scripts/ncu_stalls.py`` reads Nsight Compute's raw CSV: launches of one kernel add their
    times and instructions, and each stall ratio is their instruction-weighted mean, so a kernel's
    warp cycles per issued instruction is the sum of its reasons."""
    stall = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
    head = ["ID", "Kernel Name", "gpu__time_duration.sum", "smsp__inst_executed.sum",
            stall.format("long_scoreboard"), stall.format("barrier")]
    units = ["", "", "usecond", "inst", "", ""]
    rows = [head, units,
            ["0", "score_kernel(int)", "10", "1,000", "3", "1"],
            ["1", "score_kernel(int)", "30", "3,000", "1", "n/a"],
            ["2", "combine_kernel(int)", "5", "500", "0.5", "0.5"]]
    path = tmp_path / "stalls.csv"
    path.write_text("==PROF== Connected\nprinted by the script\n" + "\n".join(",".join(f'"{c}"' for c in row) for row in rows) + "\n")
    probe = _script("ncu_stalls")
    k = probe.kernels(str(path))
    assert k["score_kernel"]["n"] == 2 and abs(k["score_kernel"]["s"] - 40e-6) < 1e-12
    assert k["score_kernel"]["inst"] == 4000
    assert abs(k["score_kernel"]["stall:long_scoreboard"] - 1.5) < 1e-12  # (3 * 1000 + 1 * 3000) / 4000
    assert abs(k["score_kernel"]["stall:barrier"] - 0.25) < 1e-12  # n/a counts as 0
    text = probe.table(str(path), top=1)
    assert "| score_kernel | 2 | 0.040 | 0.0 | 1.75 | long_scoreboard 1.50 (86 %) |" in text, text
    assert text.index("score_kernel") < text.index("combine_kernel")  # by time


def test_ncu_bytes_weighs_hit_rates_by_l2_bytes_and_reads_files_without_them(tmp_path):
    """``scripts/ncu_bytes.py``: launches of one kernel add their times and bytes; the L2 hit rate, where
    the file has it, is their mean weighted by L2 bytes, and a file without the column (session 23's)
    gives the table without it."""
    head = ["ID", "Kernel Name", "gpu__time_duration.sum", "lts__t_bytes.sum", "dram__bytes_read.sum",
            "dram__bytes_write.sum", "lts__throughput.avg.pct_of_peak_sustained_elapsed",
            "sm__throughput.avg.pct_of_peak_sustained_elapsed", "lts__t_sector_hit_rate.pct"]
    units = ["", "", "ms", "Gbyte", "Gbyte", "Gbyte", "%", "%", "%"]
    rows = [["0", "sel_kernel(int)", "1", "3", "0.5", "0.1", "80", "20", "90"],
            ["1", "sel_kernel(int)", "3", "1", "0.5", "0.1", "40", "20", "50"],
            ["2", "topn_kernel(int)", "1", "0", "0", "0", "0", "50", "0"]]
    probe = _script("ncu_bytes")

    def write(name, columns):
        path = tmp_path / name
        lines = [[row[i] for i in columns] for row in [head, units, *rows]]
        path.write_text("==PROF== Connected\n" + "\n".join(",".join(f'"{c}"' for c in line) for line in lines) + "\n")
        return str(path)

    with_hits = write("hits.csv", range(len(head)))
    k = probe.kernels(with_hits)["sel_kernel"]
    assert k["n"] == 2 and abs(k["s"] - 4e-3) < 1e-12 and abs(k["l2"] - 4e9) < 1
    assert abs(k["hit_l2"] / k["l2"] - 80.0) < 1e-9  # (90 * 3 + 50 * 1) / 4
    assert abs(k["l2_pct_s"] / k["s"] - 50.0) < 1e-9  # (80 * 1 + 40 * 3) / 4, by time
    text = probe.table(with_hits)
    assert "| L2 hit % |" in text and "| sel_kernel | 2 | 4.000 | 4.00 | 1.00 / 0.20 | 50.0 | 20.0 | 1.00 | 80.0 |" in text
    assert "| topn_kernel | 1 | 1.000 | 0.00 | 0.00 / 0.00 | 0.0 | 50.0 | 0.00 |  |" in text  # no bytes, no rate
    without = probe.table(write("plain.csv", range(len(head) - 1)))
    assert "hit" not in without and "| sel_kernel | 2 | 4.000 | 4.00 | 1.00 / 0.20 | 50.0 | 20.0 | 1.00 |\n" in without


def test_ncu_source_stalls_sums_reasons_and_ranks_instructions(tmp_path):
    """``scripts/ncu_source_stalls.py`` reads Nsight Compute's source page (SASS): each reason's
    samples summed over the instructions (the "Not Issued" twins left out), and the instructions ranked
    by their samples, with their executions and commonest reasons."""
    head = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_barrier",
            "stall_wait", "stall_barrier (Not Issued)"]
    rows = [["Kernel Name", "window_fwd_gluon_kernel"], head,
            ["0x0", "  HGMMA.64x64x16.F32.BF16 R88, gdesc[UR48], RZ", "5", "1,584", "1", "4", "9"],
            ["0x10", "  MUFU.EX2 R1, R1", "12", "142592", "10", "2", "9"],
            ["0x20", "  NOP", "0", "-", "0", "0", "0"]]
    path = tmp_path / "source.csv"
    path.write_text("==PROF== Disconnected\n" + "\n".join(",".join(f'"{c}"' for c in row) for row in rows) + "\n")
    probe = _script("ncu_source_stalls")
    listing = probe.instructions(str(path))
    assert [i.samples for i in listing] == [5, 12, 0] and listing[0].executed == 1584
    assert listing[1].reasons == {"barrier": 10, "wait": 2}
    text = probe.report(str(path), top=2)
    assert "| barrier | 11 | 64.7 % |" in text and "| wait | 6 | 35.3 % |" in text, text
    assert text.index("MUFU.EX2") < text.index("HGMMA") and "NOP" not in text
    assert "| 1 | 12 | 70.6 % | 142592 | `MUFU.EX2 R1, R1` | barrier 10, wait 2 |" in text, text


def test_prefill_timeline_splits_calls_at_the_flushes_and_counts_idle_time():
    """``scripts/gpu_prefill_timeline.py`` cuts the profiled trace into calls at the runner's L2
    flushes: the fill that opens the trace and those like it. A call's own fill, longer and once a
    call too, stays in the call (session 60's first run split each 64k call in two at one), and a
    call's busy time is the union of its overlapping activities."""
    probe = _script("gpu_prefill_timeline")
    flush, own = ("fill<int>", "[1600]"), ("fill<float>", "[800]")
    spans = [(0, 40, *flush), (41, 50, "a", ""), (55, 60, "b", ""), (58, 70, "c", ""), (72, 122, *own),
             (130, 170, *flush), (171, 180, "d", ""), (190, 240, *own)]
    calls = probe._split_calls(spans, 2)
    assert [[name for _, _, name in call] for call in calls] == [["a", "b", "c", own[0]], ["d", own[0]]]
    assert probe._union(calls[0]) == 9 + 15 + 50  # b and c overlap from 58 to 60
    assert probe._union(calls[1]) == 9 + 50
    with pytest.raises(ValueError, match="found 2 fills"):
        probe._split_calls(spans, 3)


def test_ptxas_notes_reads_each_kernels_serialisation_notes(tmp_path):
    """``scripts/gpu_ptxas_notes.py`` finds ptxas's wgmma serialisation notes per kernel of a Triton
    cache (with its registers and spills), those that end "in the function" (C7514, C7515) and
    those that end "for the function" (C7512, which session 60's reading missed); a stand-in ptxas
    prints the log, so that what is checked is the reading of it."""
    probe = _script("gpu_ptxas_notes")
    kernel = tmp_path / "abc" / "window_kernel.ptx"
    kernel.parent.mkdir()
    kernel.write_text(".version 8.7\n.target sm_90a\n")
    (tmp_path / "abc" / "window_kernel.json").write_text('{"name": "window_kernel", "num_warps": 4}')
    fake = tmp_path / "ptxas"
    fake.write_text("#!/bin/sh\ncat >&2 <<'LOG'\n"
                    "ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized "
                    "due to non wgmma instructions defining accumulator registers of a wgmma between start and end "
                    "of the pipeline stage in the function 'window_kernel'\n"
                    "ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are serialized "
                    "due to insufficient register resources for the function 'window_kernel'\n"
                    "ptxas info    : Used 226 registers, used 1 barriers\n"
                    "    0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\nLOG\n")
    fake.chmod(0o755)
    probe._ptxas = lambda: str(fake)
    rows = probe.kernel_notes(str(tmp_path))
    assert rows == [("window_kernel", 4, "226", "8 bytes spill stores, 4 bytes spill loads", [
        ("C7512", "wgmma.mma_async instructions are serialized due to insufficient register resources"),
        ("C7515", "wgmma.mma_async instructions are serialized due to non wgmma instructions defining accumulator "
                  "registers of a wgmma between start and end of the pipeline stage")])]


@pytest.mark.triton
def test_fuzz_case_runs_a_case_and_its_variants(capsys, nsa_device):
    """``scripts/fuzz_case.py``: the drawn case, then each variant with fields replaced (a dtype by
    its name; several separated by ``;``), a line each; a variant that fails is reported and the
    next still runs."""
    if nsa_device.type == "cuda":
        pytest.skip("the interpreter-sized case runs on the CPU; the GPU runs the fuzz tests themselves")
    script = _script("fuzz_case")
    code = script.main(["prefill", "23", "--scale", "interpreter", "--vary", "dtype=float16", "group=0",
                        "dtype=float16;grad=True"])  # 9 tokens
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["ok    as drawn", "ok    dtype=float16", "FAIL  group=0",
                                                      "ok    dtype=float16;grad=True"]
    assert "float16" in lines[1] and "ValueError: query heads HQ=0" in lines[2] and code == 1
    assert "float16" in lines[3] and lines[3].endswith(" grad") and not lines[1].endswith(" grad")


def test_launch_resources_tells_ir_that_moved_lines_from_ir_that_changed(tmp_path, capsys):
    """``scripts/launch_resources.py same A B``: a launch whose Triton GPU IR differs only in its
    source locations (the kernel's lines moved) is the same; one whose operations differ is not,
    and the exit status says so."""
    import sys

    module = _script("launch_resources")
    ir = ('#loc = loc("/src/a.py":10:0)\nmodule {\n  tt.func public @selected_fwd_kernel(%arg0: i32 loc("a"(#loc))) {\n'
          '    %0 = arith.addi %arg0, %arg0 : i32 loc(callsite(#loc1 at #loc2))\n'
          '  ^bb0(%m: i32 loc(callsite(#loc1 at #loc7)), %n: i32 loc(callsite(#loc1 at #loc7))):\n  }\n}\n')
    for name, text in (("a", ir), ("b", ir.replace("10:0", "12:0").replace("#loc7", "#loc9")),
                       ("c", ir.replace("addi", "muli"))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "k0.ttgir").write_text(text)
    args = [sys.argv[0], "same", str(tmp_path / "a"), str(tmp_path / "b")]
    for second, code, verdict in (("b", 0, "| k0 | selected_fwd_kernel | same | - |"),
                                  ("c", 1, "| k0 | selected_fwd_kernel | **differs** | - |")):
        args[-1] = str(tmp_path / second)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(sys, "argv", args)
            with pytest.raises(SystemExit) as stop:
                module.main()
        assert stop.value.code == code and verdict in capsys.readouterr().out


def test_launch_resources_follows_the_selected_kernels_fallback():
    """``launch_resources.py compile --fallback`` compiles, after a selected launch past shared
    memory, the launches the library makes instead (``smaller_launch``), in the recorded values'
    notation: one stage fewer, then key tiles by plain loads (the descriptors no longer passed);
    other kernels have none."""
    module = _script("launch_resources")
    values = {"BSP": "128", "KEY_TILES": "1", "KV_DESC": "True", "d_k": "tensordesc<fp32[1,128,1,256]>",
              "d_v": "tensordesc<fp32[1,128,1,256]>", "BK": "256"}
    seen, step = [], (values, {"num_stages": 2, "num_warps": 8})
    while step is not None:
        values, opts = step
        seen.append((opts["num_stages"], values["KEY_TILES"], values["KV_DESC"], values["d_k"][:10]))
        step = module._smaller(values, opts)
    assert seen == [(2, "1", "True", "tensordesc"), (1, "1", "True", "tensordesc"), (1, "2", "False", "None"),
                    (1, "4", "False", "None"), (1, "8", "False", "None")]
    assert module._smaller({"BSP": "64", "BT": "16"}, {"num_stages": 2}) is None  # not a selected kernel
