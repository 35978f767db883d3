"""Custom metrics read back at once, from inside execute(), as Triton's QA model
custom_metrics does: the request parameter `mode` says what to do.

- `scrape`: set the gauge `scrape_value` to VALUE, increment the counter `scrape_requests`,
  observe VALUE in the histogram `scrape_values` (buckets 1, 10), then answer the text of
  http://127.0.0.1:<metrics_port>/metrics (`metrics_port`, a request parameter).
- `clash`: declare `probe_requests` (metrics_probe's counter) as a gauge; answer the error.
"""

import json
import urllib.request

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        labels = {"model": args["model_name"]}
        self.families = [
            pb_utils.MetricFamily("scrape_value", "The VALUE last executed",
                                  pb_utils.MetricFamily.GAUGE),
            pb_utils.MetricFamily("scrape_requests", "Requests executed",
                                  pb_utils.MetricFamily.COUNTER),
            pb_utils.MetricFamily("scrape_values", "VALUEs executed",
                                  pb_utils.MetricFamily.HISTOGRAM)]
        gauge, counter, histogram = self.families
        self.gauge = gauge.Metric(labels=labels)
        self.counter = counter.Metric(labels=labels)
        self.histogram = histogram.Metric(labels=labels, buckets=[1.0, 10.0])

    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            value = float(pb_utils.get_input_tensor_by_name(request, "VALUE").as_numpy()[0])
            if params.get("mode") == "clash":
                try:
                    pb_utils.MetricFamily("probe_requests", "clash",
                                          pb_utils.MetricFamily.GAUGE)
                    text = "declared"
                except pb_utils.TritonModelException as exc:
                    text = str(exc)
            else:
                self.gauge.set(value)
                self.counter.increment(1)
                self.histogram.observe(value)
                url = f"http://127.0.0.1:{params['metrics_port']}/metrics"
                with urllib.request.urlopen(url, timeout=10) as r:
                    text = r.read().decode()
            out = pb_utils.Tensor("TEXT", np.array([text.encode()], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
