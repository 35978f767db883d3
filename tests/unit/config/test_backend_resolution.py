"""Which backend runs a model (shmserve/config/backend.py): Triton's rules and texts."""

import pytest

from shmserve.config.backend import (backend_settings, check_backend_fields,
                                     fill_backend_fields, parse_backend_config, require_backend,
                                     runtime_folder)
from shmserve.config.normalize import normalize_config
from shmserve.config.parse import parse_config_text
from shmserve.errors import ServerError


def layout(tmp_path, folders: dict) -> str:
    """A model folder: {version folder: [file names; a name ending in "/" is a folder]}."""
    model = tmp_path / "m"
    model.mkdir()
    for folder, names in folders.items():
        (model / folder).mkdir()
        for name in names:
            if name.endswith("/"):
                (model / folder / name.rstrip("/")).mkdir()
            else:
                (model / folder / name).write_text("")
    return str(model)


def filled(tmp_path, text: str, folders: dict, name: str = "m"):
    config = parse_config_text(text)
    fill_backend_fields(config, layout(tmp_path, folders), name)
    return config.backend, config.platform, config.default_model_filename


@pytest.mark.parametrize("given,folders,expected", [
    # from the files of the first version folder, in name order
    ("", {"1": ["model.py"]}, ("python", "", "model.py")),
    ("", {"10": ["model.py"], "2": []}, ("python", "", "model.py")),  # "10" sorts first
    ("", {"1": ["model.onnx"]}, ("onnxruntime", "onnxruntime_onnx", "model.onnx")),
    ("", {"1": ["model.onnx/"]}, ("onnxruntime", "onnxruntime_onnx", "model.onnx")),
    # Triton sets no file name when it inferred the platform from model.pt
    ("", {"1": ["model.pt"]}, ("pytorch", "pytorch_libtorch", "")),
    ("", {"1": ["model.plan"]}, ("tensorrt", "tensorrt_plan", "model.plan")),
    ("", {"1": ["model.savedmodel/"]},
     ("tensorflow", "tensorflow_savedmodel", "model.savedmodel")),
    # ONNX is looked for before Python
    ("", {"1": ["model.py", "model.onnx"]}, ("onnxruntime", "onnxruntime_onnx", "model.onnx")),
    # a model.pt folder is no TorchScript file
    ("", {"1": ["model.pt/", "model.py"]}, ("python", "", "model.py")),
    # from a platform, a backend or a file name
    ('platform: "onnxruntime_onnx"', {}, ("onnxruntime", "onnxruntime_onnx", "model.onnx")),
    ('backend: "onnxruntime"', {"1": ["model.py"]},
     ("onnxruntime", "onnxruntime_onnx", "model.onnx")),
    ('default_model_filename: "model.onnx"', {},
     ("onnxruntime", "onnxruntime_onnx", "model.onnx")),
    ('backend: "onnxruntime" default_model_filename: "net.onnx"', {},
     ("onnxruntime", "onnxruntime_onnx", "net.onnx")),
    ('platform: "pytorch_libtorch"', {}, ("pytorch", "pytorch_libtorch", "")),
    ('backend: "pytorch"', {}, ("pytorch", "pytorch_libtorch", "model.pt")),
    ('default_model_filename: "model.py"', {}, ("python", "", "model.py")),
    ('backend: "python"', {}, ("python", "", "model.py")),
    # a file name that names no backend, and no files that do: nothing is filled in
    ('default_model_filename: "other.py"', {"1": ["model.py"]}, ("", "", "other.py")),
    ('platform: "ensemble"', {"1": ["model.py"]}, ("", "ensemble", "")),
    # a backend shmserve does not know keeps its name (and is refused by name later)
    ('backend: "vllm"', {"1": ["model.py"]}, ("vllm", "", "")),
])
def test_backend_fields_are_filled_as_triton_does(tmp_path, given, folders, expected):
    assert filled(tmp_path, given, folders) == expected


def test_a_model_named_like_a_backend_runs_on_it(tmp_path):
    assert filled(tmp_path, "", {"1": ["weights.bin"]}, name="net.identity") == (
        "identity", "", "model.identity")


def test_no_backend_at_all_is_triton_s_error(tmp_path):
    with pytest.raises(ServerError) as err:
        filled(tmp_path, "", {"1": ["weights.bin"]})
    assert err.value.message == (
        "Invalid model name: Could not determine backend for model 'm' with no backend in model "
        "configuration. Expected model name of the form 'model.<backend_name>'.")


@pytest.mark.parametrize("given,message", [
    ('name: "m" backend: "onnxruntime" platform: "pytorch_libtorch"',
     "unexpected 'platform' and 'backend' pair, got:pytorch_libtorch, onnxruntime"),
    ('name: "m" backend: "pytorch" platform: "onnxruntime_onnx"',
     "unexpected 'platform' and 'backend' pair, got:onnxruntime_onnx, pytorch"),
    ('name: "m" backend: "pytorch" platform: "libtorch"',
     "unexpected 'platform' and 'backend' pair, got:libtorch, pytorch"),
    ('name: "m" platform: "tensorflow_graphdef_x"',
     "unexpected platform type 'tensorflow_graphdef_x' for m"),
    ('name: "m" backend: "python" platform: "ensemble"',
     "Ensemble model 'm' must have platform type 'ensemble' and empty backend type"),
])
def test_backend_and_platform_must_agree(given, message):
    with pytest.raises(ServerError) as err:
        check_backend_fields(parse_config_text(given))
    assert err.value.message == message


@pytest.mark.parametrize("given", [
    'name: "m" backend: "onnxruntime" platform: "onnxruntime_onnx"',
    'name: "m" backend: "pytorch" platform: "pytorch_libtorch"',
    # Python, and backends Triton does not know, take any platform
    'name: "m" backend: "python" platform: "whatever"',
    'name: "m" backend: "custom" platform: "whatever"',
    'name: "m" platform: "ensemble"',
])
def test_agreeing_pairs_pass(given):
    check_backend_fields(parse_config_text(given))


def test_normalize_refuses_a_mismatch_too():
    config = parse_config_text('name: "m" backend: "onnxruntime" platform: "pytorch_libtorch"')
    with pytest.raises(ServerError, match="unexpected 'platform' and 'backend' pair"):
        normalize_config(config, "m", 0)


def test_onnx_cpu_groups_default_to_two_instances_as_in_triton():
    onnx = normalize_config(parse_config_text(
        'name: "m" backend: "onnxruntime" platform: "onnxruntime_onnx"'), "m", 0)
    python = normalize_config(parse_config_text('name: "m" backend: "python"'), "m", 0)
    given = normalize_config(parse_config_text(
        'name: "m" backend: "onnxruntime" platform: "onnxruntime_onnx" '
        'instance_group { count: 3 kind: KIND_CPU }'), "m", 0)
    assert [g.count for g in onnx.instance_group] == [2]
    assert [g.count for g in python.instance_group] == [1]
    assert [g.count for g in given.instance_group] == [3]


def test_an_unknown_backend_is_refused_by_name():
    with pytest.raises(ServerError) as err:
        require_backend(parse_config_text('name: "m" backend: "vllm"'))
    assert err.value.message == ("unable to find backend library for backend 'vllm', try "
                                 "specifying runtime on the model configuration.")


def python_based(tmp_path, backend="custom"):
    (tmp_path / backend).mkdir()
    (tmp_path / backend / "model.py").write_text("")
    return str(tmp_path)


def test_a_backend_with_a_model_py_in_the_backend_directory_is_python_based(tmp_path):
    directory = python_based(tmp_path)
    config = parse_config_text('name: "m" backend: "custom"')
    require_backend(config, directory, find_spec=None)
    assert config.runtime == "model.py"
    assert runtime_folder(config.runtime, config.backend, directory) == str(tmp_path / "custom")
    assert runtime_folder("", "python", directory) == ""


def test_runtime_model_py_makes_any_backend_python_based(tmp_path):
    directory = python_based(tmp_path, "pytorch")
    config = parse_config_text('name: "m" backend: "pytorch" runtime: "model.py"')
    require_backend(config, directory, find_spec=None)  # torch is not needed
    config = parse_config_text('name: "m" backend: "onnxruntime" runtime: "model.py"')
    with pytest.raises(ServerError) as err:
        require_backend(config, directory)
    assert err.value.message == (
        "unable to find Python backend based backend library 'model.py' for model 'm', "
        f"searched: '{tmp_path / 'onnxruntime' / 'model.py'}'")


@pytest.mark.parametrize("text,message", [
    ('backend: "a/b"', "backend name 'a/b' of model 'm' is not the name of a folder in "
                       "backend directory"),
    ('backend: ".." runtime: "model.py"', "backend name '..' of model 'm' is not"),
    ('backend: "onnxruntime" runtime: "libtriton_pytorch.so"',
     "unable to find backend library 'libtriton_pytorch.so' for model 'm'"),
])
def test_runtimes_that_cannot_be_found(tmp_path, text, message):
    with pytest.raises(ServerError) as err:
        require_backend(parse_config_text('name: "m" ' + text), python_based(tmp_path))
    assert message in err.value.message


def test_a_missing_framework_names_the_extra():
    config = parse_config_text('name: "m" backend: "pytorch" platform: "pytorch_libtorch"')
    with pytest.raises(ServerError) as err:
        require_backend(config, find_spec=lambda name: None)
    assert err.value.message == ("backend 'pytorch' of model 'm' needs the Python package "
                                 "'torch', which is not installed: pip install 'shmserve[torch]'")
    looked_up = []
    require_backend(parse_config_text('name: "m" backend: "onnxruntime"'),
                    find_spec=lambda name: looked_up.append(name) or object())
    assert looked_up == ["onnxruntime"]
    require_backend(parse_config_text('name: "m" backend: "python"'), find_spec=None)
    require_backend(parse_config_text('name: "m" platform: "ensemble"'), find_spec=None)


def test_backend_config_settings():
    settings = parse_backend_config(["default-max-batch-size=8", "onnxruntime,a=1",
                                     "onnxruntime,default-max-batch-size=2", "python,x=a,b"])
    assert settings == {"": {"default-max-batch-size": "8"},
                        "onnxruntime": {"a": "1", "default-max-batch-size": "2"},
                        "python": {"x": "a,b"}}
    assert backend_settings(settings, "onnxruntime") == {"default-max-batch-size": "2", "a": "1"}
    assert backend_settings(settings, "python") == {"default-max-batch-size": "8", "x": "a,b"}
    assert backend_settings({}, "onnxruntime") == {"default-max-batch-size": "4"}
    for bad in ("onnxruntime,nothing", "=3", "plain"):
        with pytest.raises(ValueError):
            parse_backend_config([bad])
