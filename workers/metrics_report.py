"""Custom metrics (pb_utils.MetricFamily) on the server's metrics endpoint: a thread of the
worker sends the model's metric values to the front as a MetricsReport, at most every
REPORT_INTERVAL_S and only after they changed. The front shows each instance's latest report.

Reports rather than questions: the frame loop may be busy in a long execute() when a scrape
comes, and a scrape must not wait on it.
"""

import threading
import time

from shmserve.ipc import messages
from workers import triton_python_backend_utils as pb_utils

REPORT_INTERVAL_S = 0.5


def start(channel) -> None:
    threading.Thread(target=_report, args=(channel,), name="shmserve-metrics",
                     daemon=True).start()


def _report(channel) -> None:
    pb_utils._families_exist.wait()  # most models have no metrics of their own
    reported = 0
    while True:
        time.sleep(REPORT_INTERVAL_S)
        changes, families = pb_utils._metrics_snapshot()
        if changes == reported:
            continue
        reported = changes
        try:
            channel.send(messages.MetricsReport(families))
        except OSError:
            return  # the front is gone
