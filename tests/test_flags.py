"""The NSA_* flag registry: declared once, read at call time, validated, typos reported."""

from __future__ import annotations

import ast
import os
import pathlib
import re
import subprocess
import sys
import warnings

import pytest

from nsa import flags
from nsa.flags import FLAGS, Flag, FlagError

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    """Start every test with no NSA_* variable, whatever the shell or a profile set."""
    for key in [k for k in os.environ if k.startswith(flags.PREFIX)]:
        monkeypatch.delenv(key)


def _env_without_nsa(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(flags.PREFIX)}
    env.update(extra)
    return env


# ---------------------------------------------------------------- the registry


def test_each_flag_is_declared_once_under_its_name():
    assert all(name == flag.name and name.startswith("NSA_") for name, flag in FLAGS.items())
    with pytest.raises(RuntimeError, match="duplicate flag declaration NSA_X"):
        flags._declare(Flag("NSA_X", bool, True, "a"), Flag("NSA_X", int, 0, "b"))
    with pytest.raises(RuntimeError, match="bad or duplicate flag declaration BACKEND"):
        flags._declare(Flag("BACKEND", str, "auto", "no prefix"))


def test_every_op_has_a_backend_flag():
    for op in flags.OPS:
        flag = FLAGS[f"NSA_BACKEND_{op.upper()}"]
        assert flag.default == "auto" and flag.choices == flags.BACKEND_CHOICES
    assert FLAGS["NSA_BACKEND"].choices == ("auto", "reference", "triton")


@pytest.mark.parametrize("name", sorted(FLAGS))
def test_declaration_is_complete_and_its_default_valid(name):
    flag = FLAGS[name]
    assert flag.type in (bool, int, str) and len(flag.help) > 20
    assert isinstance(flag.default, flag.type)
    assert flag.parse(flag.format(flag.default)) == flag.default
    if flag.choices is not None:
        assert flag.type in (str, int) and flag.format(flag.default) in flag.choices
    assert flags.get(name, {}) == flag.default


def _string_constants(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node, node.value
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            yield node, str(node.values[0].value)


def _reads_environment(node: ast.AST) -> bool:
    """``os.getenv(...)``, ``os.environ.get(...)``, ``os.environ[...]`` or ``... in os.environ``."""
    text = ast.unparse(node)
    return bool(re.match(r"(os\.)?(getenv|environ(\.get|\.pop|\.setdefault)?)\b", text))


def test_no_module_but_flags_reads_nsa_variables():
    """CI rule: every NSA_ name in the sources is a declared flag, and only nsa/flags.py
    passes an NSA_ name to os.getenv / os.environ."""
    problems = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        tree = ast.parse(path.read_text(), filename=rel)
        for node, text in _string_constants(tree):
            if re.fullmatch(r"NSA_[A-Z0-9_]*[A-Z0-9]", text) and text not in FLAGS:
                problems.append(f"{rel}:{node.lineno}: undeclared flag name {text}")
        if rel == "nsa/flags.py":
            continue
        for node in ast.walk(tree):
            target = None
            if isinstance(node, ast.Call) and _reads_environment(node.func) and node.args:
                target = node.args[0]
            elif isinstance(node, ast.Subscript) and _reads_environment(node.value):
                target = node.slice
            if target is not None and any(t.startswith("NSA_") for _, t in _string_constants(target)):
                problems.append(f"{rel}:{node.lineno}: reads {ast.unparse(node)} outside nsa/flags.py")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------- reading values


def test_get_reads_the_environment_at_each_call(monkeypatch):
    assert flags.get("NSA_BACKEND") == "auto"
    monkeypatch.setenv("NSA_BACKEND", "Reference")
    assert flags.get("NSA_BACKEND") == "reference"
    monkeypatch.setenv("NSA_BACKEND", "  ")
    assert flags.get("NSA_BACKEND") == "auto"  # blank means unset
    monkeypatch.setenv("NSA_REFERENCE_CHUNK", " 64 ")
    assert flags.get("NSA_REFERENCE_CHUNK") == 64
    assert flags.get("NSA_REFERENCE_CHUNK", {"NSA_REFERENCE_CHUNK": "3"}) == 3  # an explicit mapping wins
    with pytest.raises(KeyError):
        flags.get("NSA_NOT_A_FLAG")


@pytest.mark.parametrize("raw, value", [("1", True), ("true", True), ("YES", True), (" on ", True),
                                        ("0", False), ("False", False), ("no", False), ("OFF", False)])
def test_bool_spellings(monkeypatch, raw, value):
    monkeypatch.setenv("NSA_DETERMINISTIC", raw)
    assert flags.get("NSA_DETERMINISTIC") is value


@pytest.mark.parametrize(
    "name, raw, message",
    [
        ("NSA_DETERMINISTIC", "maybe", r"NSA_DETERMINISTIC='maybe' \(from environment\) is not a boolean; use one of 1/0"),
        ("NSA_REFERENCE_CHUNK", "-1", r"NSA_REFERENCE_CHUNK=-1 \(from environment\) must be >= 0"),
        ("NSA_REFERENCE_CHUNK", "1.5", r"NSA_REFERENCE_CHUNK='1.5' \(from environment\) must be an integer"),
        ("NSA_BACKEND", "cuda", r"NSA_BACKEND='cuda' \(from environment\) is not allowed; choose one of auto, reference, triton"),
        ("NSA_CHECK_INDICES", "always", r"NSA_CHECK_INDICES='always' .* choose one of auto, on, off"),
        ("NSA_SELECTED_TILE_QUERIES", "3", r"NSA_SELECTED_TILE_QUERIES=3 \(from environment\) is not allowed; choose one of 1, 2, 4, 8"),
    ],
)
def test_bad_values_name_the_flag_and_source(monkeypatch, name, raw, message):
    monkeypatch.setenv(name, raw)
    with pytest.raises(FlagError, match=message):
        flags.get(name)
    assert issubclass(FlagError, ValueError)


def test_parse_values_from_a_profile():
    """Profiles pass YAML scalars and say where they come from."""
    assert flags.parse("NSA_BACKEND", "Triton", "profile h100.yaml") == "triton"
    assert flags.parse("NSA_DETERMINISTIC", False, "profile h100.yaml") is False
    assert flags.parse("NSA_REFERENCE_CHUNK", 128, "profile h100.yaml") == 128
    with pytest.raises(FlagError, match=r"NSA_REFERENCE_CHUNK=True \(from profile h100.yaml\) must be an integer"):
        flags.parse("NSA_REFERENCE_CHUNK", True, "profile h100.yaml")
    with pytest.raises(FlagError, match=r"NSA_BACKEND='fast' \(from profile a100.yaml\)"):
        flags.parse("NSA_BACKEND", "fast", "profile a100.yaml")
    with pytest.raises(FlagError, match=r"unknown flag NSA_BAKEND \(from profile x.yaml\); did you mean NSA_BACKEND\?"):
        flags.parse("NSA_BAKEND", "auto", "profile x.yaml")
    with pytest.raises(FlagError, match=r"unknown flag NSA_QQQQQQQQQQQQQQQQQQQQ .*; known flags: NSA_BACKEND, "):
        flags.parse("NSA_QQQQQQQQQQQQQQQQQQQQ", "1", "profile x.yaml")


def test_current_reports_value_and_source():
    now = flags.current({"NSA_BACKEND_WINDOW": "reference", "NSA_LOG_ROUTING": ""})
    assert set(now) == set(FLAGS)
    assert now["NSA_BACKEND_WINDOW"] == ("reference", "environment")
    assert now["NSA_LOG_ROUTING"] == (False, "default")
    assert now["NSA_BACKEND"] == ("auto", "default")


def test_table_lists_every_flag():
    lines = flags.table().splitlines()
    assert len(lines) == len(FLAGS)
    for line, flag in zip(lines, FLAGS.values()):
        assert line.startswith(flag.name) and flag.help in line
    assert "auto|reference|triton" in flags.table(["NSA_BACKEND"])


# ---------------------------------------------------------------- unknown names


@pytest.mark.parametrize(
    "typo, best",
    [("NSA_BACKNED", "NSA_BACKEND"), ("NSA_BACKEND_WINDOWS", "NSA_BACKEND_WINDOW"),
     ("nsa_check_indices", "NSA_CHECK_INDICES"), ("NSA_DETERMINISM", "NSA_DETERMINISTIC"),
     ("NSA_LOG_ROUTE", "NSA_LOG_ROUTING"), ("NSA_QQQQQQQQQQQQQQQQQQ", None)],
)
def test_closest_known_flag(typo, best):
    assert flags.closest(typo) == best


def test_unknown_variables_are_listed_with_a_suggestion():
    env = {"NSA_BACKNED": "triton", "NSA_BACKEND": "auto", "PATH": "/bin", "NSA_QQQQQQQQQQQQQQQQ": "1"}
    assert flags.unknown_flags(env) == [("NSA_BACKNED", "NSA_BACKEND"), ("NSA_QQQQQQQQQQQQQQQQ", None)]
    assert flags.unknown_flags({"NSA_BACKEND": "auto"}) == []


def test_warn_unknown_names_the_closest_flag():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        flags.warn_unknown({"NSA_CHECK_INDICE": "on", "NSA_BACKEND": "auto"})
    assert len(caught) == 1 and caught[0].category is UserWarning
    assert "unknown NSA flag NSA_CHECK_INDICE" in str(caught[0].message)
    assert "did you mean NSA_CHECK_INDICES?" in str(caught[0].message)


def test_cli_and_import_report_unknown_variables():
    """``python -m nsa.flags`` prints each flag's value and source; importing nsa warns about a typo."""
    env = _env_without_nsa(NSA_BACKEND_WINDOW="reference", NSA_BACKNED="triton", PYTHONWARNINGS="default")
    run = subprocess.run([sys.executable, "-m", "nsa.flags"], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    for name in FLAGS:
        assert re.search(rf"^{name} +=", out, re.M), name
    assert re.search(r"^NSA_BACKEND_WINDOW += reference +\(environment\)", out, re.M)
    assert re.search(r"^NSA_DETERMINISTIC += 1 +\(default\)", out, re.M)
    assert "warning: unknown NSA_BACKNED (did you mean NSA_BACKEND?)" in out
    assert "unknown NSA flag NSA_BACKNED in the environment is ignored; did you mean NSA_BACKEND?" in run.stderr
