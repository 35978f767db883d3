"""--front-nice: the front's event-loop thread at a scheduling priority of its own, as nginx's
worker_priority does for its workers.

Every request and every response passes through that one thread. Where its cores are shared,
with the model workers or with clients on the same host, other threads take the CPU from it,
and every request waits. An example, with perf_analyzer on the same 2 cores (identity_fp32):
at -10 the front served 8-25 % more at HTTP concurrency 8 and 15-19 % more at gRPC 32, but the
HTTP p99 rose by a fifth or more, since the client on the same cores then waits. Hence it is a
choice, not the default. The whole server at -10 gave much less: the workers must stay behind.
A real-time policy for the loop (`chrt -f -p 1`, SCHED_FIFO) gained more, 19 % at HTTP 8 and
11 % at gRPC 32, but doubled the HTTP p99 (1.5 -> 3.3 ms): threads woken on the loop's core
wait until it sleeps. So there is no option for that.

The scheduler compares nice values only within a group: an autogroup (one per session, where
/proc/sys/kernel/sched_autogroup_enabled is 1) or a cpu cgroup. Those figures were taken with
the server in perf_analyzer's session. Started in a session of its own, the server is a group
of its own, its threads' nice values no longer weigh against the client's, and -10 gained 2-3 %
(against 11-25 % in the same runs in the client's session); between groups, the group's own
weight decides.

Linux keeps a nice value per thread, and a process forked from a thread starts with that
thread's value. So the front tells the workers the value it started with (WORKER_NICE_ENV,
in their environment) and they go back to it. Going below the starting value needs
CAP_SYS_NICE (root has it). Without it the front logs why and runs at its starting value.
"""

import logging
import os

WORKER_NICE_ENV = "SHMSERVE_WORKER_NICE"

log = logging.getLogger("shmserve")


def set_front_nice(nice: int) -> None:
    """The calling thread (the event loop's) runs at `nice` from now on; the workers started
    later keep the value it had."""
    started = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except PermissionError:
        log.warning("--front-nice %d is not permitted (it needs CAP_SYS_NICE): the front "
                    "runs at nice %d", nice, started)
        return
    os.environ[WORKER_NICE_ENV] = str(started)


def restore_worker_nice() -> None:
    """In a worker: back to the value the front started with, when it moved its own."""
    value = os.environ.get(WORKER_NICE_ENV)
    if value is None:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, 0, int(value))
    except PermissionError:
        # Only when the front was given a higher value than it started with, and the worker
        # may not go below it: it then runs at the front's.
        pass
