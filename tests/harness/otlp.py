"""A real OTLP/gRPC trace receiver, from the opentelemetry-proto service definitions.

It runs a gRPC server on a loopback port in a thread and keeps every span it receives,
flattened with its resource attributes, so tests can assert names, attributes and links.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def _attrs(kvs: Iterator[KeyValue] | Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    resource: dict[str, Any]
    status_code: int
    start_ns: int
    end_ns: int


@dataclass
class _Store:
    spans: list[ReceivedSpan] = field(default_factory=list)
    lock: threading.Condition = field(default_factory=threading.Condition)


class _Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, store: _Store) -> None:
        self._store = store

    def Export(self, request: Any, context: Any) -> Any:  # gRPC method name
        received = []
        for rs in request.resource_spans:
            resource = _attrs(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    received.append(
                        ReceivedSpan(
                            name=s.name,
                            kind=s.kind,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            attributes=_attrs(s.attributes),
                            resource=resource,
                            status_code=s.status.code,
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                        )
                    )
        with self._store.lock:
            self._store.spans.extend(received)
            self._store.lock.notify_all()
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    def __init__(self) -> None:
        self._store = _Store()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        # The generated registration function is unannotated.
        add = trace_service_pb2_grpc.add_TraceServiceServicer_to_server
        add(_Receiver(self._store), self._server)  # type: ignore[no-untyped-call]
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> OtlpReceiver:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(0)

    @property
    def spans(self) -> list[ReceivedSpan]:
        with self._store.lock:
            return list(self._store.spans)

    def wait_for(
        self, predicate: Callable[[ReceivedSpan], bool], count: int = 1, timeout: float = 30.0
    ) -> list[ReceivedSpan]:
        """Waits until ``count`` received spans satisfy ``predicate``; returns them."""
        deadline = time.monotonic() + timeout
        with self._store.lock:
            while True:
                found = [s for s in self._store.spans if predicate(s)]
                if len(found) >= count:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    names = sorted({s.name for s in self._store.spans})
                    raise AssertionError(f"{len(found)} of {count} wanted spans after {timeout}s; received: {names}")
                self._store.lock.wait(left)
