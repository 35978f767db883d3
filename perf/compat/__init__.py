"""The parts of perf/compat_probe.py, which sends one battery of requests to the real Triton and
to shmserve and compares the answers: how a request is sent and its answer taken (calls), the
cases by topic (http_cases, datatype_cases, grpc_cases, shm_cases, explicit_cases), what each
case added to the statistics (counts), the battery against one server (battery), how two
answers are compared (compare), the differences kept on purpose (known), and the run
(runner). perf/ is on sys.path when the script runs, so perf/servers.py is `servers`."""
