"""A bounded soak: minutes of mixed traffic on shmserve, every answer checked, the server's
processes watched for growth.

    .venv/bin/python perf/soak.py [--minutes 5] [--warmup-s 60] [--sample-s 10]
                                  [--ports 18120 18121 18122]

Serves model_repository/ with one shmserve and runs client threads (tritonclient) until
--minutes have passed: unary HTTP and gRPC (add_sub, identity_fp32 at a few sizes, string_echo),
ensemble_pipeline, gRPC streams to the decoupled `repeat` (streams closed and opened again every
STREAM_UNITS requests), HTTP generate_stream to `square` and now and then to
`textgen_iterative`, system shared memory over both protocols (regions created, registered, used
for inputs and outputs, unregistered and destroyed every SHM_CYCLE requests), and sequences on
accumulate / accumulate_oldest (running sums checked at every step).

Every SAMPLE_S it records the RSS and open fds of the server and of each of its workers, the
server's /dev/shm segments (shmserve.<pid>.*: count, size, memory behind them) and its
nv_inference_request_success / _failure counters. Open fds and /dev/shm are compared
between two quiescent samples (all clients held between two requests): one after --warmup-s,
one when the load ends. RSS swings too much for two samples to tell (see rss_peaks), so it is
judged by its peaks: the highest in the window that starts with the warm sample against the
highest in the window that ends with the last. Flat means, per process, the later peak less
than RSS_GROWTH above the earlier, no new fd, and no new /dev/shm segment or byte. Exit
status 1 on any wrong or failed answer, a server-side failure, an error in the server log, a
worker that changed, growth beyond these, or anything left behind. Files under
perf/results/soak-<date>-<time>/: table.md, samples.jsonl, shmserve.log.

The script is this command line; the clients, the samples, the judgement of growth and the run
are the package soaking/ beside it.
"""
import sys

from soaking.runner import main

if __name__ == "__main__":
    sys.exit(main(__doc__))
