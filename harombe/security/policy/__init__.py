"""Pure policy: what is risky, what is allowed, what a path or package spec means.

Nothing here does I/O, reads a clock or talks to Docker (``tests/unit/test_architecture.py``
enforces it on imports), so every rule is table-tested in microseconds. The approval gate and
the runtime consult it; it consults nothing but :mod:`harombe.config` and :mod:`harombe.errors`.
"""
