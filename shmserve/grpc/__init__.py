"""gRPC transport (`inference.GRPCInferenceService`)."""

import os

# Workers are spawned with fork+exec (libuv under uvloop) while gRPC's threads run. gRPC's
# fork handlers would pause those threads around each fork, and skip it with a warning when
# they are busy; the child execs at once and needs none of gRPC's state, so they are off.
# Set before grpc is first imported, which is when gRPC reads it.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
