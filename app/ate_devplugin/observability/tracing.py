"""OpenTelemetry tracing, configured only from the standard OTEL_* variables.

Tracing is off (the API's no-op tracer, near-zero cost) unless an OTLP endpoint is set
or OTEL_SDK_DISABLED=false asks for the SDK. The SDK and exporter are imported only then.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from ate_devplugin import __version__

log = logging.getLogger(__name__)

# Downward-API variables the chart sets, mapped to resource attributes.
K8S_ENV = {
    "K8S_NODE_NAME": "k8s.node.name",
    "K8S_POD_NAME": "k8s.pod.name",
    "K8S_POD_UID": "k8s.pod.uid",
    "K8S_NAMESPACE_NAME": "k8s.namespace.name",
}
ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


class Tracing:
    """The tracer the daemon uses and the provider to flush on shutdown."""

    def __init__(self, provider: trace.TracerProvider) -> None:
        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("ate_devplugin", __version__)

    def shutdown(self) -> None:
        shutdown = getattr(self.provider, "shutdown", None)
        if shutdown is not None:
            shutdown()


def wanted(env: Mapping[str, str]) -> bool:
    disabled = env.get("OTEL_SDK_DISABLED", "").strip().lower()
    if disabled == "true":
        return False
    return disabled == "false" or any(env.get(v) for v in ENDPOINT_VARS)


def setup_tracing(env: Mapping[str, str] = os.environ) -> Tracing:
    if not wanted(env):
        return Tracing(trace.NoOpTracerProvider())
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes: dict[str, str] = {SERVICE_NAME: "ate-devplugin", SERVICE_VERSION: __version__}
    attributes.update({attr: env[var] for var, attr in K8S_ENV.items() if env.get(var)})
    # Resource.create merges OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME over these.
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    log.info("tracing enabled", extra={"endpoint": next((env[v] for v in ENDPOINT_VARS if env.get(v)), "")})
    return Tracing(provider)


def trace_id_exemplar(span: Span) -> dict[str, str] | None:
    """The exemplar labels linking a metric observation to a sampled span."""
    ctx = span.get_span_context()
    if not ctx.is_valid or not ctx.trace_flags.sampled:
        return None
    return {"trace_id": format(ctx.trace_id, "032x")}


@contextmanager
def rpc_span(
    tracer: Tracer, service: str, method: str, kind: SpanKind, parent: Context | None = None
) -> Iterator[Span]:
    """A span for one gRPC call, named and attributed per the RPC semantic conventions.

    The caller sets ``rpc.grpc.status_code``; an exception escaping marks the span as an error.
    ``parent`` is the context of what caused the call, when that was not the current span.
    """
    attributes = {
        "rpc.system": "grpc",
        "rpc.service": service,
        "rpc.method": method,
        "network.transport": "unix",
    }
    with tracer.start_as_current_span(
        f"{service}/{method}", context=parent, kind=kind, attributes=attributes, record_exception=True
    ) as span:
        yield span


def set_rpc_status(span: Span, code: int, name: str, message: str = "") -> None:
    span.set_attribute("rpc.grpc.status_code", code)
    if name != "OK":
        span.set_status(Status(StatusCode.ERROR, f"{name}: {message}" if message else name))
