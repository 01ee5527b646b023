"""Dockerfiles read into the steps an image build runs, for builders other than Docker's.

:func:`parse_dockerfile` reads the instructions as written (line continuations, comments,
parser directives, the JSON "exec" form, ``--flag=value`` options); :meth:`Dockerfile.plan`
resolves the last stage into what a builder executes: the base image and, in order, the
``RUN``, ``COPY``/``ADD`` and ``WORKDIR`` steps with the ``ARG``/``ENV`` values, working
directory, user and shell in force at each, ``$VAR`` and ``${VAR:-default}`` expanded
where Docker expands them (not inside ``RUN``: the shell does that from the environment).

What a builder cannot reproduce without Docker is refused with a one-line error naming the
file and line (``COPY --from`` another stage or image, ``ADD`` of a URL, ``RUN`` heredocs,
``ONBUILD``), never silently dropped. Instructions that describe how a container starts
rather than what its filesystem holds (``CMD``, ``ENTRYPOINT``, ``EXPOSE``, ``LABEL``,
``VOLUME``, ``HEALTHCHECK``, ``STOPSIGNAL``, ``MAINTAINER``) are parsed and kept out of the
plan.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from stayer.errors import ConfigError

# Instructions that change the filesystem or the state later steps run in.
_BUILD = {"FROM", "RUN", "COPY", "ADD", "WORKDIR", "ENV", "ARG", "USER", "SHELL"}
# Instructions about how a container starts, not what its filesystem holds.
_RUNTIME_ONLY = {
    "CMD",
    "ENTRYPOINT",
    "EXPOSE",
    "LABEL",
    "VOLUME",
    "HEALTHCHECK",
    "STOPSIGNAL",
    "MAINTAINER",
}
_KNOWN = _BUILD | _RUNTIME_ONLY | {"ONBUILD"}
# Docker's own default shell for the shell form of RUN.
DEFAULT_SHELL: tuple[str, ...] = ("/bin/sh", "-c")
_DIRECTIVE = re.compile(r"#\s*([A-Za-z]+)\s*=\s*(\S+)\s*$")
_FLAG = re.compile(r"--([A-Za-z][A-Za-z0-9-]*)(?:=(\S*))?")
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::([-+])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


@dataclass(frozen=True, slots=True)
class Instruction:
    """One instruction as written. ``value`` is the text after the keyword and its leading
    ``--flags``, continuation lines joined; ``exec_form`` is set when that text is a JSON
    array of strings (``RUN ["a", "b"]``)."""

    keyword: str  # upper case
    value: str
    line: int  # where it starts, 1-based
    flags: tuple[tuple[str, str], ...] = ()
    exec_form: tuple[str, ...] | None = None

    def flag(self, name: str) -> str | None:
        return next((v for k, v in self.flags if k == name), None)


@dataclass(frozen=True, slots=True)
class RunStep:
    """``RUN``: ``argv`` is what to execute (the shell form already wrapped in the shell)."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]  # ENV then ARG values in force, ENV winning
    workdir: str
    user: str
    line: int
    network: bool = True  # docker build gives RUN the network unless --network=none


@dataclass(frozen=True, slots=True)
class CopyStep:
    """``COPY``/``ADD`` from the build context: ``sources`` relative to it, ``dest``
    absolute (a trailing ``/`` kept: it means "into this directory")."""

    sources: tuple[str, ...]
    dest: str
    chown: str | None
    chmod: str | None
    line: int
    extract: bool = False  # ADD unpacks a local tar archive


@dataclass(frozen=True, slots=True)
class WorkdirStep:
    """``WORKDIR``: the directory is created (owned by the user in force) if missing."""

    path: str
    user: str
    line: int


Step = RunStep | CopyStep | WorkdirStep


@dataclass(frozen=True)
class Plan:
    """The last stage of a Dockerfile, resolved: what a builder runs, in order, and the
    state the image's container starts in."""

    base: str  # FROM's image, variables expanded, e.g. "python:3.12-slim"
    steps: tuple[Step, ...]
    env: tuple[tuple[str, str], ...]  # ENV at the end (ARG values are not kept, as in Docker)
    workdir: str
    user: str
    ignored: tuple[str, ...] = ()  # runtime-only instructions left out, "CMD (line 9)"


@dataclass(frozen=True)
class Dockerfile:
    path: Path
    instructions: tuple[Instruction, ...]
    escape: str = "\\"

    def plan(self, build_args: dict[str, str] | None = None) -> Plan:
        return _plan(self, build_args or {})

    @property
    def base(self) -> str:
        """The last stage's base image, as :meth:`plan` resolves it."""
        return self.plan().base


def parse_dockerfile(path: str | Path) -> Dockerfile:
    """Read ``path``; ConfigError naming the file and line for what is not a Dockerfile."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from e
    return parse_text(text, path)


def parse_text(text: str, path: Path = Path("Dockerfile")) -> Dockerfile:
    lines = text.splitlines()
    escape = "\\"
    start = 0
    # Parser directives: comments of the form "# name=value" before anything else.
    for start, raw in enumerate(lines):  # noqa: B007 - start is used after the loop
        if not (m := _DIRECTIVE.match(raw.strip())):
            break
        if m.group(1).lower() == "escape":
            if m.group(2) not in ("\\", "`"):
                raise ConfigError(
                    f"{path}:{start + 1}: escape directive must be \\ or `, not {m.group(2)!r}"
                )
            escape = m.group(2)
    else:
        start = len(lines)
    instructions: list[Instruction] = []
    i = start
    while i < len(lines):
        first = i
        stripped = lines[i].strip()
        i += 1
        if not stripped or stripped.startswith("#"):
            continue
        parts = [stripped]
        # A line ending in the escape character continues on the next; comment lines and
        # blank lines inside a continuation are skipped, as Docker does.
        while parts[-1].endswith(escape):
            parts[-1] = parts[-1][: -len(escape)].rstrip()
            while i < len(lines) and (not lines[i].strip() or lines[i].strip().startswith("#")):
                i += 1
            if i == len(lines):
                break
            parts.append(lines[i].strip())
            i += 1
        joined = " ".join(p for p in parts if p)
        instructions.append(_instruction(joined, first + 1, path))
    if not any(ins.keyword == "FROM" for ins in instructions):
        raise ConfigError(f"{path}: no FROM instruction; a Dockerfile starts from a base image")
    return Dockerfile(path=path, instructions=tuple(instructions), escape=escape)


def _instruction(text: str, line: int, path: Path) -> Instruction:
    keyword, _, rest = text.partition(" ")
    keyword = keyword.upper()
    if keyword not in _KNOWN:
        raise ConfigError(f"{path}:{line}: unknown instruction {keyword!r}")
    rest = rest.strip()
    flags: list[tuple[str, str]] = []
    if keyword in ("RUN", "COPY", "ADD", "FROM", "HEALTHCHECK"):
        while (m := _FLAG.match(rest)) and (len(rest) == m.end() or rest[m.end()].isspace()):
            flags.append((m.group(1), m.group(2) or ""))
            rest = rest[m.end() :].lstrip()
    exec_form = None
    if rest.startswith("[") and keyword in (
        "RUN",
        "CMD",
        "ENTRYPOINT",
        "COPY",
        "ADD",
        "SHELL",
        "VOLUME",
    ):
        try:
            parsed = json.loads(rest)
        except json.JSONDecodeError:
            parsed = None  # not JSON: Docker then runs it in the shell form
        if isinstance(parsed, list) and all(isinstance(a, str) for a in parsed):
            exec_form = tuple(parsed)
    if keyword == "RUN" and re.match(r"<<-?\s*['\"]?[A-Za-z_]", rest):
        # BuildKit reads the lines after "RUN <<EOF" as its body; this parser would take
        # them for instructions. Refuse rather than run half a script.
        raise ConfigError(
            f"{path}:{line}: RUN here-documents (RUN <<EOF) are not supported; use RUN with && or a script file"
        )
    return Instruction(keyword, rest, line, tuple(flags), exec_form)


def expand(text: str, values: dict[str, str]) -> str:
    """``$NAME``, ``${NAME}``, ``${NAME:-default}`` and ``${NAME:+alternative}`` as Docker
    expands them in FROM, COPY, WORKDIR, ENV, ARG and USER; ``\\$`` stays a literal ``$``."""

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(4)
        value = values.get(name, "")
        if m.group(2) == "-":
            return value or expand(m.group(3), values)
        if m.group(2) == "+":
            return expand(m.group(3), values) if value else ""
        return value

    pieces = text.split("\\$")
    return "$".join(_VAR.sub(one, p) for p in pieces)


def _pairs(ins: Instruction, values: dict[str, str], path: Path) -> list[tuple[str, str]]:
    """``ENV``/``LABEL``-style ``k=v k2="v 2"`` or the legacy ``ENV k v w``."""
    try:
        words = shlex.split(ins.value, posix=True)
    except ValueError as e:
        raise ConfigError(f"{path}:{ins.line}: {ins.keyword}: {e}") from e
    if not words:
        raise ConfigError(f"{path}:{ins.line}: {ins.keyword} needs a name and a value")
    if "=" not in words[0]:
        name, _, value = ins.value.strip().partition(" ")
        return [(name, expand(value.strip(), values))]
    pairs = []
    for word in words:
        name, eq, value = word.partition("=")
        if not eq or not name:
            raise ConfigError(
                f"{path}:{ins.line}: {ins.keyword}: expected NAME=VALUE, got {word!r}"
            )
        pairs.append((name, expand(value, values)))
    return pairs


def _plan(dockerfile: Dockerfile, build_args: dict[str, str]) -> Plan:
    path = dockerfile.path
    # ARGs before the first FROM are visible to FROM lines only.
    global_args: dict[str, str] = {}
    stages: list[list[Instruction]] = []
    for ins in dockerfile.instructions:
        if ins.keyword == "FROM":
            stages.append([ins])
        elif not stages:
            if ins.keyword != "ARG":
                raise ConfigError(
                    f"{path}:{ins.line}: {ins.keyword} before FROM; only ARG may come first"
                )
            name, eq, default = ins.value.strip().partition("=")
            global_args[name] = build_args.get(name, expand(default, global_args) if eq else "")
        else:
            stages[-1].append(ins)
    stage = stages[-1]
    from_words = expand(stage[0].value, {**global_args, **build_args}).split()
    if not from_words:
        raise ConfigError(f"{path}:{stage[0].line}: FROM needs an image")
    base = from_words[0]
    stage_names = {
        expand(s[0].value, global_args).split()[-1].lower()
        for s in stages[:-1]
        if len(s[0].value.split()) == 3
    }
    if base.lower() in stage_names:
        raise ConfigError(
            f"{path}:{stage[0].line}: FROM {base}: building on an earlier stage is not supported without Docker"
        )

    args: dict[str, str] = {}
    env: dict[str, str] = {}
    workdir, user, shell = "/", "root", DEFAULT_SHELL
    steps: list[Step] = []
    ignored: list[str] = []
    for ins in stage[1:]:
        values = {**args, **env}
        kw = ins.keyword
        if kw == "ARG":
            name, eq, default = ins.value.strip().partition("=")
            if name in global_args and not eq:
                args[name] = global_args[name]
            else:
                args[name] = build_args.get(name, expand(default, values) if eq else "")
        elif kw == "ENV":
            env.update(_pairs(ins, values, path))
        elif kw == "WORKDIR":
            target = expand(ins.value.strip(), values)
            workdir = posixpath.normpath(posixpath.join(workdir, target))
            steps.append(WorkdirStep(workdir, user, ins.line))
        elif kw == "USER":
            user = expand(ins.value.strip(), values) or "root"
        elif kw == "SHELL":
            if not ins.exec_form:
                raise ConfigError(
                    f'{path}:{ins.line}: SHELL needs the JSON form, e.g. SHELL ["/bin/bash", "-c"]'
                )
            shell = ins.exec_form
        elif kw == "RUN":
            if ins.flag("mount") is not None:
                raise ConfigError(f"{path}:{ins.line}: RUN --mount is not supported without Docker")
            argv = ins.exec_form if ins.exec_form is not None else (*shell, ins.value)
            steps.append(
                RunStep(
                    argv=tuple(argv),
                    env=tuple({**args, **env}.items()),
                    workdir=workdir,
                    user=user,
                    line=ins.line,
                    network=ins.flag("network") != "none",
                )
            )
        elif kw in ("COPY", "ADD"):
            steps.append(_copy(ins, values, workdir, path))
        elif kw == "ONBUILD":
            raise ConfigError(f"{path}:{ins.line}: ONBUILD is not supported without Docker")
        else:
            ignored.append(f"{kw} (line {ins.line})")
    return Plan(
        base=base,
        steps=tuple(steps),
        env=tuple(env.items()),
        workdir=workdir,
        user=user,
        ignored=tuple(ignored),
    )


def _copy(ins: Instruction, values: dict[str, str], workdir: str, path: Path) -> CopyStep:
    if ins.flag("from") is not None:
        raise ConfigError(
            f"{path}:{ins.line}: {ins.keyword} --from is not supported without Docker"
        )
    if ins.exec_form is not None:
        words = [expand(w, values) for w in ins.exec_form]
    else:
        words = [expand(w, values) for w in ins.value.split()]
    if len(words) < 2:
        raise ConfigError(f"{path}:{ins.line}: {ins.keyword} needs a source and a destination")
    *sources, dest = words
    for src in sources:
        if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", src) or src.startswith("git@"):
            raise ConfigError(
                f"{path}:{ins.line}: ADD {src}: fetching URLs is not supported without Docker; download it in a RUN step"
            )
    trailing = dest.endswith("/")
    dest = posixpath.normpath(posixpath.join(workdir, dest)) + (
        "/" if trailing and dest != "/" else ""
    )
    return CopyStep(
        sources=tuple(sources),
        dest=dest,
        chown=ins.flag("chown"),
        chmod=ins.flag("chmod"),
        line=ins.line,
        extract=ins.keyword == "ADD",
    )


__all__ = [
    "DEFAULT_SHELL",
    "CopyStep",
    "Dockerfile",
    "Instruction",
    "Plan",
    "RunStep",
    "Step",
    "WorkdirStep",
    "expand",
    "parse_dockerfile",
    "parse_text",
]
