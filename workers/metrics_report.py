"""Custom metrics (pb_utils.MetricFamily) on the server's metrics endpoint: at each scrape the
front writes this worker's metrics eventfd (Init.metrics_fd), and a thread of the worker
answers with a MetricsReport of the values as they are then. So a value set just before a
scrape shows in it, and an update costs the model nothing but the update.

The thread reads no frames: it answers while the frame loop is busy, even in an execute()
that is itself waiting for that scrape (a model reading /metrics).
"""

import os
import threading

from shmserve.ipc import messages
from workers import triton_python_backend_utils as pb_utils


def start(channel, metrics_fd: int) -> None:
    if metrics_fd >= 0:
        threading.Thread(target=_answer, args=(channel, metrics_fd), name="shmserve-metrics",
                         daemon=True).start()


def _answer(channel, metrics_fd: int) -> None:
    answered = 0
    sent = None  # the change count of the families last sent
    while True:
        try:
            answered += os.eventfd_read(metrics_fd)  # all asks so far, answered at once
        except OSError:
            return
        changes, families = pb_utils._metrics_snapshot(sent)
        try:
            channel.send(messages.MetricsReport(answered, families))
        except OSError:
            return  # the front is gone
        sent = changes
