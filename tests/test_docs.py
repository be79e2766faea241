"""The reference docs and the JSON Schema stay in sync with the models, and the examples pass the schema."""

from __future__ import annotations

import json

import jsonschema
import pytest
import yaml
from conftest import ROOT

from runner.docs import generate
from runner.schema import pipeline_schema
from steps import KINDS, kind_class

EXAMPLES = [
    ROOT / "pipeline.yaml",
    ROOT / "examples" / "quickstart" / "pipeline.yaml",
    ROOT / "examples" / "multinode" / "pipeline.yaml",
]


def test_steps_md_is_generated_from_the_models() -> None:
    assert (ROOT / "docs" / "steps.md").read_text() == generate(), "run: python -m runner.docs > docs/steps.md"
    text = generate()
    for kind in KINDS:
        assert f"## `{kind}`" in text
        for field in kind_class(kind).Spec.model_fields:
            if field != "root":
                assert f"| `{field}` |" in text, f"{kind}.{field} is not documented"


def test_every_field_has_a_description() -> None:
    for kind in KINDS:
        for name, info in kind_class(kind).Spec.model_fields.items():
            if name != "root":
                assert info.description, f"{kind}.{name} has no description"


def test_the_schema_file_is_current_and_a_valid_schema() -> None:
    schema = json.loads((ROOT / "docs" / "pipeline.schema.json").read_text())
    assert schema == pipeline_schema(), "run: runner schema -o docs/pipeline.schema.json"
    jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_examples_pass_the_schema_and_point_editors_at_it(path) -> None:  # type: ignore[no-untyped-def]
    text = path.read_text()
    assert text.splitlines()[0].startswith("# yaml-language-server: $schema=")
    target = (path.parent / text.splitlines()[0].split("$schema=", 1)[1]).resolve()
    assert target == (ROOT / "docs" / "pipeline.schema.json").resolve()
    jsonschema.validate(yaml.safe_load(text), pipeline_schema())


def test_the_schema_rejects_what_the_loader_rejects() -> None:
    schema = pipeline_schema()
    bad = [
        {"steps": [{"name": "x", "rum": {"command": "true"}}]},  # unknown kind
        {"steps": [{"name": "x", "run": {"command": "true"}, "git": {"url": "u", "dest": "d"}}]},  # two kinds
        {"steps": [{"name": "x", "docker": {"image": "i"}}]},  # docker without a name
        {"steps": [{"name": "x", "run": {"command": "true", "creatse": []}}]},  # misspelt field
    ]
    for document in bad:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(document, schema)
