"""How the Python backend words a model's failures, as Triton's Python backend does: an
exception from the model as its type, its message and the model's frames where it was raised
(`describe`); a model that broke the execute() contract without an exception type
(`ContractError`).
"""

import asyncio
import os


class ContractError(Exception):
    """The model broke the execute() contract; reported, as in Triton, without an exception type."""


def describe(exc: BaseException) -> str:
    """As Triton's Python backend (pybind11) words an exception from the model: its type and
    message, then the stack where it was raised, innermost first ("  file(line): function"),
    up to the code that called into the model."""
    # Innermost, the last frame that is not ours: pb_utils raising for a misuse is C++ in
    # Triton, with no frame of its own.
    frame, lineno = None, 0
    tb = exc.__traceback__
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_OWN_CODE):
            frame, lineno = tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next
    lines = []
    while frame is not None and not frame.f_code.co_filename.startswith(_OWN_CODE):
        lines.append(f"  {frame.f_code.co_filename}({lineno}): {frame.f_code.co_name}\n")
        frame = frame.f_back
        lineno = frame.f_lineno if frame is not None else 0
    where = "".join(lines)
    return f"{type(exc).__name__}: {exc}" + (f"\n\nAt:\n{where}" if where else "")


# Frames of the worker and of asyncio (which runs an async execute) are not the model's.
_OWN_CODE = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
             os.path.dirname(asyncio.__file__) + os.sep)
