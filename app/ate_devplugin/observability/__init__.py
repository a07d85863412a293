"""What an operator sees: Prometheus metrics, OpenTelemetry traces, structured logs and
the HTTP endpoints (/metrics, /healthz, /readyz)."""
