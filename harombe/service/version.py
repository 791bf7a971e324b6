"""harombe's version as installed (the package metadata), for ``/v1/version`` and the schema."""

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("harombe")
except PackageNotFoundError:  # run from a source tree that was never installed
    VERSION = "0+unknown"
