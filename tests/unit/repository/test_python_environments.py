"""Which models get their own Python environment, and what makes one unfit, before any worker
runs in it (tests/e2e/test_python_environments.py runs models in them)."""

import os
import sys

import pytest

from shmserve.config.parse import parse_config_text
from shmserve.errors import ServerError
from shmserve.repository.python_environments import PythonEnvironments, requested_path

PARAMETER = ('parameters { key: "EXECUTION_ENV_PATH" value: { string_value: '
             '"$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }')


@pytest.mark.parametrize("fields,wanted", [
    ('backend: "python"', True),
    ('backend: "vllm"', True),  # a Python-based backend runs as a Python model
    ('backend: "pytorch" runtime: "model.py"', True),
    ('backend: "onnxruntime"', False),
    ('backend: "pytorch"', False),
])
def test_python_models_get_it_with_the_model_folder_put_in(fields, wanted):
    config = parse_config_text(f"{fields} {PARAMETER}")
    assert requested_path(config, "/models/m") == ("/models/m/env.tar.gz" if wanted else "")
    assert requested_path(parse_config_text(fields), "/models/m") == ""


def test_a_folder_serves_where_it_is(tmp_path):
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "activate").write_text("")
    (tmp_path / "lib" / version).mkdir(parents=True)
    python = tmp_path / "bin" / "python3"
    os.symlink(sys.executable, python)
    environments = PythonEnvironments()
    try:
        environment = environments.prepare(str(tmp_path))
        assert (environment.root, environment.python) == (str(tmp_path), str(python))
        # The workers get the server's two packages alone before the environment's.
        assert sorted(os.listdir(environment.code)) == ["shmserve", "workers"]
        assert os.path.exists(os.path.join(environment.code, "workers", "__main__.py"))
    finally:
        environments.close()
    assert not os.path.exists(environment.code)
    with pytest.raises(ServerError, match="the server is stopping"):
        environments.prepare(str(tmp_path))


def test_an_archive_that_is_no_archive(tmp_path):
    (tmp_path / "env.tar.gz").write_bytes(b"not a tar file")
    environments = PythonEnvironments()
    try:
        with pytest.raises(ServerError, match="failed to extract Python execution environment"):
            environments.prepare(str(tmp_path / "env.tar.gz"))
    finally:
        environments.close()
