"""The client's administration (`Client.admin`): tokens of principals, catalog backups, garbage
collection, and the integrity scrub with its repair (the Tokens, Housekeeping and Integrity
services; most of it needs the admin role).

    c.admin.create_token("ann", role="reader")                         # or c.create_token(...)
    c.admin.collect_garbage(older_than="7d", apply=True)
    c.admin.verify(all_runs=True).recapture
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from actstore._proto.actstore.v1 import actstore_pb2 as pb
from actstore._proto.actstore.v1 import tokens_pb2
from actstore.client.arguments import checking_arguments, options
from actstore.client.captures import Captures
from actstore.client.results import BackupInfo, GarbageReport, JobInfo, VerifyReport
from actstore.client.transport import Connection
from actstore.options import GC


@checking_arguments
@dataclass(eq=False)
class Admin:
    """Principals' tokens, backups, garbage and integrity; a scrub waits on `captures`, which follows
    every job."""

    connection: Connection
    captures: Captures

    def create_token(self, name: str, role: str = "reader") -> str:
        """A new token for principal `name` with `role`; the server keeps only its hash."""
        return self.connection.tokens.CreateToken(tokens_pb2.CreateTokenRequest(name=name, role=role)).token

    def tokens(self) -> list[tuple[str, str]]:
        """(name, role) of every token holder."""
        return [(p.name, p.role) for p in self.connection.tokens.ListTokens(tokens_pb2.ListTokensRequest()).principals]

    def revoke_token(self, name: str) -> None:
        """Revoke `name`'s token: its next call is refused."""
        self.connection.tokens.RevokeToken(tokens_pb2.RevokeTokenRequest(name=name))

    def backup_catalog(self) -> BackupInfo:
        """Have the server back its catalog up now (into backups/ beside the catalog)."""
        r = self.connection.housekeeping.BackupCatalog(pb.BackupCatalogRequest())
        return BackupInfo(r.path, r.bytes, list(r.kept))

    @options(GC)
    def collect_garbage(self, *, older_than: str = GC.older_than.default, max_bytes: int | None = None,
                        apply: bool = GC.apply.default) -> GarbageReport:
        """Cached results, matrix-job partials and run folders nothing needs: listed, or with
        `apply` removed. `older_than` is an age such as '12h' or '7d'."""
        request = pb.CollectGarbageRequest(older_than=older_than, max_bytes=max_bytes, apply=apply)
        return GarbageReport.from_proto(self.connection.housekeeping.CollectGarbage(request))

    def submit_verify(self, runs: Sequence[str] = (), *, all_runs: bool = False, repair: bool = False) -> JobInfo:
        """Start a scrub of `runs` (keys or prefixes) or of every run; with `repair` (admin), the
        damaged shards are dropped afterwards so the same capture submitted again rewrites them."""
        request = pb.VerifyRequest(runs=list(runs), all=all_runs)
        submit = self.connection.integrity.SubmitRepair if repair else self.connection.integrity.SubmitVerify
        return JobInfo.from_proto(submit(request))

    def verify_report(self, job_id: str) -> VerifyReport:
        request = pb.GetVerifyReportRequest(job_id=job_id)
        return VerifyReport.from_proto(self.connection.integrity.GetVerifyReport(request))

    def verify(self, runs: Sequence[str] = (), *, all_runs: bool = False, repair: bool = False,
               progress: bool = False) -> VerifyReport:
        """Read every chunk of `runs` (or of every run) and check it: crc32c, shapes and dtypes
        against the run's spec, the catalog's chunk rows against the shards present. Returns the
        report; `report.recapture` names the runs to capture again. See `submit_verify`."""
        job = self.submit_verify(runs, all_runs=all_runs, repair=repair)
        self.captures.wait(job.job_id, progress=progress, description="repair" if repair else "verify")
        return self.verify_report(job.job_id)
