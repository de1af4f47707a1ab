"""actstore: a distributed activation store with a query service for layer-wise representation
analysis of transformers."""

from importlib.metadata import PackageNotFoundError, version

try:
    # the one version: pyproject.toml's, as the installed package's metadata carries it
    __version__ = version("actstore")
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"

del PackageNotFoundError, version
