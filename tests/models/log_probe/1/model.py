import logging
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

log = logging.getLogger("log_probe")


class TritonPythonModel:
    """Writes a line each way a model can, naming the request's TAG, so that tests find them in
    the server log: print (stdout), sys.stderr, Python logging (with a traceback), and
    pb_utils.Logger at every level. Answers OUT = TAG. A TAG starting with "fail" then fails
    the request; one starting with "crash" prints a last line and ends the process."""

    def execute(self, requests):
        responses = []
        for request in requests:
            tag = pb_utils.get_input_tensor_by_name(request, "TAG").as_numpy()[0].decode()
            print(f"print {tag}")
            sys.stderr.write(f"stderr {tag}\n")
            log.warning("logging %s", tag)
            try:
                _ = 1 / 0
            except ZeroDivisionError:
                log.exception("traceback %s", tag)
            pb_utils.Logger.log_info(f"info {tag}")
            pb_utils.Logger.log_warn(f"warn {tag}")
            pb_utils.Logger.log_error(f"error {tag}")
            pb_utils.Logger.log_verbose(f"verbose {tag}")
            pb_utils.Logger.log(f"leveled {tag}", pb_utils.Logger.WARNING)
            if tag.startswith("crash"):
                print(f"last words {tag}")
                os._exit(3)
            if tag.startswith("fail"):
                raise pb_utils.TritonModelException(f"failing on purpose {tag}")
            out = pb_utils.Tensor("OUT", np.array([tag.encode()], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
