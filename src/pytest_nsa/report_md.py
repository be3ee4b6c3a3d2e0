"""``report.md``: the validation report a person reads, rendered from ``env.json`` and ``results.json``.

No pytest import here. :func:`render` takes the two documents (as built by
:mod:`pytest_nsa.report_data`) and returns Markdown; it reads nothing else, so
the report says exactly what the machine-readable files say.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from nsa.bench.baselines import REGRESSION, format_seconds
from pytest_nsa.margins import describe_error, describe_share
from pytest_nsa.report_data import MATRIX_ROWS, OUTCOMES

#: pytest's exit codes, for the summary line.
EXIT_NAMES: Dict[int, str] = {0: "all passed", 1: "tests failed", 2: "interrupted", 3: "internal error",
                              4: "usage error", 5: "no tests collected"}
#: Section titles, in order; the report's tests look for these.
SECTIONS = ("Environment", "Software checks", "Profile and flags", "Backends", "Results by marker",
            "Parity margins", "GPU memory", "Skipped tests by reason", "Failures", "Benchmarks")


def cell(value: Any) -> str:
    """One Markdown table cell: ``None`` as ``-``, ``|`` escaped, newlines folded."""
    if value is None:
        return "-"
    return " ".join(str(value).split()).replace("|", "\\|") or "-"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> List[str]:
    """A Markdown table (numbers right-aligned by the header row's ``---:``)."""
    numeric = [bool(rows) and all(isinstance(r[i], (int, float)) and not isinstance(r[i], bool) for r in rows)
               for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return lines


def _title(env: Mapping[str, Any], results: Mapping[str, Any]) -> List[str]:
    run = results["run"]
    commit = env["commit"]["short"] + (" (uncommitted changes)" if env["commit"]["dirty"] else "")
    status = run["exit_status"]
    lines = [f"# NSA validation report: {env['device']['description']}", ""]
    if run["partial"]:
        lines += ["> **PARTIAL REPORT**: the run did not finish every collected test.", ">"]
        lines += [f"> - {reason}" for reason in run["partial_reasons"]]
        lines += [f"> - did not finish (not counted below): `{nodeid}`" for nodeid in run["unfinished"]]
        lines.append("")
    lines += [
        f"- report `{results['report_id']}`, commit `{commit}`",
        f"- started {run['started']}, finished {run['finished']} ({run['duration_s']:.1f} s)",
        f"- exit status {status} ({_status(results)}); {run['collected']} tests collected"
        + (f", {run['xdist_workers']} xdist workers" if run["xdist_workers"] else ""),
        f"- command: `{' '.join(['pytest', *run['args']])}`",
    ]
    lines += [f"- worker {worker}: {note}" for worker, note in run["worker_notes"].items()]
    return lines + [""]


def _status(results: Mapping[str, Any]) -> str:
    """pytest's name of the exit status, or why the run failed when no test did."""
    status = results["run"]["exit_status"]
    tables = results["benchmarks"]["tables"]
    regressed = sum(1 for rows in tables.values() for r in rows if r["verdict"] == REGRESSION)
    if status == 1 and not results["failures"] and regressed:
        return f"{regressed} benchmark(s) regressed against the baseline; no test failed"
    return EXIT_NAMES.get(status, "unknown")


def _environment(env: Mapping[str, Any]) -> List[str]:
    dev, sw, plat = env["device"], env["software"], env["platform"]
    gpus = "; ".join(f"{g['index']}: {g['name']} (SM {g['capability']}, {g['memory_gib']:.1f} GiB)"
                     for g in dev["gpus"]) or "none"
    triton = sw["triton"] and f"{sw['triton']} ({sw['triton_dist']})"
    rows = [
        ("GPUs", gpus), ("driver", dev["driver"]), ("CUDA (torch build)", dev["cuda"]),
        ("CUDA_VISIBLE_DEVICES", dev["visible_devices"]), ("device record", dev["source"]),
        ("Python", sw["python"]), ("torch", sw["torch"]), ("triton", triton or "not installed"),
        ("torch's triton pin", sw["torch_triton_pin"] or "none declared"),
        ("flash-attn", sw["flash_attn"] or "not installed"), ("software record", sw["source"]),
        ("platform", f"{plat['system']} {plat['release']} {plat['machine']}"),
    ]
    return ["## Environment", "", *table(("item", "value"), rows), ""]


def _checks(env: Mapping[str, Any]) -> List[str]:
    rows = [(c["check"], c["level"].upper(), c["message"], c["fix"]) for c in env["checks"]]
    body = table(("check", "verdict", "message", "fix"), rows) if rows else ["No software check ran."]
    return ["## Software checks", "", "The torch/triton pairing verdict and the profile's version checks.", "",
            *body, ""]


def _profile(env: Mapping[str, Any]) -> List[str]:
    prof, flags = env["profile"], env["flags"]
    lines = ["## Profile and flags", ""]
    if prof is None:
        lines.append("No profile was selected.")
    else:
        lines.append(f"- profile `{prof['name']}` ({prof['path']}): {prof['description']}")
        lines.append(f"- chosen by: {prof['note']}" + ("" if prof["applied"] else " (flags not applied)"))
        if prof["mismatch"]:
            lines.append(f"- **mismatch**: {prof['mismatch']}; GPU tests skipped")
        applied = ", ".join(f"`{k}={v}`" for k, v in flags["applied"].items()) or "none"
        lines.append(f"- flags the profile applied: {applied}")
        if flags["kept"]:
            kept = ", ".join(f"`{k}={v['yours']}` (profile: `{v['profile']}`)" for k, v in flags["kept"].items())
            lines.append(f"- your settings kept over the profile's: {kept}")
    if "in_effect" in flags:  # reports from session 26 on
        in_effect = ", ".join(f"`{k}={v}`" for k, v in flags["in_effect"].items()) or "none (every flag at its default)"
        lines.append(f"- NSA_ flags set for the run: {in_effect}")
    f32 = env.get("float32")
    if f32 is not None:
        products = f32["products"] or f"unknown ({f32['error']})"
        lines.append(f"- float32 products: {products} (torch's float32 matmul precision: "
                     f"{f32['torch_matmul_precision']}; `NSA_FLOAT32_DOT`)")
    if prof is not None:
        off = [(name, f["reason"]) for name, f in env["features"].items() if not f["enabled"]]
        lines.append("- features off: " + ("; ".join(f"{n} ({r})" for n, r in off) or "none"))
    lines += [f"- warning: {w}" for w in env["warnings"]]
    return lines + [""]


def _routing(env: Mapping[str, Any]) -> List[str]:
    route = env["routing"]
    head = f"Backend `nsa.routing` picks for each op on device `{route['device']}` with `{route['dtype']}`."
    rows = [(r["op"], r["backend"], r["reason"]) for r in route["ops"]]
    return ["## Backends", "", head, "", *table(("op", "backend", "reason"), rows), ""]


#: Markers whose row the matrix always shows: a zero row says "none of these ran", which an
#: absent row would hide. Other markers appear when some test carries them.
ALWAYS_SHOWN = ("parity", "gradcheck", "triton", "fa2", "benchmark", "long_context")


def _matrix(results: Mapping[str, Any]) -> List[str]:
    by = results["by_marker"]
    rows = [(f"`{m}`" if not m.startswith("(") else m, *(by[m][o] for o in OUTCOMES), by[m]["total"])
            for m in MATRIX_ROWS if by[m]["total"] or m in ALWAYS_SHOWN]
    rows.append(("**all**", *(results["totals"][o] for o in OUTCOMES), results["totals"]["total"]))
    note = ("A test with several markers counts in each of their rows; **all** counts every test once "
            "(collection errors included under error).")
    return ["## Results by marker", "", note, "", *table(("marker", *OUTCOMES, "total"), rows), ""]


def _opening(results: Mapping[str, Any], title: str, key: str, count: str, absent: str,
             empty: str) -> Tuple[List[str], Optional[Mapping[str, Any]]]:
    """A section's first lines and its part of ``results``; the part is ``None``, and the lines say
    why, where the report predates it (``absent``) or it counted nothing (``empty``)."""
    lines = [f"## {title}", ""]
    part = results.get(key)
    if part is None:
        return lines + [absent, ""], None
    if not part[count]:
        return lines + [empty, ""], None
    return lines, part


def _margins(results: Mapping[str, Any]) -> List[str]:
    lines, margins = _opening(results, "Parity margins", "margins", "comparisons",
                              "Not recorded by the plugin that wrote this report.",
                              "No test compared through `nsa.testing.assert_close`.")
    if margins is None:
        return lines
    lines += [f"{margins['comparisons']} comparisons (`nsa.testing.assert_close`: relative error against the "
              f"test's bound) in {margins['tests']} tests, by share of the bound (error / bound):", ""]
    lines += table([c["share"] for c in margins["classes"]], [[c["count"] for c in margins["classes"]]])
    if "by_dtype" in margins:  # reports from session 29's last commits on
        rows = [(f"`{d['dtype']}`", d["comparisons"], describe_share(d["largest_share"])) for d in margins["by_dtype"]]
        lines += ["", "By the dtype under test:", "", *table(("dtype", "comparisons", "largest share"), rows)]
    rows = [(describe_share(r["share"]), f"`{r['nodeid']}`", r["name"], r.get("dtype") or "-",
             describe_error(r["error"]), f"{r['bound']:.1e}") for r in margins["closest"]]
    lines += ["", "Closest to their bound:", "",
              *table(("share", "test", "compared", "dtype", "error", "bound"), rows)]
    return lines + [""]


def _memory_rows(rows: Sequence[Mapping[str, Any]]) -> List[str]:
    # .get: the first reports that measured memory (ff0f048) had no local memory yet
    body = [(f"`{r['nodeid']}`", r["peak_gib"], r["kept_gib"], r.get("local_gib", 0.0), "yes" if r["alone"] else "no")
            for r in rows]
    return table(("test", "peak GiB", "kept GiB", "local GiB", "ran alone"), body)


def _gpu_memory(results: Mapping[str, Any]) -> List[str]:
    lines, memory = _opening(results, "GPU memory", "gpu_memory", "tests",
                             "Not measured by the plugin that wrote this report.",
                             "No test used the GPU through torch.")
    if memory is None:
        return lines
    share = memory["share_gib"]
    lines += [f"torch's CUDA allocator over each test's setup, call and teardown ({memory['tests']} tests): "
              "the peak, what stayed allocated after the teardown (kept), and the local memory the driver "
              "reserved for its kernels' register spills (local)"
              + (f"; xdist workers share each GPU, {share:.2f} GiB each." if share is not None else "."), "",
              "Largest peaks:", "", *_memory_rows(memory["largest"]), ""]
    if memory["over_share"]:
        lines += ["**Above their share beside other tests** (mark each `requires(memory_gib=...)` to run it alone):",
                  "", *_memory_rows(memory["over_share"]), ""]
    if memory["kept"]:
        lines += ["**Kept memory after their teardown:**", "", *_memory_rows(memory["kept"]), ""]
    if memory.get("local"):
        lines += ["**Local memory for register spills** (the CUDA driver keeps it for the largest per-thread stack "
                  "any kernel needed, outside torch's allocator, until the process ends or the stack limit is reset; "
                  "workers sharing a GPU reset it after every test):", "", *_memory_rows(memory["local"]), ""]
    return lines


def _skips(results: Mapping[str, Any]) -> List[str]:
    rows = [(s["count"], s["reason"], ", ".join(s["markers"]) or "-") for s in results["skips"]]
    body = table(("count", "reason", "markers"), rows) if rows else ["No test was skipped."]
    return ["## Skipped tests by reason", "", *body, ""]


def _failures(results: Mapping[str, Any]) -> List[str]:
    rows = [(f"`{f['nodeid']}`", f["when"], f["message"]) for f in results["failures"]]
    body = table(("test", "phase", "first error line"), rows) if rows else ["No failure."]
    return ["## Failures", "", *body, ""]


def _label(name: str) -> str:
    """``"tests/b.py::test_decode[nsa-eager-B1-S512]"`` -> ``"test_decode[nsa-eager-B1-S512]"``."""
    return name.rsplit("::", 1)[-1]


def _ratio(params: Mapping[str, Any]) -> Any:
    # Dense rows carry a ratio of 1 (dense against itself): shown for NSA rows only.
    ratio = params.get("nsa_over_dense")
    return f"{ratio:.2f}" if params.get("impl") == "nsa" and ratio is not None else None


def _bench_table(title: str, rows: Sequence[Mapping[str, Any]]) -> List[str]:
    body = [(f"`{_label(r['name'])}`", format_seconds(r["baseline"]), format_seconds(r["now"]),
             None if r["change_pct"] is None else f"{r['change_pct']:+.1f}%", r["verdict"],
             _ratio(r["params"])) for r in rows]
    header = ("benchmark", "baseline", "now", "change", "verdict", "NSA / dense (this run)")
    return [f"### {title}", "", *table(header, body), ""]


def _benchmarks(bench: Mapping[str, Any]) -> List[str]:
    lines = ["## Benchmarks", "", bench["note"], ""]
    for key, title in (("decode", "Decode"), ("prefill", "Prefill"), ("other", "Other benchmarks")):
        if bench["tables"][key]:
            lines += _bench_table(title, bench["tables"][key])
    for plot in bench["plots"]:
        lines += [f"![{plot['title']}]({plot['file']})", ""]
    lines += [f"- plots not drawn: {why}" for why in bench.get("plots_missing", [])]
    if bench["json_file"]:
        lines.append(f"- pytest-benchmark data of this run: [`{bench['json_file']}`]({bench['json_file']})")
    return lines + [""]


def render(env: Mapping[str, Any], results: Mapping[str, Any]) -> str:
    """The whole ``report.md``: title and run summary, then every section of :data:`SECTIONS`."""
    parts = [_title(env, results), _environment(env), _checks(env), _profile(env), _routing(env),
             _matrix(results), _margins(results), _gpu_memory(results), _skips(results), _failures(results),
             _benchmarks(results["benchmarks"])]
    files = ["## Files", "", "- `env.json`, `results.json`: the facts above, machine-readable "
             f"(schema version {results['schema_version']}; see `docs/reports/README.md`)", ""]
    return "\n".join(line for part in [*parts, files] for line in part).rstrip("\n") + "\n"
