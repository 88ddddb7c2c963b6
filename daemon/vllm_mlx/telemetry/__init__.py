"""OpenTelemetry traces of HTTP requests (the `telemetry` section; docs/operations.md).

hooks.py is what the rest of the daemon calls: a few functions that return at once
when tracing is off. setup.py decides from the config and the `OTEL_*` environment
whether it is on; only then is otel.py, the one module that imports the SDK, loaded.
"""
