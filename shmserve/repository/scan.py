"""What model repositories hold: model directories, their version directories, and which
versions a version policy selects."""

import logging
import os
from dataclasses import dataclass

from shmserve.proto import ModelVersionPolicy

CONFIG_FILE = "config.pbtxt"

log = logging.getLogger("shmserve.repository")


@dataclass(slots=True)
class ModelEntry:
    name: str
    path: str
    # Numeric subdirectories, ascending.
    versions: list[int]


def scan_repository(root: str) -> list[ModelEntry]:
    """Every model directory under `root` (one with a config.pbtxt or a version directory),
    by name. Hidden entries and plain files are skipped."""
    entries = []
    with os.scandir(root) as children:
        for child in children:
            if child.name.startswith(".") or not child.is_dir():
                continue
            versions = version_dirs(child.path)
            if versions or os.path.isfile(os.path.join(child.path, CONFIG_FILE)):
                entries.append(ModelEntry(child.name, child.path, versions))
    entries.sort(key=lambda entry: entry.name)
    return entries


def scan_repositories(roots: list[str]) -> tuple[list[ModelEntry], list[str]]:
    """(the models of every repository by name, the names found in more than one). As in
    Triton, a model in more than one repository is not available at all, and the log says
    so."""
    found: dict[str, list[ModelEntry]] = {}
    for root in roots:
        for entry in scan_repository(root):
            found.setdefault(entry.name, []).append(entry)
    entries, several = [], []
    for name, same in sorted(found.items()):
        if len(same) == 1:
            entries.append(same[0])
        else:
            log.error(not_unique(name))
            several.append(name)
    return entries, several


def find_model(roots: list[str], name: str) -> str | None:
    """The directory of model `name` in the repositories; None when no repository has it, or
    more than one does (which the log says, as Triton's)."""
    paths = [os.path.join(root, name) for root in roots
             if os.path.isdir(os.path.join(root, name))]
    if len(paths) > 1:
        log.error(not_unique(name))
    return paths[0] if len(paths) == 1 else None


def not_unique(name: str) -> str:
    return f"failed to poll model '{name}': not unique across all model repositories"


def version_dirs(model_dir: str) -> list[int]:
    """Numeric subdirectory names of a model directory, ascending. As in Triton, a name with
    a leading zero ("01") is not a version, while "0" is."""
    versions = []
    with os.scandir(model_dir) as children:
        for child in children:
            name = child.name
            if (name.isascii() and name.isdigit() and (name == "0" or name[0] != "0")
                    and child.is_dir()):
                versions.append(int(name))
    versions.sort()
    return versions


def select_versions(policy: ModelVersionPolicy,
                    available: list[int]) -> tuple[list[int], list[int]]:
    """(versions to load, versions the policy names that are absent), both ascending.

    latest{n}: the n highest; specific: those listed; all (or no choice): every version.
    Triton loads what exists of a specific list and reports the rest as unavailable.
    """
    choice = policy.WhichOneof("policy_choice")
    if choice == "latest":
        count = policy.latest.num_versions
        return (sorted(available)[-count:] if count else []), []
    if choice == "specific":
        wanted = set(policy.specific.versions)
        present = set(available)
        return sorted(wanted & present), sorted(wanted - present)
    return sorted(available), []


def file_marks(path: str, model_dir: str) -> list:
    """(path relative to `model_dir`, size, mtime) of the file at `path`, or of each file
    under it: what a change to it changes. Bytecode caches (written as the model is
    imported) and hidden entries are not part of a model."""
    try:
        st = os.stat(path)
    except OSError:
        return []
    if not os.path.isdir(path):
        return [(os.path.relpath(path, model_dir), st.st_size, st.st_mtime_ns)]
    marks = []
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        for filename in sorted(filenames):
            file_path = os.path.join(dirpath, filename)
            try:
                st = os.stat(file_path)
            except OSError:
                continue
            marks.append((os.path.relpath(file_path, model_dir), st.st_size, st.st_mtime_ns))
    return marks
