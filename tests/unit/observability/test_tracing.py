"""Tracing off costs no imports: the OpenTelemetry SDK and exporter load only when asked for."""

import json
import os
import subprocess
import sys

# What a daemon with this environment imports: the CLI's graph, then the tracer it sets up.
PROBE = """
import json, sys
import ate_devplugin.cli
from ate_devplugin.observability.tracing import setup_tracing
tracing = setup_tracing()
sdk = sorted(m for m in sys.modules if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter")))
print(json.dumps([type(tracing.tracer).__name__, sdk]))
tracing.shutdown()
"""


def probe(env: dict[str, str]) -> tuple[str, list[str]]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    result = subprocess.run(
        [sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True, timeout=60, check=True
    )
    tracer, sdk = json.loads(result.stdout.splitlines()[-1])
    return tracer, sdk


def test_tracing_off_imports_no_sdk() -> None:
    tracer, sdk = probe({})
    assert tracer == "NoOpTracer"
    assert sdk == []


def test_tracing_on_imports_the_sdk_and_exporter() -> None:
    tracer, sdk = probe({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    assert tracer == "Tracer"
    assert "opentelemetry.sdk.trace" in sdk
    assert "opentelemetry.exporter.otlp.proto.grpc.trace_exporter" in sdk
