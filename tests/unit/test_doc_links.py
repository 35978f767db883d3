"""Every relative link in the repository's markdown resolves: to a file or folder inside the
repository and, with a `#fragment`, to a heading of that file (GitHub's anchors). Documents
move (the manual went from README.md to docs/), and a link left behind is found here rather
than by a reader."""

import os
import re
from urllib.parse import unquote

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Not the repository's documents: environments, build outputs, gitignored benchmark results.
SKIP_DIRS = {".git", ".venv", "venv", "build", "dist", "node_modules", "__pycache__",
             os.path.join("perf", "results")}
README_LIMIT = 8192  # bytes; the manual lives in docs/ (CONTRIBUTING.md)

_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_CODE_SPAN = re.compile(r"(`+).*?\1")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")


def _markdown_files():
    for dirpath, dirnames, filenames in os.walk(ROOT):
        rel = os.path.relpath(dirpath, ROOT)
        dirnames[:] = [d for d in dirnames
                       if not d.startswith(".") and not d.endswith(".egg-info")
                       and d not in SKIP_DIRS and os.path.normpath(os.path.join(rel, d)) not in SKIP_DIRS]
        for name in filenames:
            if name.endswith(".md"):
                yield os.path.join(dirpath, name)


def _prose_lines(text: str, blank_code_spans: bool = True):
    """The lines outside fenced and indented code blocks, with code spans blanked."""
    fenced = False
    previous_blank = True
    for number, line in enumerate(text.split("\n"), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        indented_code = previous_blank and line.startswith("    ")
        previous_blank = line.strip() == "" or (indented_code and previous_blank)
        if fenced or indented_code:
            continue
        yield number, _CODE_SPAN.sub("", line) if blank_code_spans else line


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but '-' and '_' dropped, spaces
    to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: str) -> set:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    seen: dict = {}
    out = set()
    for _, line in _prose_lines(text, blank_code_spans=False):
        m = _HEADING.match(line)
        if not m:
            continue
        slug = _slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _links(path: str):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for number, line in _prose_lines(text):
        for m in _LINK.finditer(line):
            yield number, m.group(1)


def _broken(path: str, root: str = ROOT) -> list:
    out = []
    here = os.path.relpath(path, root)
    for number, target in _links(path):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, fragment = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(path), unquote(file_part))) \
            if file_part else path
        where = f"{here}:{number}: {target}"
        if os.path.relpath(dest, root).startswith(".."):
            out.append(f"{where} (outside the repository)")
        elif not os.path.exists(dest):
            out.append(f"{where} (no such file)")
        elif fragment and dest.endswith(".md") and unquote(fragment).lower() not in _anchors(dest):
            out.append(f"{where} (no such heading)")
    return out


def test_relative_links_in_markdown_resolve():
    files = list(_markdown_files())
    assert any(f.endswith(os.path.join("docs", "architecture.md")) for f in files)
    broken = [b for f in sorted(files) for b in _broken(f)]
    assert not broken, "\n".join(broken)


def test_the_checker_sees_what_is_broken(tmp_path):
    doc = tmp_path / "a.md"
    (tmp_path / "b.md").write_text("# The transports' ceiling\n\n## Two: `--flag`\n")
    doc.write_text("[ok](b.md#the-transports-ceiling) [ok](b.md#two---flag) `[code](gone.md)`\n"
                   "\n    [indented](gone.md)\n\n```\n[fenced](gone.md)\n```\n"
                   "[missing](gone.md) [heading](b.md#nowhere) [web](https://example.com)\n"
                   "[out](../elsewhere.md)\n")
    broken = _broken(str(doc), root=str(tmp_path))
    assert [b.split(": ", 1)[1] for b in broken] == ["gone.md (no such file)",
                                                    "b.md#nowhere (no such heading)",
                                                    "../elsewhere.md (outside the repository)"]


def test_readme_stays_short():
    assert os.path.getsize(os.path.join(ROOT, "README.md")) <= README_LIMIT
