"""The registry of ``NSA_*`` environment flags, and the only module that reads them.

Every flag is declared once in :data:`FLAGS` with its type, default, allowed
values and help. Values are read from the environment at each call (never frozen
at import), so a flag set by the pytest plugin or by a user at run time applies.
Precedence is: an explicit user setting in the environment, then a GPU profile
(the plugin writes profile values into the environment only for flags the user
did not set), then the default here.

A bad value raises :class:`FlagError` naming the flag, the value, where it came
from and what is allowed. An ``NSA_`` variable that is not declared here is
reported by :func:`unknown_flags` / :func:`warn_unknown` with the closest known
name, so a typo never passes silently.

``python -m nsa.flags`` prints the table of flags with their current values.
"""

from __future__ import annotations

import difflib
import os
import warnings
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

PREFIX = "NSA_"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})

BACKEND_CHOICES: Tuple[str, ...] = ("auto", "reference", "triton")

#: Ops whose backend the router picks; each has an ``NSA_BACKEND_<OP>`` flag.
OPS: Tuple[str, ...] = ("compress", "compressed", "select", "selected", "window", "gates", "decode", "rotary")


class FlagError(ValueError):
    """An ``NSA_*`` flag has a value that is not allowed."""


@dataclass(frozen=True)
class Flag:
    """One declared flag: ``name`` (with the ``NSA_`` prefix), ``type`` (bool, int or str),
    ``default``, ``help`` and, for strings and integers, the allowed ``choices`` (spelled as
    in the environment)."""

    name: str
    type: type
    default: Any
    help: str
    choices: Optional[Tuple[str, ...]] = None
    minimum: Optional[int] = None

    def parse(self, raw: Any, source: str = "environment") -> Any:
        """Convert ``raw`` (a string from the environment, or a YAML scalar) to this
        flag's type; raise :class:`FlagError` naming the flag and ``source`` if it is bad."""
        text = str(raw).strip()
        if self.type is bool:
            if isinstance(raw, bool):
                return raw
            low = text.lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise FlagError(
                f"{self.name}={raw!r} (from {source}) is not a boolean; use one of 1/0, true/false, yes/no, on/off"
            )
        if self.type is int:
            if isinstance(raw, bool):
                raise FlagError(f"{self.name}={raw!r} (from {source}) must be an integer")
            try:
                value = int(text, 10)
            except ValueError:
                raise FlagError(f"{self.name}={raw!r} (from {source}) must be an integer") from None
            if self.minimum is not None and value < self.minimum:
                raise FlagError(f"{self.name}={value} (from {source}) must be >= {self.minimum}")
            if self.choices is not None and str(value) not in self.choices:
                raise FlagError(
                    f"{self.name}={value} (from {source}) is not allowed; choose one of {', '.join(self.choices)}"
                )
            return value
        low = text.lower()
        if self.choices is not None and low not in self.choices:
            raise FlagError(
                f"{self.name}={raw!r} (from {source}) is not allowed; choose one of {', '.join(self.choices)}"
            )
        return low

    def format(self, value: Any) -> str:
        """The environment spelling of ``value`` (``"1"``/``"0"`` for booleans)."""
        if self.type is bool:
            return "1" if value else "0"
        return str(value)


def _declare(*flags: Flag) -> Dict[str, Flag]:
    table: Dict[str, Flag] = {}
    for flag in flags:
        if not flag.name.startswith(PREFIX) or flag.name in table:
            raise RuntimeError(f"bad or duplicate flag declaration {flag.name}")
        table[flag.name] = flag
    return table


FLAGS: Mapping[str, Flag] = _declare(
    Flag(
        "NSA_BACKEND",
        str,
        "auto",
        "Backend of every op unless its NSA_BACKEND_<OP> flag says otherwise. 'auto' lets the "
        "router choose (Triton on CUDA where a kernel exists, the reference elsewhere).",
        BACKEND_CHOICES,
    ),
    *(
        Flag(
            f"NSA_BACKEND_{op.upper()}",
            str,
            "auto",
            f"Backend of the '{op}' op; overrides NSA_BACKEND. 'auto' defers to NSA_BACKEND.",
            BACKEND_CHOICES,
        )
        for op in OPS
    ),
    Flag(
        "NSA_CHECK_INDICES",
        str,
        "auto",
        "Validate the values of a user-given block_idx or decode seq_lens (a device sync on GPU). "
        "'auto' checks CPU tensors only, 'on' always, 'off' never.",
        ("auto", "on", "off"),
    ),
    Flag(
        "NSA_DETERMINISTIC",
        bool,
        True,
        "Deterministic backward kernels (no float atomics in dK/dV). Off allows faster atomic paths.",
    ),
    Flag(
        "NSA_REFERENCE_CHUNK",
        int,
        0,
        "Query positions the reference processes at once (bounds its memory at long T); 0 picks "
        "a size from the problem.",
        minimum=0,
    ),
    Flag(
        "NSA_SELECTED_TILE_QUERIES",
        int,
        1,
        "Query positions a Triton selected-attention forward/dQ program takes; each block any of "
        "them holds is loaded once. 4 pays where neighbouring queries hold the same blocks (H100: "
        "1.6-1.8x faster when every 4 share their lists) and costs 12-40% with unrelated lists, as "
        "random inputs give.",
        ("1", "2", "4", "8"),
    ),
    Flag(
        "NSA_SELECTED_DQ_FROM_DS_MIB",
        int,
        -1,
        "Largest buffer (MiB) the Triton selected backward may fill with the dK/dV kernel's dS "
        "(2 KiB a query, KV head and selected block at G = 16, sel_block 64, bf16: 8 GiB at 64k "
        "tokens, B = 1, 4 KV heads), so that its dQ reads K and dS instead of K and V and "
        "recomputing the softmax (H200, forward+backward: 8k 7.9 -> 7.4 ms, 64k 105 -> 101). "
        "-1: an eighth of the GPU's memory (4096 on CPU); 0 turns it off.",
        minimum=-1,
    ),
    Flag(
        "NSA_COMPRESSED_DQ_FROM_DS_MIB",
        int,
        -1,
        "Largest buffer (MiB) the Triton compressed backward may fill with its dK/dV kernel's dS "
        "(query rows x visible compressed tokens, about T^2 * HQ / cmp_stride bytes at bf16: 256 MiB "
        "at 8k tokens and 64 query heads), so that its dQ reads dS and the compressed keys instead "
        "of recomputing the scores and dP (H100, compressed backward: 8k 0.80 -> 0.71 ms, 16k 2.46 -> "
        "2.25, 64k 30.1 -> 29.1). Used where the caller passes rowsum(o * do), as training does. "
        "-1: an eighth of the GPU's memory (4096 on CPU); 0 turns it off.",
        minimum=-1,
    ),
    Flag(
        "NSA_FORCED_IN_WINDOW",
        bool,
        True,
        "Triton training and inference prefill: the sliding-window kernels also compute the "
        "selected branch's forced blocks (initial and local), whose local keys they read anyway: "
        "the forward and dQ instead of separate forced-block kernels, and dK/dV over the local "
        "blocks instead of the selected dK/dV kernel. Off restores those kernels (for comparisons).",
    ),
    Flag(
        "NSA_GLUON_COMPRESSED_DKDV",
        bool,
        True,
        "Training backward on Hopper (16-bit, 128-wide heads, dS kept for the dQ): the compressed "
        "branch's dK/dV as a warp-specialised Gluon kernel (a copy warp, two computing warpgroups), "
        "1.21x the Triton kernel's speed at 64k on an H200; off runs the Triton kernel. Same results "
        "to bf16 rounding.",
    ),
    Flag(
        "NSA_GLUON_SELECTED_DKDV",
        bool,
        True,
        "Training backward on Hopper (16-bit, 128-wide heads, blocks of 64, dS kept for the dQ, local "
        "blocks left to the window): the selected branch's dK/dV as a warp-specialised Gluon kernel (a "
        "copy warp, a computing warpgroup), 1.25x the Triton kernel's speed at 64k on an H200; off runs "
        "the Triton kernel. Same results to bf16 rounding.",
    ),
    Flag(
        "NSA_GLUON_WINDOW_DKDV",
        bool,
        True,
        "Training backward on Hopper (16-bit, 128-wide heads, the Triton kernel's 128-key tiles): the "
        "window branch's dK/dV as a warp-specialised Gluon kernel (a copy warp, two computing "
        "warpgroups), 1.5x the Triton kernel's speed at 64k on an H200; off runs the Triton kernel. "
        "Same results to bf16 rounding.",
    ),
    Flag(
        "NSA_GLUON_WINDOW_DQ",
        bool,
        True,
        "Training backward on Hopper (16-bit, 128-wide heads): the window branch's dQ as a persistent "
        "warp-specialised Gluon kernel (one program an SM; a copy warp, two computing warpgroups of 64 "
        "rows sharing each 64-key tile), about 1.2x the Triton kernel's speed at 64k on an H200; off "
        "runs the Triton kernel.",
    ),
    Flag(
        "NSA_GLUON_WINDOW_FWD",
        bool,
        True,
        "Forward on Hopper (16-bit, 128-wide heads; with the selected branch's forced blocks, blocks "
        "of 64 keys): the window branch's forward, where it does not sum the gated branches, as a "
        "persistent warp-specialised Gluon kernel (one program an SM; a copy warp, two computing "
        "warpgroups of 64 rows sharing each 64-key tile), 1.06-1.08x the Triton kernel's speed at 64k "
        "on an H200; off runs the Triton kernel.",
    ),
    Flag(
        "NSA_GLUON_COMPRESSED_PASS1",
        bool,
        True,
        "Forward on Hopper where the compressed branch's scoring pass runs apart (past 16k tokens; "
        "16-bit, 128-wide heads): its pass 1 (o and lse) as a warp-specialised Gluon kernel (a copy "
        "warp, two computing warpgroups), 1.09x the Triton launch's speed at 64k on an H200; off runs "
        "the Triton launch. Same results to bf16 rounding.",
    ),
    Flag(
        "NSA_GLUON_COMPRESSED_SCORES",
        bool,
        True,
        "Forward on Hopper where the compressed branch's scoring pass runs apart (past 16k tokens; "
        "16-bit, 128-wide heads, selection blocks of a power of two compressed tokens up to 64): that "
        "pass (the block masses the top-n ranks) as a persistent warp-specialised Gluon kernel (a copy "
        "warp, two computing warpgroups), 1.14x the Triton launch's speed at 64k on an H200; off runs "
        "the Triton launch. The masses differ by rounding only.",
    ),
    Flag(
        "NSA_FLOAT32_DOT",
        str,
        "auto",
        "Precision of the Triton kernels' matrix products for float32 inputs: 'ieee' exact float32 "
        "(multiply-adds: minutes to compile, no tensor cores), 'tf32x3' three TF32 products (about "
        "21 mantissa bits, tensor cores), 'tf32' one (10 bits). 'auto' follows "
        "torch.get_float32_matmul_precision(): highest -> ieee (torch's default), high -> tf32x3, "
        "medium -> tf32.",
        ("auto", "ieee", "tf32x3", "tf32"),
    ),
    Flag(
        "NSA_LOG_ROUTING",
        bool,
        False,
        "Log each routing decision (op, backend, reason) once, through the 'nsa.routing' logger.",
    ),
)


def get(name: str, environ: Optional[Mapping[str, str]] = None) -> Any:
    """Current value of flag ``name``: the environment's if set, else the default.

    Raises:
        KeyError: ``name`` is not a declared flag (a programming error).
        FlagError: the environment holds a value the flag does not allow.
    """
    flag = FLAGS[name]
    env = os.environ if environ is None else environ
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return flag.default
    return flag.parse(raw, "environment")


def parse(name: str, raw: Any, source: str) -> Any:
    """Validate ``raw`` for flag ``name`` coming from ``source`` (e.g. a profile file).

    Raises :class:`FlagError` for an undeclared name (with the closest match) or a bad value.
    """
    flag = FLAGS.get(name)
    if flag is None:
        raise FlagError(f"unknown flag {name} (from {source}){_suggest(name)}")
    return flag.parse(raw, source)


def closest(name: str) -> Optional[str]:
    """The declared flag name closest to ``name``, if any is reasonably close."""
    match = difflib.get_close_matches(name.upper(), list(FLAGS), n=1, cutoff=0.6)
    return match[0] if match else None


def _suggest(name: str) -> str:
    best = closest(name)
    return f"; did you mean {best}?" if best else f"; known flags: {', '.join(FLAGS)}"


def unknown_flags(environ: Optional[Mapping[str, str]] = None) -> List[Tuple[str, Optional[str]]]:
    """``(name, closest known name or None)`` for each undeclared ``NSA_`` variable set."""
    env = os.environ if environ is None else environ
    return [(key, closest(key)) for key in sorted(env) if key.startswith(PREFIX) and key not in FLAGS]


def warn_unknown(environ: Optional[Mapping[str, str]] = None) -> None:
    """Emit a :class:`UserWarning` per undeclared ``NSA_`` variable, naming the closest flag."""
    for key, best in unknown_flags(environ):
        hint = f"; did you mean {best}?" if best else ""
        warnings.warn(f"unknown NSA flag {key} in the environment is ignored{hint}", UserWarning, stacklevel=2)


def current(environ: Optional[Mapping[str, str]] = None) -> Dict[str, Tuple[Any, str]]:
    """``{name: (value, "environment" | "default")}`` for every declared flag."""
    env = os.environ if environ is None else environ
    out: Dict[str, Tuple[Any, str]] = {}
    for name in FLAGS:
        set_here = env.get(name, "").strip() != ""
        out[name] = (get(name, env), "environment" if set_here else "default")
    return out


def table(names: Optional[Iterable[str]] = None) -> str:
    """A plain-text table of flags: name, type, default, choices and help."""
    rows = []
    for name in names or FLAGS:
        flag = FLAGS[name]
        allowed = "|".join(flag.choices) if flag.choices else flag.type.__name__
        rows.append(f"{flag.name:<24} {flag.format(flag.default):<6} {allowed:<22} {flag.help}")
    return "\n".join(rows)


def _main() -> None:
    for name, (value, source) in current().items():
        print(f"{name:<24} = {FLAGS[name].format(value):<10} ({source})")
    for key, best in unknown_flags():
        print(f"warning: unknown {key}" + (f" (did you mean {best}?)" if best else ""))


if __name__ == "__main__":
    _main()
