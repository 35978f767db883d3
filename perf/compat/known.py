"""The differences between shmserve's answers and Triton 2.51's that are kept on purpose, each
with its reason (mostly where ../shared/reference states a behaviour that Triton 2.51 does not
have, or where Triton's answer is a fault of its own). Any difference not listed here makes
compat_probe.py's exit status 1; an entry whose difference no longer shows is named in its
report as stale."""

# Case name -> why its answers may differ.
KNOWN = {
    "GET /v2": "server name and version",
    "grpc server metadata": "server name and version",
    "transport pipelined, the first bad": "malformed JSON: 400 as the reference says (Triton 2.51: 500); the "
                                          "request after it gets the same answer",
    "transport lower-case method": "Triton 2.51 closes the connection without an answer; shmserve answers 400",
    "infer empty body": "Triton 2.51 runs the model on no inputs and answers 200",
    "infer gzip label on plain body": "Triton 2.51 ignores the failed inflate and runs the model on no inputs",
    "infer header length not a number": "the reference: 400 for a bad Inference-Header-Content-Length",
    "infer br": "same status; shmserve's message names the encoding",
    "grpc two raw contents for one input": "Triton 2.51 ignores the extra raw_input_contents entry",
    "stream triton_grpc_error": "the reference: the first error ends the stream (Triton 2.51 goes on)",
    "shm register missing key": "same status; shmserve adds the OS's reason",
    "grpc shm register missing key": "same status; shmserve adds the OS's reason",
    "grpc cuda register short handle": "same status; shmserve says what is wrong with the handle",
    "infer bad datatype": "same status; shmserve names the datatype",
    "grpc infer bad datatype": "same status; shmserve names the datatype",
    "config ens_identity2": "the reference's model_config has ensemble_scheduling.max_inflight_requests, Triton 2.51's has not",
    "config ens_identity4": "as ens_identity2",
    "config ens_faults": "as ens_identity2",
    "config ens_repeat": "as ens_identity2",
    "ensemble fault 0": "the same outputs in another order: Triton's ensemble lists them in its hash table's order",
    **{case: "as 'ensemble fault 0' (OUT and IDX: Triton lists IDX first)"
       for case in ("stream ensemble", "stream ensemble sequence fields",
                    "stream ensemble empty final response", "stream ensemble unknown input, then on")},
    "headers ready": "Triton labels an empty body text/plain; shmserve sends no Content-Type for it",
    "headers unknown path": "Triton labels its JSON error body text/plain",
    "shm register past the end": "the reference: INVALID_ARG for a region beyond the object (Triton 2.51: 500 'Invalid shared memory region')",
    "explicit load not json config": "Triton 2.51: 500 'failed to poll from model repository', the reason only in its log; shmserve: 400, Triton's text then the reason",
    "grpc explicit load bad config": "as 'explicit load not json config' (INTERNAL / INVALID_ARGUMENT)",
    "explicit load config of another name": "as 'explicit load not json config'",
    "explicit load file without config": "as 'explicit load not json config'",
    "explicit load unknown_field": "as 'explicit load not json config'; after it, Triton's index lists the model by name only, shmserve's UNAVAILABLE with the reason",
    "explicit infer with loaded files": "Triton 2.51 accepts the model.py sent with the load, yet runs the repository's (identity); shmserve runs the one sent (doubling)",
    "grpc shm register unaligned offset": "Triton mmaps the offset, which must be page-aligned (the reference); shmserve takes any offset",
    "metrics": "shmserve_ histograms Triton lacks; no pinned memory pool; nv_model_load_duration_secs newer than 2.51",
    "model fault 12": "execute returned None without answering: Triton 2.51 never answers, shmserve fails the request",
    "model fault 17": "the class named in the message is shmserve's InferenceResponse",
    "stream fault 8": "send() given a str: the TypeError's text is pybind's in Triton, ours in shmserve",
    "features optional input of another batch": "Triton checks a request's inputs in its hash table's order, "
                                                "shmserve in the request's: each names another input",
    "features required input missing": "Triton 2.51 only counts the inputs of a model with optional ones (2 is "
                                       "between 1 and 3) and runs it without the required one; shmserve refuses "
                                       "the request (400)",
    **{f"counted {case}": "Triton 2.51 counts a failed ensemble request twice in the ensemble's fail "
                          "count; shmserve once"
       for case in ("ensemble fault 1", "ensemble fault 2", "ensemble fault 3", "ensemble fault 10",
                    "ensemble fault 11", "generate ensemble whose step raises", "bls fault 14",
                    "stream bls 6")},
    "counted stream fault 5": "the model raises after its final response: Triton counts the request failed, "
                              "shmserve, whose answer was whole, a success",
    "stream identity triton_grpc_error": "as 'stream triton_grpc_error'",
    "textgen generate_stream no text": "as 'features required input missing' (the model itself says "
                                       "'text_input' is required, as an event)",
    **{f"generate{case}": "the model reads the same parameters: Triton hands a Python model every setting of a "
                          "key given twice ('{\"p\":1,\"p\":1}', the first value each time; at both levels "
                          "'{\"p\":1,\"p\":2}'), shmserve each key once, with the value json.loads takes from "
                          "Triton's (the first at its level, the last set)"
       for case in (" parameter twice", " parameter twice, the second bad", " parameter at both levels",
                    " parameters twice", " id twice")},
    "generate triton_ parameter": "the reference refuses triton_ parameters over HTTP (400); Triton 2.51's "
                                  "generate passes them to the model",
    "generate reserved parameters": "shmserve gives priority, timeout and binary_data_output their meaning "
                                    "in generate too, and keeps them from the model; Triton 2.51's generate "
                                    "passes them to the model as any other parameter",
    "types output listed twice": "Triton since 2.69 refuses an output requested twice ('output ... already "
                                 "exists in request'); Triton 2.51 answers it once",
    **{case: "Triton 2.51 writes the response sent, then an error object, into one 500 body (gRPC: "
             "INTERNAL); shmserve delivers the response sent and logs the failure (issue 59: Triton "
             "delivers the first response and drops the extra)"
       for case in ("response sender misuse twice", "grpc response sender misuse twice")},
    **{f"counted {case}": "the client got the response sent: shmserve counts a success, Triton 2.51 a "
                          "BACKEND failure"
       for case in ("response sender misuse twice", "response sender misuse returned",
                    "grpc response sender misuse twice")},
    **{case: "InferenceResponse(parameters=) is newer than Triton 2.51 (python_backend 2.55): its model "
             "raises TypeError"
       for case in ("response parameters", "grpc response parameters")},
    **{case: "the same reason, and after it the exit the front saw"
       for case in ("explicit load init_exits", "explicit index after broken loads", "grpc explicit index")},
    "bls fault 5": "a BLS response's error keeps its code (INVALID_ARG), as Triton's Python backend since "
                   "2.58; Triton 2.51 made it INTERNAL",
    "HEAD live": "shmserve answers HEAD wherever GET is allowed (RFC 9110); Triton 2.51: 405",
    "logging bad format": "the same message; Triton 2.51 answers 503 (UNAVAILABLE), shmserve 400",
    "metadata, name percent-encoded": "tritonclient percent-encodes model names in URLs and shmserve decodes "
                                      "them; Triton 2.51 looks the encoded name up",
    "trace set bad level": "Triton 2.51 takes an unknown trace level as OFF; shmserve refuses it (400)",
    "batch of 0": "Triton 2.51 words a batch of 0 as a byte size mismatch ('Expected 16, got 0', as "
                  "for a batch of 1); shmserve says the batch size must be at least 1",
    **{f"types {case}": "Triton 2.51 wraps an integer out of its datatype's range (256 as UINT8 is 0); "
                        "shmserve refuses it (400)"
       for case in ("UINT8 256", "INT8 -129", "INT16 40000", "UINT32 2^32")},
}
