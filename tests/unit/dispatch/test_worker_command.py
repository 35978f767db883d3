"""Workers run the server's own code, whatever directory the server was started from."""

import subprocess
import sys

from shmserve.dispatch.worker_process import worker_command, worker_env


def test_a_folder_in_the_current_directory_does_not_shadow_the_servers_code(tmp_path):
    fake = tmp_path / "shmserve"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise SystemExit(3)\n")
    shadowed = subprocess.run([sys.executable, "-m", "shmserve.ipc.idle_spin"], cwd=tmp_path,
                              env=worker_env())
    assert shadowed.returncode == 3  # what `python -m` does here
    ours = subprocess.run(worker_command("shmserve.ipc.idle_spin"), cwd=tmp_path,
                          env=worker_env())
    assert ours.returncode == 0


def test_the_arguments_reach_the_module(tmp_path):
    (tmp_path / "echo_args.py").write_text("import sys; print(sys.argv[1:])\n")
    env = dict(worker_env(), PYTHONPATH=f"{tmp_path}:{worker_env()['PYTHONPATH']}")
    out = subprocess.run(worker_command("echo_args", "7", "300"), env=env, cwd="/",
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['7', '300']"
