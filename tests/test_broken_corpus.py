"""The corpus of broken pipelines in tests/broken: each exits 2 and names its line and field; never a traceback.

Each file's first line says what it expects: `# expect: exit=2 line=N field="..." text="..."` (and
`commands=...` when only some commands find the fault, e.g. a template that is refused when rendered).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import ROOT, Project

from tests.harness import Harness

CORPUS = sorted((ROOT / "tests" / "broken").glob("*.yaml"))
HEADER = re.compile(
    rb'^# expect: exit=(?P<exit>\d+) line=(?P<line>\d+|None) field=(?P<field>"[^"]*") text=(?P<text>"[^"]*")'
    rb"(?: commands=(?P<commands>[a-z,]+))?"
)


def test_the_corpus_is_large_enough() -> None:
    assert len(CORPUS) >= 40


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_broken_pipeline(path: Path, project: Project) -> None:
    match = HEADER.match(path.read_bytes())
    assert match, f"{path.name} has no expect header"
    expected_exit = int(match["exit"])
    line = None if match["line"] == b"None" else int(match["line"])
    field = json.loads(match["field"])
    text = json.loads(match["text"])
    commands = (match["commands"] or b"validate,plan,apply").decode().split(",")
    shutil.copy(path, project.path / "pipeline.yaml")
    runner = Harness(project.path)  # the CLI's main in process: its exit code and words, as the program's
    for command in commands:
        result = runner(command)
        message = result.err + result.out
        assert result.code == expected_exit, (command, message)
        assert "Traceback" not in message  # apply reports a render-time refusal as the step's failure
        if line is not None:
            assert f"pipeline.yaml:{line}:" in message, (command, message)
        assert field in message, (command, message)
        assert text in message, (command, message)
