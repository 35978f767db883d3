"""Fixtures shared by several test modules of the workers: `make_runner`, a PythonModel over a
model.py written into a temporary repository and loaded from there (the test_python_backend_*
modules; test_sequence_extras_runner.py has a `make_runner` of its own, which takes precedence
there), and `memory`, a buffer for the implicit state of the sequence extras (the
test_sequence_extras_* modules)."""

import textwrap

import pytest

from tests.unit.workers.python_backend_helpers import CONFIG
from workers.backends import Context
from workers.backends.python import PythonModel


@pytest.fixture
def make_runner(tmp_path):
    runners = []

    def make(source, config=CONFIG, filename="model.py", files=None):
        model_dir = tmp_path / config["name"]
        (model_dir / "1").mkdir(parents=True)
        (model_dir / "1" / filename).write_text(textwrap.dedent(source))
        for name, text in (files or {}).items():
            (model_dir / "1" / name).write_text(textwrap.dedent(text))
        runner = PythonModel(Context(
            model_name=config["name"], model_version=1, model_dir=str(model_dir),
            model_config=config, instance_name=f"{config['name']}_0_0", instance_kind="CPU",
            device_id=0, model_repository=str(model_dir),
        ))
        runners.append(runner)
        return runner

    yield make
    for runner in runners:
        runner.finalize()


@pytest.fixture
def memory():
    return memoryview(bytearray(1 << 16))
