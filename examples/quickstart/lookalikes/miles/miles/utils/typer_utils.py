"""Look-alike of miles/utils/typer_utils.py: a typer CLI built from a dataclass, with the same rules.

Upstream's ``dataclass_cli`` turns every field of the function's dataclass argument into a ``typer.Option`` whose
name is the field's with dashes (``prompt_data`` -> ``--prompt-data``; a bool -> ``--skip-prepare`` /
``--no-skip-prepare``) and whose environment variable is ``MILES_SCRIPT_<FIELD>``; it prints the resolved
arguments as a table before it calls the function. Parsing is typer's own, so an unknown option such as
``--prompt_data`` exits 2 with "No such option", as upstream does.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any

import typer


def dataclass_cli(func: Callable[..., Any] | None = None, *, env_var_prefix: str = "MILES_SCRIPT_") -> Any:
    if func is None:
        return functools.partial(dataclass_cli, env_var_prefix=env_var_prefix)
    hints = typing.get_type_hints(func)
    first = next(iter(inspect.signature(func).parameters))
    config_class = hints[first]
    field_types = typing.get_type_hints(config_class)
    parameters = []
    for field in dataclasses.fields(config_class):
        option = typer.Option(envvar=f"{env_var_prefix}{field.name.upper()}") if env_var_prefix else typer.Option()
        if field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:
            default = field.default
        parameters.append(
            inspect.Parameter(
                field.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=default,
                annotation=Annotated[field_types[field.name], option],
            )
        )

    def wrapped(**kwargs: Any) -> Any:
        config = config_class(**kwargs)
        width = max(len(f.name) for f in dataclasses.fields(config))
        for f in dataclasses.fields(config):
            value = str(getattr(config, f.name))
            print(f"| {f.name:<{width}} | {value[:47] + '...' if len(value) > 50 else value:<50} |")
        return func(config)

    wrapped.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    wrapped.__doc__ = func.__doc__
    wrapped.__name__ = func.__name__
    return wrapped
