"""Build hook: the wheel carries the top-level ``gpu_profiles/`` as ``pytest_nsa/gpu_profiles/``.

Everything else is declared in pyproject.toml. The folder stays at the repository
root, its only copy in git and the one a checkout or an editable install reads
(``pytest_nsa.profiles.SHIPPED_DIR``); pyproject.toml cannot map a folder outside
``src/`` into a package, so build_py copies it into the build tree here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Tuple

from setuptools import setup
from setuptools.command.build_py import build_py

PROFILES = "gpu_profiles"
#: What a profile lookup needs: the YAML profiles and the per-profile baselines.
PATTERNS = ("*.yaml", "baselines/*/benchmarks.json")


class BuildPyWithProfiles(build_py):
    """build_py that also copies ``gpu_profiles/`` into ``<build_lib>/pytest_nsa/``."""

    def profile_files(self) -> List[Tuple[str, str]]:
        """(source, target) pairs; paths relative to the project root, where builds run."""
        sources = sorted({p for pattern in PATTERNS for p in Path(PROFILES).glob(pattern) if p.is_file()})
        target_dir = os.path.join(self.build_lib, "pytest_nsa")
        return [(str(p), os.path.join(target_dir, str(p))) for p in sources]

    def run(self) -> None:
        super().run()
        # An editable install reads the checkout's folder itself: nothing to copy.
        if self.editable_mode:
            return
        for source, target in self.profile_files():
            self.mkpath(os.path.dirname(target))
            self.copy_file(source, target)

    def get_outputs(self, include_bytecode: bool = True) -> List[str]:
        outputs = super().get_outputs(include_bytecode)
        if self.editable_mode:
            return outputs
        return outputs + [target for _, target in self.profile_files()]


setup(cmdclass={"build_py": BuildPyWithProfiles})
