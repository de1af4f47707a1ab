"""The thin client: gRPC stubs, the shared error types and numpy. No Ray, no torch. `Client` holds
one sub-client a service area (`c.catalog`, `c.captures`, `c.queries`, ...: `AREAS`), and each of
their calls is the client's own too (`c.cka(...)` is `c.queries.cka(...)`).

    from actstore.client import Client
    with Client("127.0.0.1:50151") as c:          # a running `actstore serve`
        run = c.capture("minilm-l6", "rotten-tomatoes").run_key
        print(c.cka(run).biased)

    with Client.embedded("./actstore-data") as c:  # an in-process server and a local Ray
        ...
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path

from actstore.client.admin import Admin
from actstore.client.captures import Captures
from actstore.client.catalog import Catalog, LabelSetInfo
from actstore.client.diagnostics import CKAStatsResult, COSStatsResult, Diagnostics, OutlierReport
from actstore.client.frames import Listing
from actstore.client.measures import MeasureMatrixResult
from actstore.client.probes import ProbeResult, Probes
from actstore.client.progression import ProgressionResult, Training
from actstore.client.queries import Queries
from actstore.client.readers import Batch, Readers, RunLocation, SqlResult
from actstore.client.results import (
    BackupInfo,
    CaptureResult,
    CKAMatrixResult,
    CKAResult,
    COSResult,
    DatasetInfo,
    GarbageItem,
    GarbageReport,
    JobInfo,
    LayerDistribution,
    LayerValues,
    LensResult,
    MatrixResult,
    ModelInfo,
    QueryAnswer,
    RunInfo,
    RunVerdict,
    VerifyReport,
)
from actstore.client.transport import Connection, read_ca, server_starter
from actstore.records import CapturePlanInfo, CKAMatrixPlanInfo

__all__ = ["BackupInfo", "Batch", "CKAMatrixPlanInfo", "CapturePlanInfo", "Client", "CKAMatrixResult", "CKAResult",
           "CKAStatsResult", "COSResult", "COSStatsResult", "CaptureResult", "DatasetInfo",
           "GarbageItem", "GarbageReport", "JobInfo", "LabelSetInfo", "LayerDistribution", "LayerValues", "LensResult",
           "Listing", "MatrixResult", "MeasureMatrixResult", "ModelInfo", "OutlierReport", "ProbeResult",
           "ProgressionResult", "QueryAnswer",
           "RunInfo", "RunLocation", "RunVerdict", "SqlResult", "VerifyReport", "read_ca"]

# The sub-clients, one a service area, in the order Client makes them: each public method of each is
# also a method of Client of the same name (`_delegated`), so `c.cka(...)` is `c.queries.cka(...)`.
AREAS = {"catalog": Catalog, "captures": Captures, "queries": Queries, "diagnostics": Diagnostics,
         "probes": Probes, "training": Training, "readers": Readers, "admin": Admin}


def _delegated(area: str, method):
    """`Client`'s method that calls `method` of its sub-client `area`, with its signature and docs."""
    name = method.__name__

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        return getattr(getattr(self, area), name)(*args, **kwargs)

    call.__module__, call.__qualname__ = __name__, f"Client.{name}"
    call.__doc__ = f"{inspect.cleandoc(method.__doc__ or '')}\n\n(the same as `Client.{area}.{name}`)".lstrip()
    return call


def _delegating(cls):
    """`cls` with a method `_delegated` to each public method of each sub-client of `AREAS`."""
    for area, kind in AREAS.items():
        for name, method in vars(kind).items():
            if callable(method) and not name.startswith("_"):
                if hasattr(cls, name):
                    raise TypeError(f"{cls.__name__}.{name} exists already: sub-client {area} cannot add it")
                setattr(cls, name, _delegated(area, method))
    return cls


@_delegating
class Client:
    """A connection to an actstore server, its calls grouped by service area in sub-clients that
    share one `Connection` (one channel, a stub per gRPC service):

    - `catalog`: models, datasets and label sets registered; runs listed, described, deleted;
    - `captures`: captures and imports of runs, a capture's dry run, and every job: watch, wait,
      job, jobs, cancel;
    - `queries`: similarity (cka, cos, minibatch_cka, mutual_knn), one-run metrics (residual_norm,
      lens, neural_collapse, entropy), stitch, any registered measure (metric, measure), the matrix
      jobs (cka_matrix, measure_matrix) and their dry run;
    - `diagnostics`: cka_stats, cos_stats (bootstrap intervals, permutation nulls), outliers;
    - `probes`: probe, probe_runs;
    - `training`: train, training_steps, progression;
    - `readers`: read_activations, batches, torch_dataset, to_xarray, locate_run, sql;
    - `admin`: tokens, backup_catalog, collect_garbage, verify and repair.

    Every sub-client's method is also a method of the client itself, with the same signature and
    documentation: `c.cka(run)` is `c.queries.cka(run)`."""

    def __init__(self, address: str = "127.0.0.1:50151", token: str | None = None,
                 root_certificates: bytes | None = None) -> None:
        """`root_certificates`: PEM CA certificate(s) to connect over TLS and trust the server's
        certificate (default: the file ACTSTORE_TLS_CA names, else plaintext)."""
        self._connection = connection = Connection(address, token, root_certificates)
        self.address = address
        self.catalog = Catalog(connection)
        self.captures = Captures(connection)
        self.queries = Queries(connection, self.captures)
        self.diagnostics = Diagnostics(connection)
        self.probes = Probes(connection, self.catalog)
        self.training = Training(connection, self.catalog, self.captures, self.queries)
        self.readers = Readers(connection)
        self.admin = Admin(connection, self.captures)
        self._server = None

    @classmethod
    def embedded(cls, path: str | Path | None = None, **settings) -> Client:
        """Start an in-process server on a free loopback port (and a local Ray unless RAY_ADDRESS
        is set) owning the store at `path`; closing the client stops it. Needs the server extra:
        FailedPrecondition says how to install it if it is missing."""
        start_embedded = server_starter()
        if path is not None:
            settings["store"] = str(path)
        server = start_embedded(**{"port": 0, **settings})
        client = cls(f"127.0.0.1:{server.port}")
        client._server = server
        return client

    def close(self) -> None:
        self._connection.close()
        if self._server is not None:
            self._server.stop()
            self._server = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

