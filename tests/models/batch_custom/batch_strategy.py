"""A batch holds at most MAX_ELEMENTS (a model config parameter) elements of INPUT0, whatever
the mix of request shapes: the allow_ragged_batch input lets different shapes share a batch."""

import math


def batcher_initialize(model_config):
    return int(model_config["parameters"]["MAX_ELEMENTS"]["string_value"])


def batch_initialize(max_elements):
    return {"room": max_elements}


def batch_include_request(request, batch):
    elements = math.prod(request.input_shape("INPUT0"))
    if elements > batch["room"]:
        return False
    batch["room"] -= elements
    return True
