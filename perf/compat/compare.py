"""How two servers' answers to one case are compared: shmserve's wordings that the reference
shares put into Triton's, Triton's 500 for a malformed body taken as the reference's 400, the
values that depend on time and load left out of a structure (shape_of), and how a difference
is shown."""
import re


# shmserve's wording -> Triton 2.51's, where the reference words it as shmserve does.
REWORDED = (
    ("Failed to process the request(s) for model instance '", "Failed to process the request(s) for model '"),
)


# Triton answers 500 where the reference asks for 400 (malformed JSON, bad parameters): only
# the status and message differ, and those cases are recognised by this pattern of its answer.
TRITON_PARSE_500 = re.compile(r"^(Converting keyword: '[^']*': )?(Unable to parse|failed to parse the request JSON "
                              r"buffer|attempt to access JSON|attempt to get members for non-object|Expected JSON "
                              r"object for keyword)")


def shape_of(answer):
    """An answer's structure without the values that depend on time and load: numbers become
    0, and a list keeps the shape of its first item (batch sizes seen vary from run to run)."""
    if isinstance(answer, bool):
        return answer
    if isinstance(answer, (int, float)):
        return 0
    if isinstance(answer, str) and answer.isdigit():
        return "0"  # MessageToDict writes 64-bit integers as strings
    if isinstance(answer, dict):
        return {key: shape_of(value) for key, value in answer.items()}
    if isinstance(answer, list):
        return [shape_of(answer[0])] if answer else []
    return answer


def reworded(answer):
    if isinstance(answer, str):
        for ours, theirs in REWORDED:
            answer = answer.replace(ours, theirs)
        return answer
    if isinstance(answer, (list, tuple)):
        return type(answer)(reworded(item) for item in answer)
    if isinstance(answer, dict):
        return {key: reworded(value) for key, value in answer.items()}
    return answer


def differs(triton, shmserve) -> bool:
    shmserve = reworded(shmserve)
    if triton == shmserve:
        return False
    # Triton's 500 for a malformed body or parameter, where the reference asks for 400.
    if (isinstance(triton, tuple) and triton[0] == 500 and shmserve[0] == 400 and
            isinstance(triton[1], dict) and TRITON_PARSE_500.match(triton[1].get("error", ""))):
        return False
    return True


def shown_difference(triton, shmserve) -> list:
    """Two lines, one per server: the answers; of two lists (an index) the items only one
    has, of two objects (a config) the keys whose values differ."""
    if (isinstance(triton, tuple) and isinstance(shmserve, tuple) and len(triton) == len(shmserve) == 2
            and type(triton[1]) is type(shmserve[1])):
        theirs, ours = triton[1], shmserve[1]
        if isinstance(theirs, list):
            triton, shmserve = ((triton[0], [item for item in theirs if item not in ours]),
                                (shmserve[0], [item for item in ours if item not in theirs]))
        elif isinstance(theirs, dict):
            keys = [key for key in theirs.keys() | ours.keys() if theirs.get(key) != ours.get(key)]
            triton, shmserve = ((triton[0], {key: theirs.get(key) for key in keys}),
                                (shmserve[0], {key: ours.get(key) for key in keys}))
    return [f"  triton   {str(triton)[:600]}", f"  shmserve {str(shmserve)[:600]}"]
