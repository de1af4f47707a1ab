"""Numeric helpers shared by the metric modules: dtype promotion and centering.

METRICS.md, "Numerics, for all metrics": center features before forming any product and
accumulate every product in float64, upcasting fp16/bf16 before any product.
"""

from __future__ import annotations

import numpy as np

try:  # BLAS that accumulates into, reads or updates one triangle in place (scipy ships with the server's dependencies)
    from scipy.linalg.blas import dgemm as _dgemm
    from scipy.linalg.blas import dsymm as _dsymm
    from scipy.linalg.blas import dsyr2 as _dsyr2
    from scipy.linalg.blas import dsyrk as _dsyrk
    from scipy.linalg.blas import dtrmm as _dtrmm
except ImportError:  # pragma: no cover - numpy alone still works, at about half the speed
    _dgemm = _dsymm = _dsyr2 = _dsyrk = _dtrmm = None


def as_float64_matrix(values: np.ndarray, name: str) -> np.ndarray:
    """Return `values` as a 2-D float64 array (rows = samples), upcasting before any product.

    fp16 holds at most 65504, so one large coordinate overflows a product formed in fp16; the
    upcast happens here, before anything else touches the data. bf16 must arrive upcast already
    (numpy has no bf16).
    """
    array = np.asarray(values)
    if array.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (samples x features) array, got {array.shape}")
    if array.dtype.kind not in "fiu":
        raise TypeError(f"{name} must hold real numbers, got dtype {array.dtype}")
    return array.astype(np.float64, copy=False)


def column_centered(matrix: np.ndarray) -> np.ndarray:
    """`Xc = X - 1 mean(X)^T`: the columns of a float64 matrix with their means removed."""
    return matrix - matrix.mean(axis=0)


# --------------------------------------------------------------------------------------------------
# Where the heavy products run
#
# `device=None` means numpy and the host's BLAS. Any other value is a torch device name ("cuda",
# "cuda:1", or "cpu" to run the device code path on the host and check that it agrees). Only the
# O(n d^2) and O(n^2 d) products go to a device; O(n d) passes (centring, norms, cosines) stay in
# numpy, where moving the rows would cost as much as the work. Every product is float64 on either
# side, so the two paths agree to rounding (METRICS.md numerics).


class _HostOps:
    """The array operations the device-capable products need, in numpy."""

    @staticmethod
    def upload(array: np.ndarray) -> np.ndarray:
        return array

    @staticmethod
    def float64_copy(array: np.ndarray) -> np.ndarray:
        return array.astype(np.float64)

    @staticmethod
    def empty(size: int) -> np.ndarray:
        return np.empty(size)

    @staticmethod
    def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        np.matmul(a, b, out=out)

    @staticmethod
    def download(array) -> np.ndarray:
        return np.asarray(array)


class _TorchOps:
    """The same operations on a torch device, float64 throughout."""

    def __init__(self, device: str) -> None:
        import torch

        self.torch = torch
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"device {device!r} was asked for, but torch sees no CUDA device")

    def upload(self, array: np.ndarray):
        return self.torch.as_tensor(np.ascontiguousarray(array), device=self.device)

    def float64_copy(self, array):
        return array.to(self.torch.float64, copy=True)

    def empty(self, size: int):
        return self.torch.empty(size, dtype=self.torch.float64, device=self.device)

    def matmul(self, a, b, out) -> None:
        self.torch.matmul(a, b, out=out)

    @staticmethod
    def download(array) -> np.ndarray:
        return array.cpu().numpy()


def array_ops(device: str | None) -> _HostOps | _TorchOps:
    """numpy operations for `device=None`, torch ones on that device otherwise."""
    return _HostOps() if device is None else _TorchOps(device)


def squared_cross_norms(
    matrices: dict[int, np.ndarray], pairs: list[tuple[int, int]], device: str | None = None
) -> dict[tuple[int, int], float]:
    """`||M_i^T M_j||_F^2` for each (i, j) in `pairs`, the matrices float64 with equal rows.

    Each matrix goes to the device once, however many pairs it is in."""
    ops = array_ops(device)
    uploaded = {index: ops.upload(matrix) for index, matrix in matrices.items()}
    squares = {}
    for i, j in pairs:
        product = uploaded[i].T @ uploaded[j]
        squares[i, j] = float((product * product).sum())
    return squares


def _add_syrk_upper(target: np.ndarray, rows: np.ndarray) -> None:
    """`target += rows^T rows` on the upper triangle (i <= j) of a square, C-contiguous float64
    `target`, in place; the lower triangle is never touched (stale until `_mirror_upper`, or zero
    for a sum that starts at zero). With BLAS it is one dsyrk accumulating straight into `target`
    (no D x D temporary, half the FLOPs of a GEMM)."""
    if not len(rows):
        return
    if _dsyrk is None:  # pragma: no cover - numpy alone: a full product, its upper triangle added
        target += np.triu(rows.T @ rows)
        return
    # target.T is the Fortran-ordered view of the same memory, and its lower triangle is
    # target's upper one; rows.T is Fortran-ordered too, so BLAS copies nothing.
    result = _dsyrk(1.0, rows.T, beta=1.0, c=target.T, trans=0, lower=1, overwrite_c=1)
    if not np.shares_memory(result, target):  # pragma: no cover - f2py had to copy
        target[...] = result.T


def _add_gemm(target: np.ndarray, rows_a: np.ndarray, rows_b: np.ndarray) -> None:
    """`target += rows_a^T rows_b` for a C-contiguous float64 `target`, in place: with BLAS one
    dgemm accumulating straight into it (no temporary of target's size)."""
    if not len(rows_a):
        return
    if _dgemm is None or not (rows_a.flags.c_contiguous and rows_b.flags.c_contiguous):  # pragma: no cover
        target += rows_a.T @ rows_b
        return
    # target.T (Fortran order, same memory) += rows_b^T rows_a; rows_b.T is Fortran-ordered: no copies
    result = _dgemm(1.0, rows_b.T, rows_a.T, beta=1.0, c=target.T, trans_b=1, overwrite_c=1)
    if not np.shares_memory(result, target):  # pragma: no cover - f2py had to copy
        target[...] = result.T


def _upper_triangular_products(stack: np.ndarray, right: np.ndarray) -> np.ndarray:
    """`U_g @ right` for every g of a C-contiguous (G, d, d) float64 `stack` whose lower triangles
    are zero, (G, d, k): with BLAS one dtrmm per matrix (half a GEMM's multiply-adds)."""
    if _dtrmm is None:  # pragma: no cover
        return np.matmul(stack, right)
    out = np.empty((len(stack), stack.shape[1], right.shape[1]))
    right = np.asfortranarray(right, dtype=np.float64)
    for matrix, product in zip(stack, out):  # matrix.T is the Fortran view of U_g: lower triangular, transposed back
        product[...] = _dtrmm(1.0, matrix.T, right, side=0, lower=1, trans_a=1)
    return out


def _mirror_upper(matrix: np.ndarray, block: int = 256) -> None:
    """Copy the upper triangle of a square matrix onto its lower one, in place, in row blocks
    (no index arrays or temporaries of the matrix's size)."""
    size = len(matrix)
    for start in range(0, size, block):
        stop = min(start + block, size)
        matrix[start:stop, :start] = matrix[:start, start:stop].T
        diagonal = matrix[start:stop, start:stop]
        lower = np.tril_indices(stop - start, -1)
        diagonal[lower] = diagonal.T[lower]


class SymmetricSum:
    """A running float64 `S = sum over chunks of X^T X` (size x size), on the host or a device.

    Host (`device=None`): only the upper triangle is kept current, updated in place by BLAS
    (dsyrk for `add`, dsyr2 for `add_rank2`: no size x size temporary, half a GEMM's FLOPs), and
    read by `times` (dsymm) and `block_square_sums` without mirroring; `matrix()` mirrors it onto
    the lower one for readers of the full matrix. Device: S lives there as a float64 tensor,
    updated in place by `addmm_`, and the chunk is upcast there too. `matrix()` and pickling (how
    Ray returns a task's result) bring S home as numpy, so a device never leaves the task that
    used it; `add` on a device uploads it again. Pickling keeps the upper-only form: a state
    that arrives as a read-only buffer is only read (`merge` adds its upper triangle).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        # allocated at first use: an empty sum sent to a map task pickles to a few bytes, not size^2
        self._host: np.ndarray | None = None
        self._upper_only = False
        self._on_device = None

    @property
    def nbytes(self) -> int:
        return 8 * self.size * self.size

    def _home(self) -> np.ndarray:
        """S on the host with a current upper triangle (the lower one may be stale)."""
        if self._host is None and self._on_device is None:
            self._host = np.zeros((self.size, self.size))
        if self._on_device is not None:
            self._host = self._on_device.cpu().numpy()
            self._on_device = None
        return self._host

    def add(self, rows: np.ndarray, device: str | None = None) -> None:
        """`S += rows^T rows` for a 2-D float array of `size` columns (upcast before the product)."""
        if device is None:
            _add_syrk_upper(self._home(), rows.astype(np.float64, copy=False))
            self._upper_only = True
            return
        ops = array_ops(device)
        if self._on_device is None:
            self._on_device = ops.upload(self.matrix())
        elif self._on_device.device != ops.device:
            self._on_device = self._on_device.to(ops.device)
        chunk = ops.float64_copy(ops.upload(rows))
        self._on_device.addmm_(chunk.T, chunk)

    def add_tensor(self, chunk) -> None:
        """`S += chunk^T chunk` for a float64 torch tensor on its own device (S moves there)."""
        if self._on_device is None:
            import torch

            self._on_device = torch.as_tensor(self.matrix(), device=chunk.device)
        elif self._on_device.device != chunk.device:
            self._on_device = self._on_device.to(chunk.device)
        self._on_device.addmm_(chunk.T, chunk)

    def add_rank2(self, x: np.ndarray, y: np.ndarray) -> None:
        """`S += x y^T + y x^T` in place (x, y float64 vectors of `size`)."""
        host = self._home()
        if _dsyr2 is None or not host.flags.c_contiguous:
            matrix = self.matrix()
            matrix += np.outer(x, y)
            matrix += np.outer(y, x)
            return
        # host.T is the Fortran-ordered view of the same memory; its lower triangle is host's upper one
        result = _dsyr2(1.0, x, y, lower=1, a=host.T, overwrite_a=1)
        if not np.shares_memory(result, host):  # pragma: no cover - f2py had to copy
            host[...] = result.T
        self._upper_only = True

    def times(self, matrix: np.ndarray) -> np.ndarray:
        """`S @ matrix` for a float64 (size, k) `matrix`, reading only S's upper triangle."""
        host = self._home()
        if _dsymm is None or not host.flags.c_contiguous:
            return self.matrix() @ matrix
        return _dsymm(1.0, host.T, np.asfortranarray(matrix), side=0, lower=1)

    def block_square_sums(self, widths: tuple[int, ...]) -> np.ndarray:
        """`||S_bb'||_F^2` of every pair of diagonal-aligned blocks of the given widths (B x B),
        from the upper triangle alone: an off-diagonal block lies wholly in it, and a diagonal
        block's squares are twice its strict upper triangle's plus its diagonal's."""
        host = self._home()
        edges = np.concatenate(([0], np.cumsum(widths)))
        sums = np.empty((len(widths), len(widths)))
        for a in range(len(widths)):
            diagonal = host[edges[a]:edges[a + 1], edges[a]:edges[a + 1]]
            upper, on_diagonal = np.triu(diagonal, 1), np.diag(diagonal)
            # einsum, not np.vdot: vdot is a (multithreaded) BLAS ddot, which took ~8 ms a block
            # in the server process of a CKA query (D = 2688), against ~0.5 ms for einsum
            sums[a, a] = 2 * np.einsum("ij,ij->", upper, upper) + np.einsum("i,i->", on_diagonal, on_diagonal)
            for b in range(a + 1, len(widths)):
                block = host[edges[a]:edges[a + 1], edges[b]:edges[b + 1]]
                sums[a, b] = sums[b, a] = np.einsum("ij,ij->", block, block)
        return sums

    def merge(self, other: SymmetricSum) -> None:
        """`S += S_other`, on the host (`other` is only read). Upper triangles add; the sum's lower
        one is stale until `matrix()`."""
        self._home()[...] += other._home()
        self._upper_only = True

    def matrix(self) -> np.ndarray:
        """S as a full symmetric host array (the state itself: edits to it are edits to S)."""
        host = self._home()
        if self._upper_only:
            if not host.flags.writeable:  # a state as Ray handed it over: mirror a copy
                host = self._host = host.copy()
            _mirror_upper(host)
            self._upper_only = False
        return host

    def __getstate__(self) -> dict:
        if self._on_device is not None:
            self._home()
        return self.__dict__.copy()
