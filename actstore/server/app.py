"""Assemble and run the gRPC server: servicers, the interceptor, health checking and reflection."""

from __future__ import annotations

import logging
from concurrent import futures
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from actstore._proto.actstore.v1 import actstore_pb2 as pb
from actstore._proto.actstore.v1 import actstore_pb2_grpc as rpc
from actstore._proto.actstore.v1 import (
    diagnostics_pb2,
    diagnostics_pb2_grpc,
    imports_pb2,
    imports_pb2_grpc,
    planning_pb2,
    planning_pb2_grpc,
    readers_pb2,
    readers_pb2_grpc,
    tokens_pb2,
    tokens_pb2_grpc,
)
from actstore.config import Settings
from actstore.errors import InvalidArgument, Unavailable
from actstore.server.diagnostics_servicer import DiagnosticsServicer
from actstore.server.import_servicer import ImportsServicer
from actstore.server.interceptors import ServiceInterceptor
from actstore.server.planning_servicer import PlanningServicer
from actstore.server.readers_servicer import ReadersServicer
from actstore.server.service import ActStoreService
from actstore.server.servicer import (
    CaptureServicer,
    CatalogServicer,
    HousekeepingServicer,
    IntegrityServicer,
    QueryServicer,
    TokensServicer,
)

log = logging.getLogger(__name__)

SERVICE_NAMES = [pb.DESCRIPTOR.services_by_name[name].full_name
                 for name in ("Catalog", "Capture", "Query", "Integrity", "Housekeeping")] + [
    tokens_pb2.DESCRIPTOR.services_by_name["Tokens"].full_name,
    planning_pb2.DESCRIPTOR.services_by_name["Planning"].full_name,
    readers_pb2.DESCRIPTOR.services_by_name["Readers"].full_name,
    imports_pb2.DESCRIPTOR.services_by_name["Imports"].full_name,
    diagnostics_pb2.DESCRIPTOR.services_by_name["Diagnostics"].full_name]


@dataclass
class RunningServer:
    server: grpc.Server
    service: ActStoreService
    port: int
    health: health.HealthServicer
    interceptor: ServiceInterceptor

    @property
    def address(self) -> str:
        return f"{self.service.settings.host}:{self.port}"

    def stop(self, grace: float = 2.0) -> None:
        for name in SERVICE_NAMES + [""]:
            self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.server.stop(grace).wait()
        self.interceptor.audit.flush()
        self.service.close()

    def wait(self) -> None:
        self.server.wait_for_termination()


def start_embedded(**settings) -> RunningServer:
    """`start_server` from plain keyword settings: the entry point `Client.embedded()` finds, so
    the client needs nothing of the server's to start one."""
    return start_server(Settings(**settings))


def _tls_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """TLS from tls_cert + tls_key (both or neither: one alone would silently serve plaintext)."""
    if settings.tls_cert is None and settings.tls_key is None:
        return None
    if settings.tls_cert is None or settings.tls_key is None:
        raise InvalidArgument("TLS needs both tls_cert and tls_key (ACTSTORE_TLS_CERT, ACTSTORE_TLS_KEY); one is set")
    try:
        pair = (settings.tls_key.read_bytes(), settings.tls_cert.read_bytes())
    except OSError as exc:
        raise InvalidArgument(f"cannot read the TLS certificate or key ({exc.strerror}: {exc.filename})") from None
    return grpc.ssl_server_credentials([pair])


def start_server(settings: Settings | None = None) -> RunningServer:
    settings = settings or Settings()
    credentials = _tls_credentials(settings)
    service = ActStoreService(settings)
    options = [
        ("grpc.max_send_message_length", settings.max_message_bytes),
        ("grpc.max_receive_message_length", settings.max_message_bytes),
        # gRPC Python turns SO_REUSEPORT on: a second server on a taken port would bind and take a
        # share of the connections (clients would see another store at random). Refuse instead.
        ("grpc.so_reuseport", 0),
    ]
    interceptor = ServiceInterceptor(service.catalog, settings)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32), options=options, interceptors=[interceptor])
    rpc.add_CatalogServicer_to_server(CatalogServicer(service), server)
    rpc.add_CaptureServicer_to_server(CaptureServicer(service), server)
    rpc.add_QueryServicer_to_server(QueryServicer(service), server)
    tokens_pb2_grpc.add_TokensServicer_to_server(TokensServicer(service), server)
    diagnostics_pb2_grpc.add_DiagnosticsServicer_to_server(DiagnosticsServicer(service), server)
    rpc.add_IntegrityServicer_to_server(IntegrityServicer(service), server)
    rpc.add_HousekeepingServicer_to_server(HousekeepingServicer(service), server)
    planning_pb2_grpc.add_PlanningServicer_to_server(PlanningServicer(service), server)
    readers_pb2_grpc.add_ReadersServicer_to_server(ReadersServicer(service), server)
    imports_pb2_grpc.add_ImportsServicer_to_server(ImportsServicer(service), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(SERVICE_NAMES + [health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    target = f"{settings.host}:{settings.port}"
    try:
        if credentials is not None:
            port = server.add_secure_port(target, credentials)
        else:
            port = server.add_insecure_port(target)
    except RuntimeError:
        port = 0
    if port == 0:
        service.close()
        raise Unavailable(f"cannot bind {target}: is another server on that port? pick one with --port")
    server.start()
    for name in SERVICE_NAMES + [""]:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("actstore serving on %s (store %s)", target, settings.store_root)
    return RunningServer(server, service, port, health_servicer, interceptor)
