"""perf/soak.py's judgement of memory growth: the RSS peaks of two windows, not two samples."""

import os
import sys

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "..", "perf"))
from soaking.report import growth_table, rss_peaks  # noqa: E402  (perf/ holds scripts, not a package)


def samples_of(front_rss: list, warm_at: int, pid: int = 7) -> tuple:
    """Samples of a front whose RSS is `front_rss` (MiB), the one at `warm_at` the warm one."""
    samples = [dict(tag="load", t_s=10.0 * i, procs={"front": dict(pid=pid, rss_mib=rss, fds=9)},
                    shm=dict(segments=1, bytes=1, allocated=1))
               for i, rss in enumerate(front_rss)]
    samples[warm_at]["tag"] = "warm (held)"
    samples[-1]["tag"] = "end (held)"
    return samples, samples[warm_at], samples[-1]


def test_a_swing_without_a_trend_is_flat_though_the_held_samples_differ():
    # The run of 2026-11-28: held 103.0 after warm-up and 110.3 at the end, +7 %.
    rss = [100, 108, 106, 104, 107, 107, 103, 105, 108, 109, 90, 106, 109, 104, 110.3]
    samples, warm, end = samples_of(rss, warm_at=6)
    assert rss_peaks(samples, warm, "front") == (109, 110.3)
    errors = []
    growth_table(samples, warm, end, errors)
    assert errors == []


def test_a_leak_lifts_the_later_peak():
    # 1 MiB a sample from the warm sample on; each window is 6 samples wide.
    rss = [100, 101, 100, 101, 100, 101] + [100 + i for i in range(15)]
    samples, warm, end = samples_of(rss, warm_at=6)
    assert rss_peaks(samples, warm, "front") == (105, 114)
    errors = []
    growth_table(samples, warm, end, errors)
    assert errors == ["front: peak RSS grew +8.6% (105.0 → 114.0 MiB)"]


def test_a_process_replaced_since_the_warm_up_is_reported_not_measured():
    samples, warm, end = samples_of([100] * 10, warm_at=3)
    end["procs"]["front"] = dict(pid=8, rss_mib=100, fds=9)
    errors = []
    growth_table(samples, warm, end, errors)
    assert errors == ["process front: 7 at warm-up, 8 at the end"]
