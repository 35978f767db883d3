"""Repository scanning and version policies."""

import pytest
from google.protobuf import text_format

import shmserve.proto as proto
from shmserve.repository.scan import ModelEntry, scan_repository, select_versions


def make_model(root, name, versions=(), config=True):
    model = root / name
    model.mkdir()
    if config:
        (model / "config.pbtxt").write_text(f'name: "{name}"')
    for version in versions:
        (model / version).mkdir()
    return model


def test_scan_finds_model_directories(tmp_path):
    make_model(tmp_path, "b_model", ["1", "3", "10"])
    make_model(tmp_path, "a_model", ["2"], config=False)
    make_model(tmp_path, "config_only")
    make_model(tmp_path, ".hidden", ["1"])
    make_model(tmp_path, "not_a_model", ["warmup", "latest"], config=False)
    (tmp_path / "README.md").write_text("models live here")
    (tmp_path / "stray.pbtxt").write_text("")
    assert scan_repository(str(tmp_path)) == [
        ModelEntry("a_model", str(tmp_path / "a_model"), [2]),
        ModelEntry("b_model", str(tmp_path / "b_model"), [1, 3, 10]),
        ModelEntry("config_only", str(tmp_path / "config_only"), []),
    ]


def test_version_directories_follow_triton(tmp_path):
    model = make_model(tmp_path, "m", ["0", "7", "007", "1a", "-1", "initial_state", ".2"])
    (model / "5").write_text("a file, not a version directory")
    assert scan_repository(str(tmp_path))[0].versions == [0, 7]


def test_scan_of_empty_repository(tmp_path):
    assert scan_repository(str(tmp_path)) == []


def test_scan_of_missing_repository_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        scan_repository(str(tmp_path / "absent"))


def policy(text: str):
    return text_format.Parse(text, proto.ModelVersionPolicy())


@pytest.mark.parametrize("text,available,expected", [
    ("latest { num_versions: 1 }", [1, 3, 2], ([3], [])),
    ("latest { num_versions: 2 }", [5, 1, 9, 3], ([5, 9], [])),
    ("latest { num_versions: 5 }", [2, 1], ([1, 2], [])),
    ("latest { num_versions: 0 }", [1, 2], ([], [])),
    ("latest { num_versions: 1 }", [], ([], [])),
    ("all { }", [3, 1, 2], ([1, 2, 3], [])),
    ("", [2, 1], ([1, 2], [])),
    ("specific { versions: [ 3, 1 ] }", [1, 2, 3], ([1, 3], [])),
    ("specific { versions: [ 4, 2, 4, 9 ] }", [1, 2, 3], ([2], [4, 9])),
])
def test_select_versions(text, available, expected):
    assert select_versions(policy(text), available) == expected


def test_several_repositories_serve_together_and_a_name_in_two_is_in_none(tmp_path, caplog):
    from shmserve.repository.scan import find_model, scan_repositories
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    make_model(first, "only_a", ["1"])
    make_model(second, "only_b", ["1"])
    make_model(first, "twice", ["1"])
    make_model(second, "twice", ["2"])
    roots = [str(first), str(second)]
    entries, several = scan_repositories(roots)
    assert entries == [ModelEntry("only_a", str(first / "only_a"), [1]),
                       ModelEntry("only_b", str(second / "only_b"), [1])]
    assert several == ["twice"]
    assert "failed to poll model 'twice': not unique across all model repositories" in caplog.text
    assert find_model(roots, "only_b") == str(second / "only_b")
    assert find_model(roots, "twice") is None
    assert find_model(roots, "nowhere") is None
