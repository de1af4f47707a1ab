"""The Readers service (proto/actstore/v1/readers.proto): thin, as the other servicers."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from actstore._proto.actstore.v1 import readers_pb2 as pb
from actstore._proto.actstore.v1 import readers_pb2_grpc as rpc
from actstore.errors import ResourceExhausted
from actstore.options import SQL, from_message
from actstore.server.interceptors import current_role
from actstore.server.runs import byte_size
from actstore.server.service import ActStoreService
from actstore.wire import to_ndarray

_INT64 = 1 << 63


def sql_value(value: Any) -> pb.SqlValue:
    """One cell: numbers, text, booleans and bytes as themselves; times as ISO text; lists and
    structs as JSON text; anything else (decimals, UUIDs, intervals) as its text."""
    if value is None:
        return pb.SqlValue(is_null=True)
    if isinstance(value, bool):
        return pb.SqlValue(flag=value)
    if isinstance(value, int):
        return pb.SqlValue(int=value) if -_INT64 <= value < _INT64 else pb.SqlValue(uint=value)
    if isinstance(value, float):
        return pb.SqlValue(float=value)
    if isinstance(value, bytes):
        return pb.SqlValue(blob=value)
    if isinstance(value, (dt.date, dt.time, dt.datetime)):
        return pb.SqlValue(text=value.isoformat())
    if isinstance(value, (list, tuple, dict)):
        return pb.SqlValue(text=json.dumps(value, default=str))
    return pb.SqlValue(text=str(value))


class ReadersServicer(rpc.ReadersServicer):
    def __init__(self, service: ActStoreService) -> None:
        self.service = service

    def ReadBatches(self, request, context):
        for piece in self.service.readers.batches(request):
            if not context.is_active():
                return
            yield pb.BatchPart(batch=piece.batch, batch_rows=piece.batch_rows, offset=piece.offset,
                               values=to_ndarray(piece.values), rows=piece.rows.tolist(), sample_ids=piece.sample_ids,
                               labels=[] if piece.labels is None else piece.labels.tolist(),
                               buffer_shards=piece.buffer_shards if piece.batch == 0 and piece.offset == 0 else 0,
                               decodings=[pb.ShardDecoding(shard=s, start=lo, stop=hi, state=to_ndarray(state))
                                          for s, lo, hi, state in piece.decodings])

    def LocateRun(self, request, context):
        found = self.service.readers.locate(request.run)
        r = found.record
        return pb.RunLocation(run_key=r.run_key, store=found.store, group=found.group, array=found.array, dtype=r.dtype,
                              pooling=r.pooling, n=r.n, rows=r.rows, num_layers=r.num_layers, width=r.width)

    def Sql(self, request, context):
        limit = from_message(SQL, "limit", request, self.service.settings)  # capped by sql_max_rows
        answer = self.service.readers.sql(request.query, limit, current_role.get())
        result = pb.SqlResult(columns=answer.columns, types=answer.types, truncated=answer.truncated)
        budget = self.service.settings.max_message_bytes // 2  # the rest of the message is small
        left = budget
        for kept, row in enumerate(answer.rows):
            # text and blobs are measured before they are copied into a message: one cell may be a GB
            text = sum(len(v) for v in row if isinstance(v, (str, bytes)))
            message = pb.SqlRow(values=[sql_value(v) for v in row]) if text <= left else None
            left -= message.ByteSize() if message else text
            if left < 0:
                fit = f"only the first {kept} rows fit: add LIMIT {kept}, or" if kept else "not even one row fits:"
                raise ResourceExhausted(f"the rows exceed the reply's size budget of {byte_size(budget)} (half of "
                                        f"ACTSTORE_MAX_MESSAGE_BYTES); {fit} select fewer or narrower columns "
                                        "(left(text, 100), length(text))")
            result.rows.append(message)
        return result
