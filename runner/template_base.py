"""What the template modules share: the limits, the context's types, the errors and the hooks the renderers
call (runner.template renders the common subset and checks; runner.jinja_templates renders the rest). Both
import it and neither imports the other at module level, so there is no cycle between them."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from runner.simple_template import TemplateLimit

if TYPE_CHECKING:
    from jinja2.sandbox import SandboxedEnvironment


def _ip_address(value: Any) -> bool:
    """`x is ip_address`: a literal IPv4 or IPv6 address (not a host name): sslip.io domains need one."""
    import ipaddress

    try:
        ipaddress.ip_address(str(value).strip())
    except ValueError:
        return False
    return True


class Outputs(dict[str, Any]):
    """A step's outputs in the template context; knows its step's name for error messages."""

    def __init__(self, step: str, values: Mapping[str, Any]) -> None:
        super().__init__(values)
        self.step = step


MAX_RENDER_SECONDS = 5.0  # time one template may take
MAX_SEQUENCE = 100_000  # items or characters a `*` may make; the sandbox already caps range() there

_parts = threading.local()


def _finalize(value: Any) -> Any:
    """Each `{{ expression }}`'s value on its way into the text: handed to the collector that
    `secret_parts` installs (a slice of a secret is masked as the secret is)."""
    sink = getattr(_parts, "sink", None)
    if sink is not None and isinstance(value, str):
        sink(value)
    return value


@contextlib.contextmanager
def secret_parts(sink: Callable[[str], None]) -> Iterator[None]:
    """While rendering in this thread, every expression's string value goes to `sink` too."""
    previous = getattr(_parts, "sink", None)
    _parts.sink = sink
    try:
        yield
    finally:
        _parts.sink = previous


class EnvView(dict[str, str]):
    """`env` in templates: runner's environment and the exports of the env steps a step sees. A variable that
    is not set is an error that says so (not Jinja's "'dict object' has no attribute")."""

    def unset(self, environment: SandboxedEnvironment, name: str) -> Any:
        return environment.undefined(
            hint=f"env.{name} is not set (not in runner's environment, nor exported by an env step this step "
            f"sees); `{{{{ env.{name} | default('') }}}}` makes it optional"
        )


class RenderError(Exception):
    def __init__(self, message: str, path: tuple[str | int, ...]) -> None:
        super().__init__(message)
        self.message = message
        self.path = path


class TemplateSyntax(Exception):
    """Jinja could not parse a template (raised by template_names with Jinja's message)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


MAX_ITERATIONS = 1_000_000  # range() items one render may ask for, nested loops included
_budget = threading.local()


def _range(*args: int) -> range:
    """range() under a budget per render: nested loops cannot multiply into hours of work."""
    made = range(*args)
    left = getattr(_budget, "left", MAX_ITERATIONS) - len(made)
    if left < 0:
        raise TemplateLimit(f"its loops ask for more than {MAX_ITERATIONS} iterations")
    _budget.left = left
    return made
