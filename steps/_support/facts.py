"""What a kind asks of a machine: a preflight's FactQuery and what it answers (steps/_support/machine.py reads
them here, and remote.py there, in one round trip), and a kind's own :class:`Fact` (a clone's origin and HEAD)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeVar

from runner.util.datatype import datatype, field

if TYPE_CHECKING:
    from steps.base import StepContext

T = TypeVar("T", covariant=True)


class Fact(Protocol[T]):
    """A read-only query a kind asks a machine, written once: `here` reads this machine in-process (a converged
    probe stays as fast as a file read), `script` is the same question as POSIX sh for another (one round trip),
    and `parse` reads its answer into what `here` returns."""

    def here(self, ctx: StepContext) -> T: ...

    def script(self) -> str: ...

    def parse(self, code: int, out: str) -> T: ...


@datatype
class FactQuery:
    """What a preflight asks of a machine, all answered at once (on another machine, in one round trip)."""

    paths: list[str] = field(default_factory=list)  # patterns that must name something
    kernel: bool = False
    contains: list[tuple[str, str]] = field(default_factory=list)  # (file, text)
    env: list[str] = field(default_factory=list)  # variables a command there gets
    programs: list[str] = field(default_factory=list)
    sysctl: list[str] = field(default_factory=list)  # kernel parameters, dotted


@datatype
class Facts:
    missing_paths: list[str] = field(default_factory=list)
    kernel: str = ""
    # per (file, text) asked: "" it holds the text, "absent" it does not, else "unreadable" and why after a colon
    contains: list[str] = field(default_factory=list)
    unset: list[str] = field(default_factory=list)
    not_found: list[str] = field(default_factory=list)
    sysctl: dict[str, str | None] = field(default_factory=dict)  # key -> its text, None when not there
