"""The HTTP cases: requests good and bad to every endpoint and the endpoints asked other ways,
sequences, the faults of Python models, BLS calls and ensembles, textgen, generate bodies with
a key twice and generate's errors (generate_key_cases), HTTP/1.1 as clients write it on a raw
socket (transport_cases), and the requests whose response headers are compared (header_cases).
Each case is (method, path[, body[, headers]]); they are sent in the order listed, as sequence
cases depend on the steps before them."""
import gzip
import json

from .calls import F4, M, binary, inp


def http_cases():
    plain = json.dumps({"inputs": [inp()]}).encode()
    body4, head4 = binary({"inputs": [inp(data=None, parameters={"binary_data_size": 16})]}, F4)
    cases = {
        "GET /v2": ("GET", "/v2"), "live": ("GET", "/v2/health/live"), "ready": ("GET", "/v2/health/ready"),
        "model metadata": ("GET", M), "version metadata": ("GET", M + "/versions/1"),
        "unknown version metadata": ("GET", M + "/versions/2"), "unknown model metadata": ("GET", "/v2/models/nope"),
        "model ready": ("GET", M + "/ready"), "ready unknown model": ("GET", "/v2/models/nope/ready"),
        "ready unknown version": ("GET", M + "/versions/7/ready"),
        "stats unknown model": ("GET", "/v2/models/nope/stats"),
        "stats unknown version": ("GET", M + "/versions/9/stats"),
        "index ready": ("POST", "/v2/repository/index", {"ready": True}),
        "load in none mode": ("POST", "/v2/repository/models/identity_fp32/load", {}),
        "unload in none mode": ("POST", "/v2/repository/models/identity_fp32/unload", {}),
        "infer": ("POST", M + "/infer", {"inputs": [inp()]}),
        **{f"response sender misuse {misuse}": ("POST", "/v2/models/sender_misuse/infer", {
            "inputs": [inp(shape=[4])], "parameters": {"misuse": misuse}})
           for misuse in ("twice", "returned")},
        "response parameters": ("POST", "/v2/models/params_echo/infer", {
            "inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [1]}],
            "parameters": {"reply_s": "x", "reply_n": 7, "reply_b": True}}),
        "infer id and output": ("POST", M + "/infer", {"id": "abc", "inputs": [inp()], "outputs": [{"name": "OUTPUT0"}]}),
        "infer unknown output": ("POST", M + "/infer", {"inputs": [inp()], "outputs": [{"name": "NOPE"}]}),
        "infer no inputs": ("POST", M + "/infer", {"inputs": []}),
        "infer no inputs key": ("POST", M + "/infer", {}),
        "infer empty body": ("POST", M + "/infer", b""),
        "infer not json": ("POST", M + "/infer", b"{not json"),
        "infer json array": ("POST", M + "/infer", b"[1,2]"),
        "infer unknown input": ("POST", M + "/infer", {"inputs": [inp(name="X")]}),
        "infer input twice": ("POST", M + "/infer", {"inputs": [inp(), inp()]}),
        "infer wrong datatype": ("POST", M + "/infer", {"inputs": [inp(datatype="INT32")]}),
        "infer bad datatype": ("POST", M + "/infer", {"inputs": [inp(datatype="FLOAT")]}),
        "infer no batch dim": ("POST", M + "/infer", {"inputs": [inp(shape=[4])]}),
        "infer batch too large": ("POST", M + "/infer", {"inputs": [inp(shape=[65, 1], data=[1.0] * 65)]}),
        "infer too few elements": ("POST", M + "/infer", {"inputs": [inp(shape=[1, 5])]}),
        "infer negative dim": ("POST", M + "/infer", {"inputs": [inp(shape=[1, -4])]}),
        "infer nested data": ("POST", M + "/infer", {"inputs": [inp(data=[[1, 2], [3, 4]])]}),
        "infer strings as FP32": ("POST", M + "/infer", {"inputs": [inp(data=["a", "b", "c", "d"])]}),
        "infer true as FP32": ("POST", M + "/infer", {"inputs": [inp(data=[1, 2, 3, True])]}),
        "infer FP32 overflow": ("POST", M + "/infer", {"inputs": [inp(data=[1e40, 2, 3, 4])]}),
        "infer NaN and infinities": ("POST", M + "/infer", b'{"inputs":[{"name":"INPUT0","shape":[1,3],'
                                     b'"datatype":"FP32","data":[NaN,Infinity,-Infinity]}]}'),
        "infer no data": ("POST", M + "/infer", {"inputs": [inp(data=None)]}),
        "infer no name": ("POST", M + "/infer", {"inputs": [{"shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}),
        "infer binary_data_output": ("POST", M + "/infer", {"inputs": [inp()], "parameters": {"binary_data_output": True}}),
        "infer priority": ("POST", M + "/infer", {"inputs": [inp()], "parameters": {"priority": 5}}),
        "infer negative timeout": ("POST", M + "/infer", {"inputs": [inp()], "parameters": {"timeout": -1}}),
        "infer list parameter": ("POST", M + "/infer", {"inputs": [inp()], "parameters": {"x": [1]}}),
        "infer number id": ("POST", M + "/infer", {"inputs": [inp()], "id": 5}),
        "infer classification": ("POST", M + "/infer", {"inputs": [inp()], "outputs": [
            {"name": "OUTPUT0", "parameters": {"classification": 2}}]}),
        "infer version 1": ("POST", M + "/versions/1/infer", {"inputs": [inp()]}),
        "infer version 3": ("POST", M + "/versions/3/infer", {"inputs": [inp()]}),
        "infer version x": ("POST", M + "/versions/x/infer", {"inputs": [inp()]}),
        "infer unknown model": ("POST", "/v2/models/nope/infer", {"inputs": [inp()]}),
        "GET infer": ("GET", M + "/infer"),
        "unknown path": ("GET", "/v2/nothing"),
        "infer binary": ("POST", M + "/infer", body4, head4),
        "infer header length not a number": ("POST", M + "/infer", body4, {"Inference-Header-Content-Length": "abc"}),
        "infer header length too large": ("POST", M + "/infer", body4, {"Inference-Header-Content-Length": "9999"}),
        "infer gzip label on plain body": ("POST", M + "/infer", plain, {"Content-Encoding": "gzip"}),
        "infer br": ("POST", M + "/infer", plain, {"Content-Encoding": "br"}),
        "infer decoupled model": ("POST", "/v2/models/repeat/infer", {"inputs": [
            {"name": "IN", "shape": [2], "datatype": "INT32", "data": [1, 2]}]}),
        "generate": ("POST", M + "/generate", {"INPUT0": [1, 2, 3, 4]}),
        "generate FP32 values": ("POST", M + "/generate", {"INPUT0": [0.1, 3.4e38]}),
        "generate one FP32 value": ("POST", M + "/generate", {"INPUT0": 0.1}),
        "generate decoupled model": ("POST", "/v2/models/repeat/generate", {"IN": [1, 2]}),
        "generate decoupled model sending none": ("POST", "/v2/models/repeat/generate", {"IN": []}),
        "generate_stream key order": ("POST", "/v2/models/repeat/generate_stream", {"IN": [1, 2]}),
        "generate not json": ("POST", M + "/generate", b"nope"),
        "shm status": ("GET", "/v2/systemsharedmemory/status"),
        "shm status unknown": ("GET", "/v2/systemsharedmemory/region/nope/status"),
        "shm unregister unknown": ("POST", "/v2/systemsharedmemory/region/nope/unregister"),
        "shm register missing key": ("POST", "/v2/systemsharedmemory/region/r1/register",
                                     {"key": "/shmserve_probe_absent", "offset": 0, "byte_size": 64}),
        "cuda shm status": ("GET", "/v2/cudasharedmemory/status"),
        "logging": ("GET", "/v2/logging"),
        "logging bad level": ("POST", "/v2/logging", {"log_verbose_level": "x"}),
        "trace setting": ("GET", "/v2/trace/setting"),
        "model trace setting": ("GET", M + "/trace/setting"),
    }
    cases.update({  # the endpoints asked another way
        "HEAD live": ("HEAD", "/v2/health/live"), "POST live": ("POST", "/v2/health/live"),
        "live with a trailing slash": ("GET", "/v2/health/live/"),
        "metadata with a trailing slash": ("GET", M + "/"),
        "metadata, versions without one": ("GET", M + "/versions/"),
        "metadata, name percent-encoded": ("GET", "/v2/models/identity%5Ffp32"),
        "metadata, name in other case": ("GET", "/v2/models/Identity_fp32"),
        "metadata, version 01": ("GET", M + "/versions/01"),
        "metadata, version -1": ("GET", M + "/versions/-1"),
        "metadata, query string": ("GET", M + "?x=1"),
        "DELETE model": ("DELETE", M), "PUT infer": ("PUT", M + "/infer", {"inputs": [inp()]}),
        "version config": ("GET", M + "/versions/1/config"),
        "GET index": ("GET", "/v2/repository/index"),
        "index ready not bool": ("POST", "/v2/repository/index", {"ready": "yes"}),
        "index not json": ("POST", "/v2/repository/index", b"{"),
        "logging set": ("POST", "/v2/logging", {"log_verbose_level": 0, "log_info": True}),
        "logging unknown setting": ("POST", "/v2/logging", {"log_colour": True}),
        "logging format": ("POST", "/v2/logging", {"log_format": "ISO8601"}),
        "logging bad format": ("POST", "/v2/logging", {"log_format": "xml"}),
        "logging format back": ("POST", "/v2/logging", {"log_format": "default"}),
        "logging not json": ("POST", "/v2/logging", b"nope"),
        "trace set": ("POST", "/v2/trace/setting", {"trace_rate": "1000"}),
        "trace set number": ("POST", "/v2/trace/setting", {"trace_rate": 1000}),
        "trace set bad level": ("POST", "/v2/trace/setting", {"trace_level": ["LOUD"]}),
        "trace set unknown": ("POST", "/v2/trace/setting", {"trace_colour": "1"}),
        "model trace set": ("POST", M + "/trace/setting", {"trace_count": "5"}),
        "model trace clear": ("POST", M + "/trace/setting", {"trace_count": None}),
        "unknown model trace setting": ("GET", "/v2/models/nope/trace/setting"),
        "infer charset content type": ("POST", M + "/infer", {"inputs": [inp()]},
                                       {"Content-Type": "application/json; charset=utf-8"}),
        "infer text content type": ("POST", M + "/infer", {"inputs": [inp()]}, {"Content-Type": "text/plain"}),
    })
    for mode in range(19):  # model_faults: what a Python model can do wrong
        cases[f"model fault {mode}"] = ("POST", "/v2/models/model_faults/infer", {"inputs": [
            {"name": "MODE", "shape": [1], "datatype": "INT32", "data": [mode]}]})
    for number, (start, end, value) in enumerate(((True, False, 1), (None, None, 2), (None, True, 3),
                                                  (None, True, 3))):
        params = {"sequence_id": 78}
        if start is not None:
            params["sequence_start"] = start
        if end is not None:
            params["sequence_end"] = end
        cases[f"sequence step {number}"] = ("POST", "/v2/models/accumulate/infer", {
            "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [value]}],
            "parameters": params})
    for name, params in (("sequence no id", {}), ("sequence id 0", {"sequence_id": 0}),
                         ("sequence without start", {"sequence_id": 77}),
                         ("sequence string id", {"sequence_id": "abc", "sequence_start": True, "sequence_end": True}),
                         ("sequence start not bool", {"sequence_id": 9, "sequence_start": "yes"})):
        cases[name] = ("POST", "/v2/models/accumulate/infer", {
            "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [1]}], "parameters": params})
    def step(model, value, rows=1, **params):
        return ("POST", f"/v2/models/{model}/infer", {"inputs": [
            {"name": "INPUT", "shape": [rows, 1], "datatype": "INT32", "data": [value] * rows}],
            "parameters": params})
    cases.update({  # more of the sequence batcher, each step in order
        "sequence restart 1": step("accumulate", 5, sequence_id=79, sequence_start=True),
        "sequence restart 2": step("accumulate", 7, sequence_id=79, sequence_start=True),
        "sequence restart 3": step("accumulate", 1, sequence_id=79, sequence_end=True),
        "sequence two rows": step("accumulate", 1, rows=2, sequence_id=80, sequence_start=True),
        "sequence end without start": step("accumulate", 1, sequence_id=81, sequence_end=True),
        "sequence start false": step("accumulate", 1, sequence_id=82, sequence_start=False),
        "sequence string id": step("accumulate", 1, sequence_id="s1", sequence_start=True, sequence_end=True),
        "sequence largest id": step("accumulate", 2, sequence_id=2**64 - 1, sequence_start=True, sequence_end=True),
        "sequence negative id": step("accumulate", 2, sequence_id=-5, sequence_start=True, sequence_end=True),
        "sequence id 1.5": step("accumulate", 2, sequence_id=1.5, sequence_start=True, sequence_end=True),
        "oldest step 1": step("accumulate_oldest", 3, sequence_id=90, sequence_start=True),
        "oldest step 2": step("accumulate_oldest", 4, sequence_id=90),
        "oldest other sequence": step("accumulate_oldest", 10, sequence_id=91, sequence_start=True, sequence_end=True),
        "oldest step 3": step("accumulate_oldest", 5, sequence_id=90, sequence_end=True),
        "oldest after its end": step("accumulate_oldest", 5, sequence_id=90),
    })
    for mode in range(16):  # bls_faults: BLS calls that go wrong, as the calling model sees them
        cases[f"bls fault {mode}"] = ("POST", "/v2/models/bls_faults/infer", {"inputs": [
            {"name": "MODE", "shape": [1], "datatype": "INT32", "data": [mode]}]})
    for mode in (0, 1, 2, 3, 10, 11, 13, 14, 15, 16):  # ens_faults: a step that misbehaves
        cases[f"ensemble fault {mode}"] = ("POST", "/v2/models/ens_faults/infer", {"inputs": [
            {"name": "MODE", "shape": [1], "datatype": "INT32", "data": [mode]}]})
    ens = "/v2/models/ens_identity2/infer"
    ens_in = {"name": "INPUT", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}
    cases.update({
        "ensemble": ("POST", ens, {"inputs": [ens_in]}),
        "ensemble no inputs": ("POST", ens, {"inputs": []}),
        "ensemble unknown input": ("POST", ens, {"inputs": [dict(ens_in, name="X")]}),
        "ensemble wrong datatype": ("POST", ens, {"inputs": [dict(ens_in, datatype="INT32")]}),
        "ensemble no batch dim": ("POST", ens, {"inputs": [dict(ens_in, shape=[2])]}),
        "ensemble unknown output": ("POST", ens, {"inputs": [ens_in], "outputs": [{"name": "NOPE"}]}),
        "ensemble inner tensor as output": ("POST", ens, {"inputs": [ens_in], "outputs": [{"name": "MID1"}]}),
        "ensemble binary output": ("POST", ens, {"inputs": [ens_in], "outputs": [
            {"name": "OUTPUT", "parameters": {"binary_data": True}}]}),
        "generate ensemble": ("POST", "/v2/models/ens_faults/generate", {"MODE": [0]}),
        "generate ensemble whose step raises": ("POST", "/v2/models/ens_faults/generate", {"MODE": [1]}),
        "generate_stream decoupled ensemble": ("POST", "/v2/models/ens_repeat/generate_stream", {"IN": [4, 5]}),
        # textgen: a decoupled model of BYTES, integer, float, boolean and list inputs.
        "textgen generate_stream": ("POST", "/v2/models/textgen/generate_stream", {
            "text_input": "It was", "max_tokens": 6, "seed": 3, "temperature": 0.8}),
        "textgen generate_stream with parameters": ("POST", "/v2/models/textgen/generate_stream", {
            "text_input": "The ", "parameters": {"max_tokens": 4, "seed": 5, "top_p": 0.5}, "id": "t1"}),
        "textgen generate_stream stop": ("POST", "/v2/models/textgen/generate_stream", {
            "text_input": "It was", "max_tokens": 20, "seed": 3, "stop": ["e", "a"]}),
        "textgen generate whole": ("POST", "/v2/models/textgen/generate", {
            "text_input": "It was", "max_tokens": 5, "seed": 3, "stream": False}),
        "textgen generate streaming model": ("POST", "/v2/models/textgen/generate", {
            "text_input": "It was", "max_tokens": 5, "seed": 3}),
        "textgen generate_stream bad seed": ("POST", "/v2/models/textgen/generate_stream", {
            "text_input": "It was", "seed": -1}),
        "textgen generate_stream no text": ("POST", "/v2/models/textgen/generate_stream", {"max_tokens": 2}),
        "textgen generate_stream text as list": ("POST", "/v2/models/textgen/generate_stream", {
            "text_input": ["It", "was"], "max_tokens": 2}),
        **{f"generate model fault {mode}": ("POST", "/v2/models/model_faults/generate", {"MODE": [mode]})
           for mode in (1, 3, 4, 5, 11)},
        "generate_stream model fault 1": ("POST", "/v2/models/model_faults/generate_stream", {"MODE": [1]}),
    })
    cases.update(generate_key_cases())
    return cases


def generate_key_cases():
    """generate bodies with a key twice (as bytes: a dict cannot hold one), the keys "id" and
    "parameters", and the errors whose texts are Triton's; on params_echo and keyword_inputs
    of tests/models/ (tests/e2e/test_generate.py asserts the same answers)."""
    echo, keys = "/v2/models/params_echo/generate", "/v2/models/keyword_inputs/generate"
    echo_stream = "/v2/models/params_echo/generate_stream"
    gzipped = gzip.compress(b'{"INPUT0":[1]}')
    return {f"generate{name if name[0] == '_' else ' ' + name}": ("POST", *case)
            for name, case in {
        "input twice": (echo, b'{"INPUT0":[1],"INPUT0":[2]}'),
        "input twice with an id": (echo, b'{"id":"r1","INPUT0":[1],"INPUT0":[2]}'),
        "input twice, escaped": (echo, b'{"INPUT0":[1],"INPUT\\u0030":[2]}'),
        "input twice, the second bad": (echo, b'{"INPUT0":[1],"INPUT0":"x"}'),
        "input at both levels": (echo, b'{"INPUT0":[1],"parameters":{"INPUT0":[2]}}'),
        "input twice in parameters": (echo, b'{"parameters":{"INPUT0":[1],"INPUT0":[2]}}'),
        "input in parameters, then at the top": (echo, b'{"parameters":{"INPUT0":[1]},"INPUT0":[2]}'),
        "parameters twice with an input": (echo, b'{"parameters":{"INPUT0":[1]},"parameters":{"b":2}}'),
        "_stream input twice": (echo_stream, b'{"INPUT0":[1],"INPUT0":[2]}'),
        "_stream textgen input twice": ("/v2/models/textgen/generate_stream",
                                        b'{"text_input":"a","text_input":"b","max_tokens":1}'),
        "unknown model, input twice": ("/v2/models/nope/generate", b'{"INPUT0":[1],"INPUT0":[2]}'),
        "parameter twice": (echo, b'{"INPUT0":[1],"p":1,"p":2}'),
        "parameter twice, the second bad": (echo, b'{"INPUT0":[1],"p":1,"p":[2]}'),
        "parameter twice, the first bad": (echo, b'{"INPUT0":[1],"p":[1],"p":2}'),
        "parameter at both levels": (echo, b'{"INPUT0":[1],"p":1,"parameters":{"p":2}}'),
        "parameters twice": (echo, b'{"INPUT0":[1],"parameters":{"a":1},"parameters":{"b":2}}'),
        "parameters twice, the first no object": (echo, b'{"INPUT0":[1],"parameters":3,"parameters":{}}'),
        "id twice": (echo, b'{"id":"a","id":5,"INPUT0":[1]}'),
        "id twice, the first no string": (echo, b'{"id":5,"id":"a","INPUT0":[1]}'),
        "id": (echo, b'{"INPUT0":[1],"id":"q"}'),
        "id in parameters": (echo, b'{"INPUT0":[1],"parameters":{"id":"n"}}'),
        "id as an input": (keys, b'{"id":"abc","X":[1]}'),
        "input named parameters": (keys, b'{"parameters":[1,2]}'),
        "input named parameters, an object": (keys, b'{"parameters":{"X":[1]}}'),
        "parameter of another type": (echo, b'{"INPUT0":[1],"p":[1,2]}'),
        "parameter of another type in parameters": (echo, b'{"INPUT0":[1],"parameters":{"p":null}}'),
        "parameters no object": (echo, b'{"INPUT0":[1],"parameters":[1]}'),
        "parameters null": (echo, b'{"INPUT0":[1],"parameters":null}'),
        "error in parameters": ("/v2/models/textgen/generate_stream",
                                b'{"parameters":{"text_input":["a","b"]}}'),
        "body no object": (echo, b'[1]'),
        "_stream body no object": (echo_stream, b'null'),
        "missing input": (echo, b'{"p":1}'),
        "value of another type": (echo, b'{"INPUT0":"x"}'),
        "triton_ parameter": (echo, b'{"INPUT0":[1],"triton_x":1}'),
        "reserved parameters": (echo, b'{"INPUT0":[1],"priority":1,"timeout":5000000,"binary_data_output":true}'),
        "gzip": (echo, gzipped, {"Content-Encoding": "gzip"}),
        "_stream gzip": (echo_stream, gzipped, {"Content-Encoding": "gzip"}),
        "unknown model, gzip": ("/v2/models/nope/generate", gzipped, {"Content-Encoding": "gzip"}),
        "Identity encoding": (echo, b'{"INPUT0":[1]}', {"Content-Encoding": "Identity"}),
        "identity encoding": (echo, b'{"INPUT0":[1]}', {"Content-Encoding": "identity"}),
    }.items()}


def transport_cases():
    """HTTP/1.1 as a client may write it: chunked bodies, pipelining, 100-continue, 1.0."""
    body = json.dumps({"inputs": [inp()]}).encode()
    head = f"POST {M}/infer HTTP/1.1\r\nHost: x\r\n".encode()
    sized = head + b"Content-Length: %d\r\n\r\n" % len(body) + body
    chunked = head + b"Transfer-Encoding: chunked\r\n\r\n" + b"".join(
        b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:10], body[10:])) + b"0\r\n\r\n"
    return {
        "transport chunked body": (chunked, 1),
        "transport two pipelined": (sized + sized, 2),
        "transport pipelined, the first bad": (head + b"Content-Length: 2\r\n\r\n{]" + sized, 2),
        "transport 100-continue": (head + b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body)
                                   + body, 1),
        "transport HTTP/1.0": (f"GET {M} HTTP/1.0\r\n\r\n".encode(), 1),
        "transport connection close": (b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                                       + sized, 2),
        "transport lower-case method": (f"get {M} HTTP/1.1\r\nHost: x\r\n\r\n".encode(), 1),
        "transport no Host": (f"GET {M} HTTP/1.1\r\n\r\n".encode(), 1),
        "transport binary header length in another case": (
            head + b"inference-header-content-length: %d\r\nContent-Length: %d\r\n\r\n" % (len(body), len(body))
            + body, 1),
    }


def header_cases():
    """Requests whose response headers are compared (those a client reads)."""
    body4, head4 = binary({"inputs": [inp(data=None, parameters={"binary_data_size": 16})],
                           "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}, F4)
    plain = json.dumps({"inputs": [inp()]}).encode()
    return {
        "headers ready": ("GET", "/v2/health/ready"),
        "headers metadata": ("GET", M),
        "headers infer json": ("POST", M + "/infer", plain),
        "headers infer binary": ("POST", M + "/infer", body4, head4),
        "headers infer gzip accepted": ("POST", M + "/infer", plain, {"Accept-Encoding": "gzip"}),
        "headers infer deflate accepted": ("POST", M + "/infer", plain, {"Accept-Encoding": "deflate"}),
        "headers infer error": ("POST", M + "/infer", {"inputs": [inp(name="X")]}),
        "headers unknown model": ("GET", "/v2/models/nope"),
        "headers unknown path": ("GET", "/v2/nothing"),
    }
