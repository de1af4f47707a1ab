"""Token authentication and roles (reader < writer < admin).

Tokens travel as gRPC metadata `authorization: Bearer <token>` and are stored as sha256 hashes.
A reader may list and query; a writer may also register, capture and cancel its own jobs; an admin
may delete, cancel anyone's job, manage tokens and (by default) register files from the server's disk.
"""

from __future__ import annotations

import hashlib
import secrets

from actstore.errors import InvalidArgument, PermissionDenied, Unauthenticated
from actstore.store.catalog import Catalog

ROLES = ("reader", "writer", "admin")

# The least role each method needs; anything not listed needs admin.
METHOD_ROLES = {
    "ListModels": "reader", "ListDatasets": "reader", "ListRuns": "reader", "DescribeRun": "reader",
    "GetJob": "reader", "ListJobs": "reader", "WatchJob": "reader",
    "Similarity": "reader", "Measure": "reader", "ReadActivations": "reader", "Entropy": "reader",
    "ResidualNorm": "reader", "Stitch": "reader", "SubmitCKAMatrix": "reader", "GetResult": "reader", "Lens": "reader",
    "NeuralCollapse": "reader", "SubmitTrain": "writer",
    "RegisterModel": "writer", "RegisterDataset": "writer", "SubmitCapture": "writer", "CancelJob": "writer",
    "DeleteRun": "admin", "CreateToken": "admin", "ListTokens": "admin", "RevokeToken": "admin",
    "BackupCatalog": "admin", "CollectGarbage": "admin",
    "SubmitVerify": "writer", "GetVerifyReport": "reader", "SubmitRepair": "admin",
    "PlanCapture": "writer", "PlanCKAMatrix": "reader",
    "ReadBatches": "reader", "LocateRun": "reader", "Sql": "reader",
    "SubmitImport": "writer",
    "SimilarityStats": "reader", "Outliers": "reader",
    "RegisterLabels": "writer", "ListLabelSets": "reader",
}

# Methods whose request may name a file or folder on the server's disk (a `path` source).
SERVER_PATH_METHODS = ("RegisterModel", "RegisterDataset", "SubmitImport", "RegisterLabels")


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(catalog: Catalog, name: str, role: str) -> str:
    if not name.strip():
        raise InvalidArgument("a token needs a principal name (--name)")
    if role not in ROLES:
        raise InvalidArgument(f"role {role!r} is not one of {', '.join(ROLES)}")
    token = "ast_" + secrets.token_urlsafe(32)
    catalog.principals.add(name, role, hash_token(token))
    return token


def authenticate(catalog: Catalog, metadata: dict[str, str]) -> tuple[str, str]:
    """(name, role) of the caller's token, or Unauthenticated."""
    header = metadata.get("authorization", "")
    if not header.startswith("Bearer "):
        raise Unauthenticated("this server requires a token: pass --token (or ACTSTORE_TOKEN), "
                              "made by an admin with `actstore token create`")
    principal = catalog.principals.by_token_hash(hash_token(header.removeprefix("Bearer ").strip()))
    if principal is None:
        raise Unauthenticated("unknown or revoked token (check --token / ACTSTORE_TOKEN; an admin makes "
                              "one with `actstore token create`)")
    return principal


def check_role(name: str, role: str, method: str) -> None:
    needed = METHOD_ROLES.get(method, "admin")
    if ROLES.index(role) < ROLES.index(needed):
        raise PermissionDenied(f"{name} is a {role}; {method} needs the {needed} role")


def check_server_path(name: str, role: str, method: str, request, path_role: str) -> None:
    """A registration from a path on the server reads the server's disk: `path_role` or above."""
    if method in SERVER_PATH_METHODS and request.WhichOneof("source") == "path" \
            and ROLES.index(role) < ROLES.index(path_role):
        raise PermissionDenied(f"{name} is a {role}; {method} from a path on the server needs the {path_role} role "
                               "(the server's ACTSTORE_REGISTER_PATHS_ROLE): register a builtin or send the texts "
                               "instead, or ask an admin to register the file")


def check_owner(name: str, role: str, owner: str | None, what: str) -> None:
    """Only the principal that made `what` (or an admin) may act on it."""
    if role != "admin" and owner != name:
        raise PermissionDenied(f"{what} belongs to {owner or 'nobody with a token'}; {name} is a {role}: only its "
                               "submitter or an admin may cancel it")
