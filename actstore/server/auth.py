"""Token authentication and roles (reader < writer < admin).

Tokens travel as gRPC metadata `authorization: Bearer <token>` and are stored as sha256 hashes.
A reader may list and query; a writer may also register, capture and cancel; an admin may delete.
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
    "Similarity": "reader", "ReadActivations": "reader", "Entropy": "reader", "ResidualNorm": "reader",
    "Stitch": "reader", "SubmitCKAMatrix": "reader", "GetResult": "reader", "Lens": "reader",
    "NeuralCollapse": "reader", "SubmitTrain": "writer",
    "RegisterModel": "writer", "RegisterDataset": "writer", "SubmitCapture": "writer", "CancelJob": "writer",
    "DeleteRun": "admin", "BackupCatalog": "admin", "CollectGarbage": "admin",
}


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(catalog: Catalog, name: str, role: str) -> str:
    if role not in ROLES:
        raise InvalidArgument(f"role {role!r} is not one of {', '.join(ROLES)}")
    token = "ast_" + secrets.token_urlsafe(32)
    catalog.add_principal(name, role, hash_token(token))
    return token


def authenticate(catalog: Catalog, metadata: dict[str, str]) -> tuple[str, str]:
    """(name, role) of the caller's token, or Unauthenticated."""
    header = metadata.get("authorization", "")
    if not header.startswith("Bearer "):
        raise Unauthenticated("this server requires a token: pass --token (or ACTSTORE_TOKEN), "
                              "made by an admin with `actstore token create`")
    principal = catalog.principal(hash_token(header.removeprefix("Bearer ").strip()))
    if principal is None:
        raise Unauthenticated("unknown or revoked token")
    return principal


def check_role(name: str, role: str, method: str) -> None:
    needed = METHOD_ROLES.get(method, "admin")
    if ROLES.index(role) < ROLES.index(needed):
        raise PermissionDenied(f"{name} is a {role}; {method} needs the {needed} role")
