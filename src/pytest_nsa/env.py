"""Apply a profile's environment (``NSA_`` flags, ``TRITON_INTERPRET``) and undo it.

Precedence follows ``nsa.flags``: a value the user set in the environment wins
over the profile, which wins over the flag's default. The profile writes only the
variables the user left unset, remembers what was there, and :meth:`AppliedEnv.restore`
puts everything back (an in-process pytester run must leave no trace).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, MutableMapping, Optional, Tuple

from nsa import flags


@dataclass
class AppliedEnv:
    """What :func:`apply` did.

    Attributes:
        applied: ``{name: value}`` written by the profile.
        kept: ``{name: (user value, profile value)}`` where the user's setting won.
        previous: ``{name: value or None}`` before :func:`apply`, for :meth:`restore`.
    """

    applied: Dict[str, str] = field(default_factory=dict)
    kept: Dict[str, Tuple[str, str]] = field(default_factory=dict)
    previous: Dict[str, Optional[str]] = field(default_factory=dict)

    def restore(self, environ: Optional[MutableMapping[str, str]] = None) -> None:
        """Undo :func:`apply`: each written variable gets its old value back (or is removed).
        A variable someone changed since is left alone. Safe to call twice."""
        env = os.environ if environ is None else environ
        for name, value in self.applied.items():
            if env.get(name) != value:
                continue
            old = self.previous.get(name)
            if old is None:
                env.pop(name, None)
            else:
                env[name] = old
        self.applied.clear()

    def describe(self) -> str:
        """``NAME=value (profile)`` entries and ``NAME=value (yours; profile: x)`` for kept ones."""
        parts = [f"{k}={v} (profile)" for k, v in sorted(self.applied.items())]
        parts += [f"{k}={mine} (yours; profile: {theirs})" for k, (mine, theirs) in sorted(self.kept.items())]
        return ", ".join(parts) or "none"


def user_set(name: str, environ: Mapping[str, str]) -> bool:
    """Whether ``name`` holds a non-blank value (blank counts as unset, as in ``nsa.flags.get``)."""
    return environ.get(name, "").strip() != ""


def apply(values: Mapping[str, str], environ: Optional[MutableMapping[str, str]] = None) -> AppliedEnv:
    """Write ``values`` into ``environ`` (default ``os.environ``) where the user set nothing."""
    env = os.environ if environ is None else environ
    done = AppliedEnv()
    for name, value in values.items():
        if user_set(name, env):
            if env[name] != value:
                done.kept[name] = (env[name], value)
            continue
        done.previous[name] = env.get(name)
        env[name] = value
        done.applied[name] = value
    return done


def check_user_flags(environ: Optional[Mapping[str, str]] = None) -> Tuple[List[str], List[str]]:
    """``(errors, warnings)`` about the user's ``NSA_`` variables: bad values of known
    flags, and unknown names with the closest known one."""
    env = os.environ if environ is None else environ
    errors: List[str] = []
    for name in flags.FLAGS:
        if user_set(name, env):
            try:
                flags.parse(name, env[name], source="environment")
            except flags.FlagError as err:
                errors.append(str(err))
    warnings = [
        f"unknown {key} in the environment is ignored" + (f"; did you mean {best}?" if best else "")
        for key, best in flags.unknown_flags(env)
    ]
    return errors, warnings
