"""The README's Deploy section shows only what the shipped files hold: every code block there starts with
a ``# deploy/...`` line naming its file, and its other lines appear in that file, in order, unbroken."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def deploy_blocks() -> list[tuple[str, list[str]]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Deploy\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```[a-z]*\n(.*?)```", section, re.S)
    out = []
    for block in blocks:
        first, *rest = block.rstrip("\n").split("\n")
        out.append((first, rest))
    return out


def test_every_deploy_snippet_is_cut_from_its_file():
    blocks = deploy_blocks()
    assert len(blocks) >= 6
    for first, lines in blocks:
        m = re.fullmatch(r"# (deploy/\S+)", first)
        assert m, f"a Deploy snippet must start with '# deploy/<file>', not {first!r}"
        source = (ROOT / m[1]).read_text().split("\n")
        starts = [i for i, line in enumerate(source) if line == lines[0]]
        assert any(source[i:i + len(lines)] == lines for i in starts), f"{m[1]} does not hold:\n" + "\n".join(lines)
