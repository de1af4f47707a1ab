"""Deprecated name of `actstore.modeling.torch_lens` (renamed so that it is not taken for
`actstore.metrics.lens_head`, the numpy head it reads a torch model into); kept for code that
imported it, with a DeprecationWarning."""

import warnings

from actstore.modeling.torch_lens import TorchLensHead, describe_lens_head

__all__ = ["TorchLensHead", "describe_lens_head"]

warnings.warn("actstore.modeling.lens_head is now actstore.modeling.torch_lens", DeprecationWarning, stacklevel=2)
