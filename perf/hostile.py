"""Hostile clients: attacks on the HTTP/2 (gRPC) and HTTP/1.1 fronts of shmserve and of the real
Triton 2.51, one server at a time, and what each did to normal clients and to the server.

    .venv/bin/python perf/hostile.py                       # both servers, every case
    .venv/bin/python perf/hostile.py --quick               # without the cases that wait 40 s
    .venv/bin/python perf/hostile.py --servers shmserve --cases zero_infer,gzip_bomb
    .venv/bin/python perf/hostile.py --list                # the cases, with what each sends

Every attack is our own code, bounded in time and size, against 127.0.0.1 only. Per case and
server it records:
- the answer: what the server did to the attacker (GOAWAY, RST_STREAM, a grpc-status, an HTTP
  status, the connection closed, nothing);
- the probe: a separate process that, from before the attack until its connections are closed,
  sends a normal request every 20 ms (gRPC ModelInfer of identity_fp32 and HTTP GET
  /v2/health/ready in turn, each on a connection opened before the attack); the highest and
  the 99th percentile latency, a request that failed or had no answer in 5 s counting 5000 ms;
- the server's main process's memory (tritonserver; shmserve's front): peak growth (VmHWM
  after a reset through /proc/<pid>/clear_refs, and VmRSS sampled every 50 ms) and retained
  growth (VmRSS 3 s after the attack's connections closed), both against VmRSS before;
- whether the server died (or stopped answering); it is then started again for the next case.

Results go to perf/results/<date>-hostile.json (and .md), the table to stdout.

The script is this command line; the attacks, the probe, the memory watch and the report are
the package hostile_clients/ beside it.
"""
import sys

from hostile_clients.runner import main

if __name__ == "__main__":
    sys.exit(main(__doc__))
