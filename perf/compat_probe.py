"""Same requests, same answers? Sends one battery of requests to the real Triton (the anchors)
and to shmserve, both serving a copy of perf/triton_repo (and model_repository/textgen,
tests/models/params_echo, keyword_inputs and sender_misuse) at once, and prints every answer that
differs.

    .venv/bin/python perf/compat_probe.py [--anchors DIR] [--verbose]

The battery: HTTP requests good and bad (status and body), gRPC unary calls (status code and
message, or the reply), every datatype in and out over both protocols (all_types), the
endpoints asked other ways, a model using many config fields (config_features),
ModelStreamInfer streams, sequences over HTTP, the faults of Python models (model_faults,
stream_faults), failed BLS calls (bls_faults), BLS calls from a decoupled model (bls_stream),
ensembles and a faulty step (ens_faults), generate bodies with a key twice and Triton's
generate errors (generate_key_cases), system shared memory over both protocols, the
response headers a client reads, the metadata and config of every model, the repository
index, and the metric families (names, types and label keys; not values). After each request
and stream of the battery, what it added to each model's statistics counts and request
counters (metrics, failures by reason) is compared too ("counted <case>"). Then both servers start again in explicit model control, on a copy of the
repository, for a sequence of loads (unknown models, config overrides good and bad, model
files, models that fail to load, warmup samples good and bad), unloads (with dependents), indexes, and requests to models
not loaded. Answers that depend on time or load (durations) are not compared. KNOWN
(compat/known.py) lists the differences kept on purpose, each with its reason (mostly where
../shared/reference states a behaviour that Triton 2.51 does not have, or where Triton's answer
is a fault of its own); any other difference makes the exit status 1.

The script is this command line; the probe is the package compat/ beside it (the cases by
topic, how a request is sent and its answer compared, the counts, the run).
"""
import sys

from compat.runner import main

if __name__ == "__main__":
    sys.exit(main(__doc__))
