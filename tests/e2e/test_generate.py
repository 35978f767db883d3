"""HTTP generate and generate_stream as Triton answers them (httpx, against the session's
server): keys given twice, the keys "parameters" and "id", and the texts of Triton's errors.
What Triton 2.51 answered to each request is in tests/models/README.md ("HTTP generate");
perf/compat_probe.py sends the same requests to both servers.

Bodies are written as bytes: a JSON object with a key twice cannot be made from a dict.
"""

import gzip
import json

import httpx
import pytest

ALREADY = "[request id: <id_unknown>] input 'INPUT0' already exists in request"
NESTED = "Converting keyword: 'parameters': "
INVALID_TYPE = "parameter 'p' has invalid type. It should be either 'int', 'bool', or 'string'."


def post(server, model: str, body: bytes, route: str = "generate", headers=None):
    return httpx.post(f"http://{server.http_url}/v2/models/{model}/{route}", content=body,
                      headers=headers, timeout=30)


def refused(r, message: str, status: int = 400) -> None:
    assert (r.status_code, r.json()) == (status, {"error": message})
    assert r.headers["content-type"].startswith("application/json")


# -- keys given twice ----------------------------------------------------------------------------

@pytest.mark.parametrize("route", ["generate", "generate_stream"])
@pytest.mark.parametrize("body, message", [
    (b'{"INPUT0":"a","INPUT0":"b"}', ALREADY),
    (b'{"INPUT0":"a","INPUT\\u0030":"b"}', ALREADY),  # the same key, escaped
    (b'{"id":"r1","INPUT0":"a","INPUT0":"b"}',
     "[request id: r1] input 'INPUT0' already exists in request"),
    (b'{"INPUT0":"a","parameters":{"INPUT0":"b"}}', NESTED + ALREADY),
    (b'{"parameters":{"INPUT0":"a","INPUT0":"b"}}', NESTED + ALREADY),
    (b'{"parameters":{"INPUT0":"a"},"INPUT0":"b"}', ALREADY),
    (b'{"parameters":{"INPUT0":"a"},"parameters":{}}', NESTED + ALREADY),
], ids=["top level", "escaped", "with an id", "then in parameters", "in parameters",
        "in parameters, then", "parameters twice"])
def test_an_input_given_twice_is_refused_before_the_model_runs(server, route, body, message):
    # string_echo is not decoupled; generate_stream refuses it with JSON, not an event.
    refused(post(server, "string_echo", body, route), message)


def params_seen(r) -> dict:
    """The parameters params_echo got, as a model reads them (json.loads: the last of a name
    wins; Triton hands the model every setting, '{"p":1,"p":1}')."""
    assert r.status_code == 200, r.text
    return json.loads(r.json()["PARAMS"])


@pytest.mark.parametrize("body, seen", [
    (b'{"INPUT0":[1],"p":1,"p":2}', {"p": 1}),
    (b'{"INPUT0":[1],"p":1,"p":[2]}', {"p": 1}),  # the second value is never read
    (b'{"INPUT0":[1],"parameters":{"p":1,"p":2}}', {"p": 1}),
    (b'{"INPUT0":[1],"p":1,"parameters":{"p":2}}', {"p": 2}),
    (b'{"INPUT0":[1],"parameters":{"a":1},"parameters":{"b":2}}', {"a": 1}),
    (b'{"INPUT0":[1],"parameters":{"a":1},"parameters":3}', {"a": 1}),
    (b'{"INPUT0":[1],"p":1,"\\u0070":2}', {"p": 1}),
])
def test_a_parameter_given_twice_is_the_first_value_as_in_triton(server, body, seen):
    assert params_seen(post(server, "params_echo", body)) == seen


def test_repeated_keys_are_read_in_order(server):
    # The first value of a key is the one read: a bad first fails, a bad second is unread.
    refused(post(server, "params_echo", b'{"INPUT0":[1],"p":[1],"p":2}'), INVALID_TYPE)
    r = post(server, "params_echo", b'{"id":"a","id":5,"INPUT0":[1]}')
    assert r.json()["id"] == "a" and params_seen(r) == {"id": "a"}
    refused(post(server, "params_echo", b'{"INPUT0":[1],"parameters":3,"parameters":{}}'),
            "Expected JSON object for keyword: 'parameters': attempt to access JSON "
            "non-object as object")


def test_an_unknown_model_is_answered_first(server):
    refused(post(server, "no_such_model", b'{"INPUT0":[1],"INPUT0":[2]}'),
            "Request for unknown model: 'no_such_model' is not found", 404)


# -- the keys "id" and "parameters" --------------------------------------------------------------

def seen(r) -> dict:
    assert r.status_code == 200, r.text
    return json.loads(r.json()["SEEN"])


def test_id_is_the_request_id_and_also_an_input_or_a_parameter(server):
    assert seen(post(server, "keyword_inputs", b'{"id":"abc","X":[1]}')) == {
        "X": [1], "id": ["abc"], "params": "{}", "request_id": "abc"}
    r = post(server, "params_echo", b'{"INPUT0":[1],"id":"q"}')
    assert params_seen(r) == {"id": "q"} and r.json()["REQUEST_ID"] == "q"
    # In "parameters" it is only a parameter.
    r = post(server, "params_echo", b'{"INPUT0":[1],"parameters":{"id":"n"}}')
    assert params_seen(r) == {"id": "n"} and r.json()["REQUEST_ID"] == ""


def test_an_input_named_parameters_cannot_be_given(server):
    for body in (b'{"parameters":[1,2]}', b'{"parameters":{"X":[1]}}'):
        refused(post(server, "keyword_inputs", body),
                "Keyword 'parameters' for nested schema also given as input tensor name")
    assert seen(post(server, "keyword_inputs", b'{"X":[1]}'))["X"] == [1]


# -- Triton's error texts (Triton answers 500 where marked: its JSON library's type errors;
# -- shmserve answers 400, as for any malformed request) ---------------------------------------

@pytest.mark.parametrize("route", ["generate", "generate_stream"])
@pytest.mark.parametrize("body", [b"[1]", b'"x"', b"3", b"null"])
def test_a_body_that_is_no_object(server, route, body):
    refused(post(server, "params_echo", body, route), "attempt to get members for non-object")


@pytest.mark.parametrize("value", [b"[1]", b'"x"', b"null", b"3"])
def test_parameters_that_are_no_object(server, value):  # Triton: 500
    refused(post(server, "params_echo", b'{"INPUT0":[1],"parameters":' + value + b"}"),
            "Expected JSON object for keyword: 'parameters': attempt to access JSON "
            "non-object as object")


@pytest.mark.parametrize("value", [b"[1,2]", b'{"a":1}', b"null"])
def test_a_parameter_of_another_type(server, value):
    refused(post(server, "params_echo", b'{"INPUT0":[1],"p":' + value + b"}"), INVALID_TYPE)
    refused(post(server, "params_echo", b'{"INPUT0":[1],"parameters":{"p":' + value + b"}}"),
            NESTED + INVALID_TYPE)


def test_an_error_in_parameters_names_them(server):
    refused(post(server, "square", b'{"parameters":{"IN":[1,2]}}'),
            NESTED + "The schema can not convert input 'IN' to tensor with proper shape")


@pytest.mark.parametrize("value", [b"5", b"null"])
def test_an_id_that_is_no_string(server, value):  # Triton: 500
    refused(post(server, "params_echo", b'{"INPUT0":[1],"id":' + value + b"}"),
            "Unable to parse 'id': attempt to access JSON non-string as string")


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "Identity"])
def test_a_compressed_body_is_refused(server, route, encoding):
    body = gzip.compress(b'{"INPUT0":[1]}') if encoding == "gzip" else b'{"INPUT0":[1]}'
    refused(post(server, "params_echo", body, route, {"Content-Encoding": encoding}),
            "Unsupported content-encoding, only 'identity' is supported.")
    # After the model is found, as in Triton.
    refused(post(server, "nope", body, route, {"Content-Encoding": encoding}),
            "Request for unknown model: 'nope' is not found", 404)


def test_identity_encoding_is_taken(server):
    r = post(server, "params_echo", b'{"INPUT0":[1]}', headers={"Content-Encoding": "identity"})
    assert r.status_code == 200 and r.json()["OUTPUT0"] == 1
