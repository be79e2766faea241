"""The JSON Schema of pipeline.yaml, assembled from the common fields and each kind's spec model."""

from __future__ import annotations

from typing import Any

from runner.model import PipelineHeader, StepCommon
from steps import KINDS, kind_class


def pipeline_schema() -> dict[str, Any]:
    defs: dict[str, Any] = {}

    def hoist(schema: dict[str, Any]) -> dict[str, Any]:
        defs.update(schema.pop("$defs", {}))
        return schema

    common = hoist(StepCommon.model_json_schema())
    variants = []
    for kind in KINDS:
        spec = hoist(kind_class(kind).Spec.model_json_schema())
        spec.pop("title", None)
        variants.append(
            {
                "title": f"{kind} step",
                "type": "object",
                "properties": {**common["properties"], kind: spec},
                "required": ["name", kind],
                "additionalProperties": False,
            }
        )
    header = hoist(PipelineHeader.model_json_schema())
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "runner pipeline",
        "type": "object",
        "properties": {
            **header["properties"],
            "steps": {"type": "array", "minItems": 1, "items": {"oneOf": variants}},
        },
        "required": ["steps"],
        "patternProperties": {"^x-": {"description": "ignored by runner: a place to keep YAML anchors"}},
        "additionalProperties": False,
        "$defs": defs,
    }
