"""Token authentication, roles and the audit trail, against a real server with auth on.

Tokens are made directly on the running server's catalog (the way `actstore token create` does
it offline), and every call goes through the real client or a raw gRPC channel.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from actstore._proto.actstore.v1 import actstore_pb2 as pb
from actstore._proto.actstore.v1 import actstore_pb2_grpc as rpc
from actstore.client import Client
from actstore.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied, Unauthenticated
from actstore.server.app import start_server
from actstore.server.auth import create_token
from tests.conftest import make_settings

REPO = Path(__file__).resolve().parents[2]
UNKNOWN_RUN = "0123456789abcdef0123"


@pytest.fixture
def auth_server(tmp_path, ray_cluster):
    running = start_server(make_settings(tmp_path / "store", auth=True))
    yield running
    running.stop()


@pytest.fixture
def tokens(auth_server):
    catalog = auth_server.service.catalog
    return {role: create_token(catalog, f"{role}-ann", role) for role in ("reader", "writer", "admin")}


@pytest.fixture(autouse=True)
def _no_ambient_token(monkeypatch):
    monkeypatch.delenv("ACTSTORE_TOKEN", raising=False)


def connect(server, token: str | None = None) -> Client:
    return Client(f"127.0.0.1:{server.port}", token=token)


def audit_rows(server) -> list[tuple]:
    return server.service.catalog.rows("SELECT principal, method, target, status FROM audit ORDER BY ts")


# ---- authentication -----------------------------------------------------------------------------
def test_no_token_is_unauthenticated_and_says_how_to_get_one(auth_server):
    with connect(auth_server) as c:
        for call in (c.models, c.runs, lambda: c.describe(UNKNOWN_RUN),
                     lambda: c.register_dataset(texts=["the cat"])):
            with pytest.raises(Unauthenticated) as info:
                call()
            message = str(info.value)
            assert "actstore token create" in message and "--token" in message, message
        # the streaming handlers authenticate too (before looking anything up)
        with pytest.raises(Unauthenticated):
            c.read_activations(UNKNOWN_RUN, 0)
        with pytest.raises(Unauthenticated):
            list(c.watch("no-such-job"))


def test_bad_token_is_unauthenticated(auth_server, tokens):
    with connect(auth_server, "ast_not-a-real-token") as c, \
            pytest.raises(Unauthenticated, match="unknown or revoked"):
        c.models()
    # a real token without the Bearer scheme is not accepted either
    with grpc.insecure_channel(f"127.0.0.1:{auth_server.port}") as channel:
        stub = rpc.CatalogStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ListModels(pb.ListModelsRequest(), metadata=[("authorization", tokens["admin"])])
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_revoked_token_stops_working(auth_server, tokens):
    with connect(auth_server, tokens["reader"]) as c:
        assert c.models() == []
        auth_server.service.catalog.principals.revoke("reader-ann")
        with pytest.raises(Unauthenticated):
            c.models()


def test_health_and_reflection_need_no_token(auth_server):
    with grpc.insecure_channel(f"127.0.0.1:{auth_server.port}") as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING


# ---- roles --------------------------------------------------------------------------------------
def test_reader_may_list_but_not_write(auth_server, tokens):
    with connect(auth_server, tokens["reader"]) as c:
        assert c.models() == [] and c.runs() == [] and c.datasets() == []
        with pytest.raises(NotFound):  # got through auth: the run simply does not exist
            c.describe(UNKNOWN_RUN)
        for method, call in (("RegisterModel", lambda: c.register_model("/nonexistent/model")),
                             ("RegisterDataset", lambda: c.register_dataset(texts=["the cat", "a dog"])),
                             ("SubmitCapture", lambda: c.submit_capture("no-model", "no-dataset"))):
            with pytest.raises(PermissionDenied) as info:
                call()
            message = str(info.value)
            assert "writer" in message and method in message and "reader" in message, message
        with pytest.raises(PermissionDenied, match="admin"):
            c.delete_run(UNKNOWN_RUN)
    assert auth_server.service.catalog.datasets.all() == []


def test_writer_may_register_but_not_delete(auth_server, tokens):
    with connect(auth_server, tokens["writer"]) as c:
        dataset = c.register_dataset(texts=["the cat sat", "a dog ran"], name="pets")
        assert dataset.n == 2 and dataset.aliases == ["pets"]
        assert [d.digest for d in c.datasets()] == [dataset.digest]
        with pytest.raises(PermissionDenied) as info:
            c.delete_run(UNKNOWN_RUN)
        assert "admin" in str(info.value) and "DeleteRun" in str(info.value)


def test_admin_gets_through_to_delete(auth_server, tokens):
    with connect(auth_server, tokens["admin"]) as c:
        with pytest.raises(NotFound, match="unknown run"):
            c.delete_run(UNKNOWN_RUN)
        assert c.register_dataset(texts=["blue mat"]).n == 1  # admin includes writer


# ---- storage of tokens and the audit trail -------------------------------------------------------
def test_tokens_are_stored_hashed(auth_server, tokens):
    rows = auth_server.service.catalog.rows("SELECT token_hash, name, role FROM principals ORDER BY name")
    assert {(name, role) for _, name, role in rows} == {("reader-ann", "reader"), ("writer-ann", "writer"),
                                                        ("admin-ann", "admin")}
    stored = {h: name for h, name, _ in rows}
    for role, token in tokens.items():
        assert stored[hashlib.sha256(token.encode()).hexdigest()] == f"{role}-ann"
        secret = token.removeprefix("ast_")
        for row in rows:
            assert all(secret not in str(cell) for cell in row), f"plaintext {role} token in principals: {row}"
    # using the tokens writes nothing secret anywhere else either
    with connect(auth_server, tokens["writer"]) as c:
        c.register_dataset(texts=["the cat"])
    for row in audit_rows(auth_server):
        assert all(t.removeprefix("ast_") not in str(row) for t in tokens.values())


def test_mutating_calls_are_audited_with_the_principal(auth_server, tokens):
    with connect(auth_server, tokens["reader"]) as c:
        c.models()
        c.runs()
    with connect(auth_server, tokens["writer"]) as c:
        c.register_dataset(texts=["the cat sat", "a dog ran"], name="audited")
    with connect(auth_server, tokens["admin"]) as c, pytest.raises(NotFound):
        c.delete_run(UNKNOWN_RUN)
    rows = audit_rows(auth_server)
    assert [(p, m, s) for p, m, _, s in rows] == [("writer-ann", "RegisterDataset", "OK"),
                                                  ("admin-ann", "DeleteRun", "NOT_FOUND")]
    assert "audited" in rows[0][2] and UNKNOWN_RUN in rows[1][2]  # the target says what was touched
    assert not [r for r in rows if r[1] in ("ListModels", "ListRuns")]  # reads are not audited


def test_denied_attempts_are_audited_with_who_tried(auth_server, tokens):
    """A refused mutating call is worth auditing mainly for *who* tried it. The interceptor only
    learns the principal's name when `authorize` returns, so PermissionDenied is audited with a
    NULL principal (actstore/server/interceptors.py, unary(): `principal` stays None)."""
    with connect(auth_server, tokens["reader"]) as c, pytest.raises(PermissionDenied):
        c.register_dataset(texts=["the cat"])
    with connect(auth_server, tokens["writer"]) as c, pytest.raises(PermissionDenied):
        c.delete_run(UNKNOWN_RUN)
    rows = audit_rows(auth_server)
    assert [(p, m, s) for p, m, _, s in rows] == [("reader-ann", "RegisterDataset", "PERMISSION_DENIED"),
                                                  ("writer-ann", "DeleteRun", "PERMISSION_DENIED")]


# ---- the offline token command -------------------------------------------------------------------
def _cli_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACTSTORE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


@pytest.mark.parametrize("placement", ["before-command", "after-command"])
def test_token_create_cli_makes_a_working_token(tmp_path, ray_cluster, placement):
    """`actstore token create --store DIR ...` (the form the help text suggests: the command works
    on a store directly) and `actstore --store DIR token create ...` both work."""
    store = tmp_path / "store"
    tail = ["--name", "cli-walt", "--role", "writer"]
    args = (["--store", str(store), "token", "create", *tail] if placement == "before-command"
            else ["token", "create", "--store", str(store), *tail])
    proc = subprocess.run([sys.executable, "-m", "actstore.cli", *args], check=False, capture_output=True,
                          text=True, env=_cli_env(), cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, f"actstore {' '.join(args)} failed:\n{proc.stderr}"
    assert "cli-walt" in proc.stdout and "writer" in proc.stdout
    token = proc.stdout.strip().splitlines()[-1].strip()
    assert token.startswith("ast_") and len(token) > 30

    server = start_server(make_settings(store, auth=True))
    try:
        rows = server.service.catalog.rows("SELECT token_hash, name, role FROM principals")
        assert rows == [(hashlib.sha256(token.encode()).hexdigest(), "cli-walt", "writer")]
        with connect(server, token) as c:
            assert c.register_dataset(texts=["the cat", "a dog"]).n == 2
            with pytest.raises(PermissionDenied, match="cli-walt is a writer"):
                c.delete_run(UNKNOWN_RUN)
    finally:
        server.stop()


# ---- registration from paths on the server --------------------------------------------------------
def test_server_paths_are_for_admins_by_default(auth_server, tokens, tmp_path):
    csv = tmp_path / "reviews.csv"
    csv.write_text("text,label\nthe cat,0\na dog,1\n")
    with connect(auth_server, tokens["writer"]) as c:
        for method, call in (("RegisterDataset", lambda: c.register_dataset(csv)),
                             ("RegisterModel", lambda: c.register_model(tmp_path))):
            with pytest.raises(PermissionDenied) as info:
                call()
            message = str(info.value)
            assert method in message and "admin" in message and "ACTSTORE_REGISTER_PATHS_ROLE" in message, message
        with pytest.raises(NotFound, match="no builtin model"):  # builtins stay writer
            c.register_model(builtin="no-such-builtin")
        assert c.register_dataset(texts=["the cat"]).n == 1
    with connect(auth_server, tokens["admin"]) as c:
        assert c.register_dataset(csv, name="reviews").n == 2


def test_a_setting_lets_writers_register_server_paths(tmp_path, ray_cluster):
    running = start_server(make_settings(tmp_path / "store", auth=True, register_paths_role="writer"))
    try:
        csv = tmp_path / "reviews.csv"
        csv.write_text("text\nthe cat\na dog\n")
        with connect(running, create_token(running.service.catalog, "walt", "writer")) as c:
            assert c.register_dataset(csv).n == 2
    finally:
        running.stop()


def test_messages_about_server_files_do_not_reveal_them(auth_server, tokens, tmp_path):
    header = tmp_path / "header.csv"
    header.write_text("secret_column_x1,other\nhunter2,1\n")
    ids = tmp_path / "ids.jsonl"
    ids.write_text('{"text": "a", "id": "hunter2-id"}\n{"text": "b", "id": "hunter2-id"}\n')
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "hunter2-arch", "hidden_size": 8}')
    secrets_ = ("secret_column_x1", "hunter2", "pid", str(os.getpid()))
    with connect(auth_server, tokens["admin"]) as c:
        unusable = [lambda: c.register_dataset(header), lambda: c.register_dataset(ids, id_column="id"),
                    lambda: c.register_model(model)]
        for call in unusable:
            with pytest.raises(InvalidArgument) as info:
                call()
            message = str(info.value)
            assert "is not a usable" in message or "is not a model folder" in message, message
            assert "incident" in message, message
            assert not [s for s in secrets_ if s in message.lower()], message
        # a missing file, a folder and an unreadable path all read alike: no probing for what exists
        missing = [tmp_path / "no-such.csv", tmp_path, tmp_path / "no-such-model"]
        answers = []
        for path, call in zip(missing, (c.register_dataset, c.register_dataset, c.register_model), strict=True):
            with pytest.raises(NotFound) as info:
                call(path)
            answers.append(str(info.value).replace(str(path), "PATH"))
        assert len(set(answers)) == 1 and "not found or not readable" in answers[0], answers


# ---- unauthenticated calls do not flood the audit trail -------------------------------------------
def test_a_flood_of_unauthenticated_calls_adds_a_handful_of_audit_rows(auth_server):
    with grpc.insecure_channel(f"127.0.0.1:{auth_server.port}") as channel:
        stub = rpc.CatalogStub(channel)
        request = pb.RegisterDatasetRequest(texts=pb.TextList(texts=["x"]))
        for i in range(500):
            metadata = [("authorization", "Bearer ast_wrong")] if i % 2 else []
            with pytest.raises(grpc.RpcError) as info:
                stub.RegisterDataset(request, metadata=metadata)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    rows = audit_rows(auth_server)
    assert 1 <= len(rows) <= 3, rows
    assert rows[0][0] is None and rows[0][3] == "UNAUTHENTICATED" and "127.0.0.1" in rows[0][2]
    auth_server.interceptor.audit.flush()  # what server stop does: the window's count is written
    counted = [r for r in audit_rows(auth_server) if "499 more unauthenticated calls" in r[2]]
    assert len(counted) == 1, audit_rows(auth_server)


# ---- tokens on a running server -----------------------------------------------------------------
def test_admin_manages_tokens_on_the_running_server(auth_server, tokens):
    with connect(auth_server, tokens["admin"]) as admin:
        token = admin.create_token("bob", "writer")
        assert ("bob", "writer") in admin.tokens()
        with connect(auth_server, token) as bob:
            assert bob.register_dataset(texts=["the cat"]).n == 1
            with pytest.raises(PermissionDenied, match="CreateToken needs the admin role"):
                bob.create_token("eve", "admin")
            admin.revoke_token("bob")
            with pytest.raises(Unauthenticated, match="unknown or revoked"):
                bob.datasets()
        assert "bob" not in [name for name, _ in admin.tokens()]
        with pytest.raises(NotFound):
            admin.revoke_token("bob")
        with pytest.raises(FailedPrecondition, match="last admin token.*create another admin token first"):
            admin.revoke_token("admin-ann")
        assert ("admin-ann", "admin") in admin.tokens()
        admin.create_token("root-2", "admin")
        admin.revoke_token("admin-ann")  # with a second admin, the first can go
    for row in audit_rows(auth_server):
        assert token.removeprefix("ast_") not in str(row)


def test_token_cli_goes_through_a_running_server(auth_server, tokens, tmp_path):
    address = f"127.0.0.1:{auth_server.port}"

    def cli(*args: str) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, "-m", "actstore.cli", "token", *args, "--address", address,
                               "--token", tokens["admin"]], check=False, capture_output=True, text=True,
                              env=_cli_env(), cwd=tmp_path, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc

    token = cli("create", "--name", "carol", "--role", "reader").stdout.strip().splitlines()[-1]
    assert "carol" in cli("list").stdout
    with connect(auth_server, token) as carol:
        assert carol.datasets() == []
        cli("revoke", "--name", "carol")
        with pytest.raises(Unauthenticated):
            carol.datasets()


# ---- cancelling is for the submitter or an admin ------------------------------------------------
def test_only_the_submitter_or_an_admin_cancels_a_job(auth_server, tokens, tiny_models):
    catalog = auth_server.service.catalog
    other = create_token(catalog, "writer-bea", "writer")
    with connect(auth_server, tokens["admin"]) as admin:
        admin.register_model(tiny_models["bert"], name="bert")
    with connect(auth_server, tokens["writer"]) as ann, connect(auth_server, other) as bea, \
            connect(auth_server, tokens["admin"]) as admin:
        ann.register_dataset(texts=["the cat sat", "a dog ran", "birds fly"], name="tiny")
        job = ann.submit_capture("bert", "tiny")
        with pytest.raises(PermissionDenied) as info:
            bea.cancel(job.job_id)
        message = str(info.value)
        assert "writer-ann" in message and "writer-bea" in message and "submitter or an admin" in message, message
        assert ann.cancel(job.job_id).job_id == job.job_id
        assert admin.cancel(job.job_id).job_id == job.job_id
    assert catalog.jobs.get(job.job_id).principal == "writer-ann"
