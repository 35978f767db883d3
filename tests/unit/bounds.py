"""What a call costs, counted so that the count is the same on any machine: the Python lines it
runs (its work, C code not counted) and the most Python memory it held. The hostile-input tests
bound both by the input's size; perf/hostile.py measures the same cases in seconds and MiB."""

import contextlib
import sys
import tracemalloc


class TooMuchWork(BaseException):
    """Not an Exception: the code under test must not catch it as one of its errors."""


def run_bounded(fn, *args, max_lines: int):
    """fn(*args), failing with TooMuchWork as soon as it has run more than `max_lines` lines
    (so that a call that would take minutes fails at once)."""
    count = 0

    def line(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
            if count > max_lines:
                raise TooMuchWork(f"{getattr(fn, '__name__', fn)} ran more than {max_lines} "
                                  f"lines")
        return line

    def call(frame, event, arg):
        return line

    previous = sys.gettrace()
    sys.settrace(call)
    try:
        return fn(*args)
    finally:
        sys.settrace(previous)


def peak_allocation(fn, *args, answers=()) -> int:
    """Peak bytes Python allocated while fn(*args) ran (the exceptions in `answers` are
    answers, not failures)."""
    tracemalloc.start()
    try:
        with contextlib.suppress(*answers):
            fn(*args)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
