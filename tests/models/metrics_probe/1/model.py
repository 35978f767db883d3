"""Custom metrics: every request counts, sets a gauge to VALUE and observes VALUE."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        # The families are kept: deleting one makes its metrics unusable, as in Triton.
        self.families = [
            pb_utils.MetricFamily("probe_requests", "Requests this model saw",
                                  pb_utils.MetricFamily.COUNTER),
            pb_utils.MetricFamily("probe_last_value", "The last VALUE",
                                  pb_utils.MetricFamily.GAUGE),
            pb_utils.MetricFamily("probe_values", "VALUEs seen",
                                  pb_utils.MetricFamily.HISTOGRAM)]
        requests, value, values = self.families
        self.requests = requests.Metric(labels={"model": args["model_name"]})
        self.value = value.Metric(labels={"model": args["model_name"]})
        self.values = values.Metric(labels={"model": args["model_name"]}, buckets=[1.0, 10.0])

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "VALUE").as_numpy()
            self.requests.increment(1)
            self.value.set(float(value[0]))
            self.values.observe(float(value[0]))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("VALUE_OUT", value)]))
        return responses
