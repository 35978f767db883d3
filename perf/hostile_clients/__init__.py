"""The parts of perf/hostile.py, which attacks the HTTP/2 (gRPC) and HTTP/1.1 ports of shmserve
and of the real Triton and measures what each attack did to normal clients and to the server:
raw clients that can break the protocols (h2, http1) and what they send (payloads); the attacks,
by protocol (grpc_cases, h2_cases, http_cases), their context (case) and list (catalogue); the
measurements (probe, memory); the server under attack (managed); the run (runner) and its
report. perf/ is on sys.path when the script runs, so perf/servers.py is `servers`."""
