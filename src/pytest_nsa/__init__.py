"""pytest_nsa: a pytest plugin that checks NSA on a given GPU and software stack.

Entry point ``pytest_nsa.plugin`` (``pytest11``). GPU profiles live in
``gpu_profiles/*.yaml``; see this package's README.md for options, markers,
fixtures and how to write a profile.
"""

__version__ = "0.1.0"
