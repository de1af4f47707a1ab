"""actstore: a distributed activation store with a query service for layer-wise representation
analysis of transformers."""

__version__ = "0.1.0"
