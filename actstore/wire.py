"""numpy <-> NDArray proto, shared by the server and the thin client (imports only numpy and stubs)."""

from __future__ import annotations

import numpy as np

from actstore._proto.actstore.v1 import actstore_pb2 as pb


def to_ndarray(values: np.ndarray) -> pb.NDArray:
    values = np.ascontiguousarray(values)
    little = values.astype(values.dtype.newbyteorder("<"), copy=False)
    return pb.NDArray(shape=list(values.shape), dtype=values.dtype.name, data=little.tobytes())


def from_ndarray(message: pb.NDArray) -> np.ndarray:
    dtype = np.dtype(message.dtype).newbyteorder("<")
    return np.frombuffer(message.data, dtype=dtype).reshape(tuple(message.shape)).astype(dtype.newbyteorder("="))
