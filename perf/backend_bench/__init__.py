"""The parts of perf/bench_backends.py, which measures shmserve's onnxruntime backend against
onnxruntime alone and against onnxruntime in Triton's Python backend: the models (models) and
the two repositories that serve them (repositories), the in-process limit (inprocess), what is
done to one server (measure) and the processes holding a model (processes), the anchors'
shared Triton (anchor_triton), the report, and the run (runner). perf/ is on sys.path when the
script runs, so perf/servers.py is `servers`."""
