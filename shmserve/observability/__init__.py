"""What the server tells about itself: the server log (logs), per-model statistics (stats,
summaries), Prometheus metrics (metrics), request traces (tracing, otel).

Below the request path that records into it (dataplane, registry, dispatch), beside the
transports that show it: no transport here (the endpoint that serves the metrics is
http/metrics_endpoint.py), and nothing above the registry, which metrics reads at scrape time.
"""
