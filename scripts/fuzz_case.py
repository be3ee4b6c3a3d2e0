"""Run one fuzz case of ``tests/_fuzz.py`` by its seed, and variants of it, printing what each gives:
for a failure the fuzzer found, which of the case's features it needs.

    python scripts/fuzz_case.py decode 12 --scale gpu --vary group=4 new_tokens=1 "lengths=(2350,)" dtype=float32

Each ``--vary`` runs the case again with a field replaced (a Python literal; several fields at once
separated by ``;``, e.g. ``"dtype=float32;grad=True"``); the device is CUDA where there is one.
Tolerances are a shipped profile's (``--profile``).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import os
import pathlib
import sys

import torch

if not torch.cuda.is_available():  # the kernels then run on Triton's CPU interpreter (set before Triton loads)
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

import _fuzz  # noqa: E402
from pytest_nsa.profiles import SHIPPED_DIR, Catalog  # noqa: E402


def _field(item: str):
    """``(field, value)`` of ``FIELD=VALUE``: a dtype by its name (``dtype=bfloat16``), anything
    else as a Python literal."""
    field, value = item.split("=", 1)
    return field, getattr(torch, value) if field == "dtype" else ast.literal_eval(value)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("prefill", "decode"))
    parser.add_argument("seed", type=int)
    parser.add_argument("--scale", choices=sorted(_fuzz.SCALES), default="gpu")
    parser.add_argument("--vary", nargs="*", default=[], metavar="FIELD=VALUE")
    parser.add_argument("--profile", default=None,
                        help="GPU profile whose tolerances hold (default: h200 on a GPU, cpu without one)")
    args = parser.parse_args(argv)
    draw, check = (_fuzz.draw, _fuzz.check) if args.kind == "prefill" else (_fuzz.draw_decode, _fuzz.check_decode)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    profile = Catalog([SHIPPED_DIR]).load(args.profile or ("h200" if device.type == "cuda" else "cpu"))
    tolerance = lambda dtype, kind: profile.tolerance(str(dtype).replace("torch.", ""), kind)  # noqa: E731
    case = draw(args.seed, _fuzz.SCALES[args.scale])
    failed = 0
    for change in [None, *args.vary]:
        variant = case
        if change is not None:
            variant = dataclasses.replace(case, **dict(_field(item) for item in change.split(";")))
        try:
            check(variant, device, tolerance)
            print(f"ok    {change or 'as drawn'}: {variant}")
        except Exception as err:  # noqa: BLE001 - a launch that fails is a finding too; the next variant runs
            failed += 1
            print(f"FAIL  {change or 'as drawn'}: {type(err).__name__}: {err}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
