"""auto_complete_config: the worker-side script as a subprocess, and the front's wrapper."""

import asyncio
import json
import os
import subprocess
import sys
import textwrap

import pytest

from shmserve.config.parse import parse_config_text
from shmserve.errors import Code, ServerError
from shmserve.repository.config_completion import auto_complete, complete_model_config
from shmserve.repository.scan import ModelEntry
from tests.conftest import ROOT


ADDS_FIELDS = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        print("stdout belongs to the result, so this goes to stderr")
        auto_complete_model_config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]})
        auto_complete_model_config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]})
        auto_complete_model_config.set_max_batch_size(4)
        return auto_complete_model_config
"""

NO_METHOD = """
class TritonPythonModel:
    def execute(self, requests):
        return []
"""

RAISES = """
class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.set_max_batch_size(2)
        return auto_complete_model_config
"""

RETURNS_DICT = """
class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        return auto_complete_model_config.as_dict()
"""

SLEEPS = """
import time

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        time.sleep(30)
"""

CONFIG = {"name": "m", "backend": "python", "max_batch_size": 0, "input": [], "output": []}


def make_model(tmp_path, source, name="m", version=1) -> str:
    model_dir = tmp_path / name
    (model_dir / str(version)).mkdir(parents=True)
    (model_dir / str(version) / "model.py").write_text(textwrap.dedent(source))
    return str(model_dir)


def run_script(model_dir, config=CONFIG, version="1"):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "workers.autocomplete", model_dir, version],
                          input=json.dumps(config), capture_output=True, text=True, env=env,
                          timeout=30)


# --- workers.autocomplete ------------------------------------------------------------------


def test_script_returns_the_fields_the_model_adds(tmp_path):
    done = run_script(make_model(tmp_path, ADDS_FIELDS))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == dict(
        CONFIG, max_batch_size=4,
        input=[{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        output=[{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}])
    assert "goes to stderr" in done.stderr


def test_script_returns_the_config_unchanged_without_the_method(tmp_path):
    config = dict(CONFIG, max_batch_size=8, parameters={"k": {"string_value": "v"}})
    done = run_script(make_model(tmp_path, NO_METHOD), config)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == config


def test_script_reports_an_exception_in_one_line(tmp_path):
    done = run_script(make_model(tmp_path, RAISES), dict(CONFIG, max_batch_size=8))
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "auto_complete_config raised ValueError: configuration specified max_batch_size 8, but "
        "in auto-complete-config function for model 'm' specified max_batch_size 2"]


def test_script_refuses_a_result_that_is_not_a_model_config(tmp_path):
    done = run_script(make_model(tmp_path, RETURNS_DICT))
    assert done.returncode == 1
    assert "must return the pb_utils.ModelConfig it was given, not dict" in done.stderr


def test_script_reports_an_import_failure(tmp_path):
    done = run_script(make_model(tmp_path, "import no_such_module_here\n"))
    assert done.returncode == 1
    line = done.stderr.strip()
    assert line.startswith("failed to import '") and line.endswith(
        "model.py': ModuleNotFoundError: No module named 'no_such_module_here'")


# --- shmserve.repository.config_completion -------------------------------------------------


def test_auto_complete_parses_the_completed_config(tmp_path):
    model_dir = make_model(tmp_path, ADDS_FIELDS, name="ac")
    config = asyncio.run(auto_complete(model_dir, 1, parse_config_text('backend: "python"')))
    assert config.name == "ac"
    assert config.max_batch_size == 4
    assert [(t.name, list(t.dims)) for t in config.input] == [("INPUT0", [-1])]
    assert [t.name for t in config.output] == ["OUTPUT0"]


def test_auto_complete_failure_names_the_model(tmp_path):
    model_dir = make_model(tmp_path, RAISES, name="bad")
    with pytest.raises(ServerError) as err:
        asyncio.run(auto_complete(model_dir, 1, parse_config_text(
            'backend: "python" max_batch_size: 8')))
    assert err.value.code == Code.INVALID_ARG
    assert err.value.message.startswith(
        "failed to auto-complete the configuration of model 'bad': auto_complete_config raised "
        "ValueError: configuration specified max_batch_size 8")


def test_auto_complete_kills_a_model_that_takes_too_long(tmp_path):
    model_dir = make_model(tmp_path, SLEEPS, name="sleepy")
    with pytest.raises(ServerError) as err:
        asyncio.run(auto_complete(model_dir, 1, parse_config_text('backend: "python"'),
                                 timeout=0.5))
    assert err.value.message == ("failed to auto-complete the configuration of model 'sleepy': "
                                 "auto_complete_config did not return within 0.5 s")


def test_only_a_model_file_naming_the_method_is_probed(tmp_path):
    # A model file that does not mention auto_complete_config is never imported: this one
    # would fail if it were.
    model_dir = make_model(tmp_path, "raise SystemExit(3)\n")
    config = parse_config_text('backend: "python"')
    entry = ModelEntry("m", model_dir, [1])
    assert asyncio.run(complete_model_config(entry, config)) is config


def test_the_highest_version_the_policy_selects_is_probed(tmp_path):
    model_dir = make_model(tmp_path, ADDS_FIELDS, version=2)
    (tmp_path / "m" / "3").mkdir()
    (tmp_path / "m" / "3" / "model.py").write_text(textwrap.dedent(RAISES))
    config = parse_config_text(
        'backend: "python" version_policy { specific { versions: [2] } }')
    entry = ModelEntry("m", model_dir, [2, 3])
    assert asyncio.run(complete_model_config(entry, config)).max_batch_size == 4
    with pytest.raises(ServerError):
        asyncio.run(complete_model_config(entry, parse_config_text(
            'backend: "python" max_batch_size: 8')))
