"""pipeline.yaml -> a checked Pipeline; every error names file, line, column and field.

YAML is composed into nodes (which carry marks), then turned into plain data while recording the mark of
every value and every key by its path, so a pydantic error at ``steps[2].run.command`` points at its line.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from runner.errors import InputError, suggest
from runner.marks import MarkedData, Path_, dotted
from runner.model import COMMON_FIELDS, TOP_LEVEL_FIELDS, Pipeline, PipelineHeader, StepCommon, StepDecl
from runner.util.datatype import replace
from runner.util.text import is_template
from steps import KINDS, kind_class

MAX_NODES = 100_000  # values aliases may add (an alias bomb, "billion laughs", stops here); a plain file is
# bounded by MAX_BYTES alone
MAX_DEPTH = 60
MAX_BYTES = 10 * 1024 * 1024
EXTENSION_PREFIX = "x-"  # compose's convention: top-level keys that hold YAML anchors, read by nothing else
VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# libyaml's parser where PyYAML has it (several times faster); the pure-Python one otherwise. Both give the
# nodes their marks, which is all the loader needs.
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# The tags plain YAML gives (a timestamp is kept as its text); any other (`!!python/object/apply:...`, `!custom`)
# is refused at its line, not silently read as the mapping or string under it.
PLAIN_TAGS = frozenset(
    f"tag:yaml.org,2002:{name}" for name in ("str", "int", "float", "bool", "null", "map", "seq", "timestamp")
)
MERGE_TAG = "tag:yaml.org,2002:merge"


def _tag(node: yaml.Node) -> str:
    return str(node.tag).replace("tag:yaml.org,2002:", "!!")


def _construct(node: yaml.Node, path: Path_, data: MarkedData, depth: int) -> Any:
    data.count += 1
    if id(node) in data.seen:
        data.expanded += 1
        if data.expanded > MAX_NODES:
            raise data.error(path, f"YAML aliases expand the document by more than {MAX_NODES} values")
    else:
        data.seen.add(id(node))
    if depth > MAX_DEPTH:
        raise data.error(path, f"nested more than {MAX_DEPTH} levels deep")
    data.values[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if node.tag not in PLAIN_TAGS:
        raise data.error(
            path,
            f"YAML tag {_tag(node)!r} is not allowed: a pipeline holds only strings, numbers, booleans, null, "
            "lists and mappings",
        )
    if isinstance(node, yaml.MappingNode):
        # The keys written here, as against those a `<<` merge brings in: a written key overrides a merged one
        # (YAML's merge rule, as PyYAML loads it); the same key written twice is an error.
        written = {id(k) for k, _ in node.value if k.tag != MERGE_TAG}
        data.constructor.flatten_mapping(node)  # resolves `<<` merge keys
        result: dict[str, Any] = {}
        merged: set[str] = set()
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise data.error(path, "a mapping key must be a plain scalar")
            if key_node.tag not in PLAIN_TAGS:
                raise data.error(path, f"YAML tag {_tag(key_node)!r} is not allowed on a key")
            key = data.constructor.construct_object(key_node)
            if not isinstance(key, str):
                key = str(key)
            child = (*path, key)
            if key in result and key not in merged:
                data.keys[child] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
                raise data.error(child, f"duplicate key {key!r}", key=True)
            if id(key_node) in written:
                merged.discard(key)
            else:
                merged.add(key)
            data.keys[child] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            result[key] = _construct(value_node, child, data, depth + 1)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_construct(v, (*path, i), data, depth + 1) for i, v in enumerate(node.value)]
    assert isinstance(node, yaml.ScalarNode)
    value = data.constructor.construct_object(node)
    if not isinstance(value, (str, int, float, bool, type(None))):
        value = str(value)  # dates and the like: keep the text
    return value


def parse_yaml(text: str, file: str) -> tuple[Any, MarkedData]:
    data = MarkedData(file)
    try:
        node = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        context = exc.context if exc.context and exc.problem else ""
        begun = exc.context_mark
        if context and begun is not None and mark is not None and begun.line != mark.line:
            # where what was left open began (a quote, a bracket), not only the end of the file where it was noticed
            context += f" that starts at line {begun.line + 1}, column {begun.column + 1}"
        raise InputError(
            f"YAML syntax error: {problem}" + (f" ({context})" if context else ""),
            file=file,
            line=mark.line + 1 if mark else None,
            column=mark.column + 1 if mark else None,
        ) from None
    except yaml.YAMLError as exc:
        raise InputError(f"YAML error: {exc}", file=file) from None
    except RecursionError:
        raise InputError("the document is nested too deeply", file=file) from None
    if node is None:
        return None, data
    try:
        return _construct(node, (), data, 0), data
    except RecursionError:
        raise InputError("the document is nested too deeply", file=file) from None
    except yaml.YAMLError as exc:
        raise InputError(f"YAML error: {exc}", file=file) from None


def read_text(path: Path, what: str = "pipeline file", missing_hint: str = " (use -f FILE to name another)") -> str:
    shown = str(path)
    if not path.exists():
        raise InputError(f"no {what} at {path.resolve()}{missing_hint}")
    if path.is_dir():
        raise InputError(f"{shown} is a directory, not a {what}")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {shown}: {exc.strerror}") from None
    if len(raw) > MAX_BYTES:
        raise InputError(f"{shown} is larger than {MAX_BYTES // (1024 * 1024)} MiB")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise InputError(
            f"not valid UTF-8 (byte 0x{raw[exc.start]:02x})", file=shown, line=line, column=column
        ) from None


TYPE_WORDS = {
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a mapping",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "none_required": "nothing (null)",
}


def _describe(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"the string {shown!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def validation_errors(
    exc: ValidationError,
    base: Path_,
    model: type[BaseModel],
    data: MarkedData,
    raw: Any,
    skip_templates: bool = False,
) -> list[InputError]:
    """Pydantic errors as InputErrors at the right line, one per field."""
    grouped: dict[Path_, list[Any]] = {}
    for err in exc.errors():
        parts: list[str | int] = []
        # Drop union/type tags pydantic puts in loc (e.g. 'str', 'list[str]', 'function-after[...]').
        for part in err["loc"]:
            if isinstance(part, str) and ("[" in part or part in {"str", "int", "float", "bool", "list"}):
                continue
            if part == "root" and not parts:
                continue
            parts.append(part)
        grouped.setdefault(tuple(parts), []).append(err)
    errors: list[InputError] = []
    # An unknown key explains a "missing" one (`comand` for `command`): report it first.
    ranked = sorted(grouped.items(), key=lambda item: item[1][0]["type"] != "extra_forbidden")
    for loc_key, errs in ranked:
        loc = loc_key
        path = (*base, *loc)
        first = errs[0]
        kind = first["type"]
        if skip_templates:
            value = _lookup(raw, loc)
            if is_template(value):
                continue  # checked again once the template is rendered
        if kind == "extra_forbidden":
            key = str(loc[-1]) if loc else "?"
            parent = _lookup(raw, loc[:-1])
            fields = _field_names(model, loc[:-1])
            choices = fields or (list(parent) if isinstance(parent, dict) else [])
            errors.append(data.error(path, f"unknown key {key!r}" + suggest(key, choices), key=True))
        elif kind == "string_pattern_mismatch" and loc and loc[-1] == "name":
            errors.append(data.error(path, f"{first.get('input')!r} is not a valid name: use letters, digits, - and _"))
        elif kind == "missing":
            errors.append(data.error(path[:-1], "this required field is missing", field=dotted(path)))
        else:
            wanted = [TYPE_WORDS[e["type"]] for e in errs if e["type"] in TYPE_WORDS]
            if wanted and len(wanted) == len(errs):
                unique = list(dict.fromkeys(wanted))
                given = first.get("input")
                got = _describe(given)
                message = f"expected {' or '.join(unique)}, got {got}"
                if "a string" in unique and isinstance(given, (int, float)) and not isinstance(given, bool):
                    # YAML read `ref: 1.0` or a 9-digit commit as a number: quotes keep it as written
                    message += f'; to mean the text, quote it as written (e.g. "{given}")'
            else:
                message = "; ".join(dict.fromkeys(_clean(e["msg"]) for e in errs))
            errors.append(data.error(path, message))
    return errors


def _clean(msg: str) -> str:
    return msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")


def _lookup(raw: Any, loc: tuple[str | int, ...] | list[str | int]) -> Any:
    cur = raw
    for part in loc:
        try:
            cur = cur[part]
        except (KeyError, IndexError, TypeError):
            return None
    return cur


def _field_names(model: type[BaseModel], loc: tuple[str | int, ...]) -> list[str]:
    if loc:
        return []
    fields = getattr(model, "model_fields", {})
    return [f for f in fields if f != "root"]


def read_var_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A `--var-file`: a YAML mapping of var names to values (any YAML value: a list of hosts, a number, ...)."""
    file = Path(path)
    text = read_text(file, "var file", "")
    raw, data = parse_yaml(text, str(file))
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise data.error((), f"a var file is a mapping of var names to values, got {_describe(raw)}", field="")
    for key in raw:
        if not isinstance(key, str) or not VAR_NAME.match(key):
            raise data.error(
                (key,), f"{key!r} is not a var name: letters, digits and _, not starting with a digit", key=True
            )
    return dict(raw)


def load_pipeline(path: str | os.PathLike[str], overrides: dict[str, Any] | None = None) -> Pipeline:
    """Read, parse and check a pipeline file. Raises InputError (the first error found)."""
    file = Path(path)
    text = read_text(file)
    raw, data = parse_yaml(text, str(file))
    return build_pipeline(raw, data, file, overrides or {})


def build_pipeline(raw: Any, data: MarkedData, file: Path, overrides: dict[str, Any]) -> Pipeline:
    if raw is None:
        raise InputError("the file is empty: expected a mapping with `steps:`", file=data.file, line=1)
    if not isinstance(raw, dict):
        raise data.error((), f"the top level must be a mapping with `steps:`, got {_describe(raw)}", field="")
    for key in raw:
        if key not in TOP_LEVEL_FIELDS and not key.startswith(EXTENSION_PREFIX):
            raise data.error(
                (key,),
                f"unknown key {key!r}"
                + suggest(key, list(TOP_LEVEL_FIELDS))
                + " (a top-level key starting `x-` is ignored: a place to keep YAML anchors)",
                key=True,
            )
    header_raw = {k: v for k, v in raw.items() if k != "steps" and not k.startswith(EXTENSION_PREFIX)}
    try:
        header = PipelineHeader.model_validate(header_raw)
    except ValidationError as exc:
        raise validation_errors(exc, (), PipelineHeader, data, header_raw)[0] from None
    if "steps" not in raw:
        raise data.error((), "no `steps:`: a pipeline needs at least one step", field="steps")
    steps_raw = raw["steps"]
    if not isinstance(steps_raw, list):
        raise data.error(("steps",), f"expected a list of steps, got {_describe(steps_raw)}")
    if not steps_raw:
        raise data.error(("steps",), "no steps: a pipeline needs at least one step")
    for name in header.secrets:
        if name not in header.vars:
            raise data.error(("secrets",), f"{name!r} is not a var (secrets name vars whose values are secret)")

    steps: list[StepDecl] = []
    seen: dict[str, int] = {}
    notes: list[str] = []  # what `runner validate` says besides "ok": an older spelling read
    kinds = list(KINDS)
    for index, step_raw in enumerate(steps_raw):
        where: Path_ = ("steps", index)
        if not isinstance(step_raw, dict):
            raise data.error(where, f"a step must be a mapping, got {_describe(step_raw)}")
        label = f"steps[{index}]" + (f" ({step_raw['name']})" if isinstance(step_raw.get("name"), str) else "")
        present = [k for k in step_raw if k in KINDS]
        unknown = [k for k in step_raw if k not in KINDS and k not in COMMON_FIELDS]
        if unknown:
            key = unknown[0]
            raise data.error(
                (*where, key),
                f"unknown key {key!r}" + suggest(key, kinds + list(COMMON_FIELDS)),
                key=True,
                field=f"{label}.{key}",
            )
        if not present:
            raise data.error(where, f"no step kind: give exactly one of {', '.join(kinds)}", field=label)
        if len(present) > 1:
            raise data.error(
                (*where, present[1]),
                f"two kinds in one step ({' and '.join(present)}): a step has exactly one",
                key=True,
                field=label,
            )
        kind = present[0]
        common_raw = {k: v for k, v in step_raw.items() if k != kind}
        spec_raw = step_raw[kind]
        cls = kind_class(kind)
        host_at: Path_ = (*where, "host") if "host" in step_raw else ()
        if not cls.on_machine and "host" in step_raw:
            raise data.error(
                (*where, "host"),
                f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} step works on this machine only, so it takes no `host`",
                key=True,
                field=f"{label}.host",
            )
        if cls.on_machine and isinstance(spec_raw, dict) and "host" in spec_raw and "host" not in cls.Spec.model_fields:
            # the older spelling, `run: {host: ...}`, read as the step's own `host:` (docs/steps.md says the one)
            if "host" in step_raw:
                raise data.error(
                    (*where, kind, "host"),
                    f"`host` is given twice, on the step and inside `{kind}:`: keep the step's",
                    key=True,
                    field=f"{label}.{kind}.host",
                )
            host_at = (*where, kind, "host")
            moved = spec_raw["host"]
            if moved is not None and not isinstance(moved, str):
                raise data.error(host_at, f"expected an ssh destination, got {_describe(moved)}", field=label + ".host")
            try:
                from steps._support.ssh import check_target

                check_target(moved)
            except ValueError as exc:
                raise data.error(host_at, str(exc), field=f"{label}.{kind}.host") from None
            common_raw["host"] = moved
            spec_raw = {k: v for k, v in spec_raw.items() if k != "host"}
            notes.append(
                f"{label}: `{kind}.host` is written on the step now (`host:` beside `name:`); this spelling still works"
            )
        elif "host" in step_raw and isinstance(spec_raw, dict) and spec_raw.get("host") is not None:
            raise data.error(
                (*where, "host"),
                f"the step's `host` is the machine and `{kind}.host` that machine's Docker Engine address: give one",
                key=True,
                field=f"{label}.host",
            )
        try:
            common = StepCommon.model_validate(common_raw)
        except ValidationError as exc:
            err = validation_errors(exc, where, StepCommon, data, common_raw)[0]
            err.field = label + ("." + err.field.split(".", 1)[1] if err.field and "." in err.field else "")
            raise err from None
        if common.for_each is not None and cls.exports_env:
            raise data.error(
                (*where, "for_each"),
                f"a {kind} step cannot have for_each: what it exports must be one set of variables",
                field=f"{label}.for_each",
                key=True,
            )
        host_now = common.host if common.host and "{{" not in common.host and "{%" not in common.host else None
        try:
            cls.Spec.model_validate(spec_raw, context={"host": host_now})
        except ValidationError as exc:
            errs = validation_errors(exc, (*where, kind), cls.Spec, data, spec_raw, skip_templates=True)
            if errs:
                err = errs[0]
                suffix = dotted((*where, kind))
                err.field = (err.field or "").replace(suffix, f"{label}.{kind}", 1)
                raise err from None
        if common.name in seen:
            raise data.error(
                (*where, "name"),
                f"duplicate step name {common.name!r} (first used by steps[{seen[common.name]}])",
                field=f"{label}.name",
            )
        seen[common.name] = index
        steps.append(
            StepDecl(
                index=index,
                name=common.name,
                kind=kind,
                common=common,
                raw=spec_raw,
                declares_needs="needs" in step_raw,
                exports_env=cls.exports_env,
                host_at=host_at,
            )
        )

    for step in steps:
        for j, need in enumerate(step.common.needs):
            if need not in seen:
                raise data.error(
                    ("steps", step.index, "needs", j),
                    f"unknown step {need!r}" + suggest(need, list(seen)),
                    field=f"steps[{step.index}] ({step.name}).needs",
                )
            if need == step.name:
                raise data.error(
                    ("steps", step.index, "needs", j),
                    "a step cannot need itself",
                    field=f"steps[{step.index}] ({step.name}).needs",
                )

    variables = dict(header.vars)
    for key, value in overrides.items():
        variables[key] = value
    # Imported here: graph and template checks need every step.
    from runner.graph import CycleError, Node, build_graph
    from runner.template import check_templates

    refs, env_refs = check_templates(steps, variables, data)
    complete = tuple(replace(s, refs=frozenset(refs[s.name])) for s in steps)
    nodes = []
    exporters: dict[str, str] = {}  # a variable -> the latest env step above that exports it
    for s in complete:
        independent = s.declares_needs and not s.common.needs
        # `needs: []`: no order edges and no earlier env steps, except those exporting an `env.X` it reads
        reads = tuple(dict.fromkeys(exporters[v] for v in sorted(env_refs[s.name]) if v in exporters))
        needs = (*s.common.needs, *(reads if independent else ()))
        nodes.append(Node(s.name, s.kind, needs, s.refs, s.declares_needs, s.exports_env, independent))
        if s.exports_env and isinstance(s.raw, dict):
            exporters.update(dict.fromkeys((str(k) for k in s.raw), s.name))
    try:
        graph = build_graph(nodes)
    except CycleError as exc:
        first = next(s for s in complete if s.name == exc.cycle[0])
        raise data.error(
            ("steps", first.index, "needs"),
            f"dependency cycle: {exc}",
            field=f"steps[{first.index}] ({first.name}).needs",
        ) from None
    pipeline = Pipeline(
        name=header.name or file.stem,
        description=header.description,
        vars=variables,
        secrets=list(header.secrets),
        not_secret=frozenset(header.not_secret),
        steps=complete,
        file=file,
        marks=data,
        graph=graph,
        by_name={s.name: s for s in complete},
        notes=tuple(notes),
    )
    return pipeline
