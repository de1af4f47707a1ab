"""The thin servicer of the Imports service: proto in, `ImportJobs.submit` (`service.imports`), a Job out."""

from __future__ import annotations

from actstore._proto.actstore.v1 import imports_pb2_grpc
from actstore.server.interceptors import current_principal
from actstore.server.service import ActStoreService, ImportRequest
from actstore.server.servicer import job_proto


class ImportsServicer(imports_pb2_grpc.ImportsServicer):
    def __init__(self, service: ActStoreService) -> None:
        self.service = service

    def SubmitImport(self, request, context):
        return job_proto(self.service.imports.submit(
            ImportRequest(path=request.path, model=request.model, dataset=request.dataset, format=request.format,
                          pooling=request.pooling, dtype=request.dtype),
            principal=current_principal.get()))
