"""What importing costs: ``import nsa`` and the pytest plugin's entry point load neither torch nor the
ops (torch alone takes seconds, the ops' ``torch.compile`` machinery seconds more); the ops and the
modules load when first used, under their usual names. Each check runs in a fresh interpreter: this
one imported torch long ago."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> str:
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def test_import_nsa_loads_the_ops_on_first_use():
    out = _run("""
        import sys
        import nsa
        assert "torch" not in sys.modules and "nsa.ops" not in sys.modules, sorted(sys.modules)
        assert nsa.NSAConfig().sel_count == 16 and nsa.flags.get("NSA_BACKEND") == "auto"
        assert {"DecodeGraph", "NSAAttention", "NSACache", "nsa_attention", "ops"} <= set(dir(nsa))
        attention = nsa.nsa_attention
        assert "torch" in sys.modules and attention is nsa.ops.nsa_attention is vars(nsa)["nsa_attention"]
        assert nsa.NSAAttention is nsa.modules.NSAAttention and nsa.testing.assert_close
        for missing in ("no_such_name", "__test__"):
            try:
                getattr(nsa, missing)
            except AttributeError as err:
                assert missing in str(err)
            else:
                raise AssertionError(f"nsa.{missing} resolved")
        namespace = {}
        exec("from nsa import *", namespace)
        assert set(nsa.__all__) <= set(namespace)
        print("ok")
    """)
    assert out.strip() == "ok"


def test_the_plugins_entry_point_loads_without_torch():
    """pytest loads ``pytest_nsa.plugin`` (and the plugins it names) into every run of an environment
    where nsa is installed, asked for or not (tests/plugin: a run that is not asked is left alone)."""
    out = _run("""
        import importlib, sys
        import pytest_nsa.plugin
        for name in pytest_nsa.plugin.pytest_plugins:
            importlib.import_module(name)
        print(sorted(m for m in ("torch", "triton", "nsa.ops", "nsa.routing") if m in sys.modules))
    """)
    assert out.strip() == "[]"
