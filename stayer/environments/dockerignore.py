"""The build context as Docker sends it: ``.dockerignore`` read and applied, links never
followed.

Both builders use it: Docker's for the image's content hash, the Docker-free one for
what ``COPY`` sees and for the layer cache's keys. The rules are Docker's documented ones
(moby's ``patternmatcher``/``ignorefile``): one pattern a line, ``#`` comments, paths
cleaned as Go's ``filepath.Clean``, ``filepath.Match`` syntax plus ``**``, a pattern
excludes a path or any of its parents, ``!`` re-includes, the last matching line decides;
``.dockerignore`` and ``Dockerfile`` are read when excluded but never sent.

The rules line by line: ``docs/internals.md#environments-dockerignore``.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from stayer.errors import ConfigError
from stayer.workspace.hostfs import content_digest, copy_contents

IGNORE_FILE = ".dockerignore"
# What the builder reads whether or not the context's patterns exclude it.
BUILDER_FILES = ("Dockerfile", IGNORE_FILE)


@dataclass(frozen=True)
class Pattern:
    text: str  # cleaned, without its "!"
    exception: bool
    regex: re.Pattern[str]

    def matches(self, rel: str) -> bool:
        """Whether the pattern matches ``rel`` or one of its parent directories."""
        if self.regex.match(rel):
            return True
        parts = rel.split("/")
        return any(self.regex.match("/".join(parts[:i])) for i in range(1, len(parts)))


@dataclass(frozen=True)
class Rules:
    """A ``.dockerignore``'s patterns, in order."""

    patterns: tuple[Pattern, ...] = ()

    @property
    def exceptions(self) -> bool:
        return any(p.exception for p in self.patterns)

    def excluded(self, rel: str) -> bool:
        """Whether ``rel`` (relative to the context, ``/``-separated) is left out."""
        out = False
        for pattern in self.patterns:
            # Only a pattern that would change the answer needs to be tried.
            if pattern.exception == out and pattern.matches(rel):
                out = not pattern.exception
        return out


def parse(text: str, where: str = IGNORE_FILE) -> Rules:
    """The rules of a ``.dockerignore``'s ``text``; ConfigError naming ``where`` and the
    line for a pattern Docker refuses (a bare ``!``, an unterminated ``[``, a trailing
    ``\\``)."""
    patterns = []
    for number, line in enumerate(text.removeprefix("\ufeff").splitlines(), 1):
        if line.startswith("#"):
            continue
        line = line.strip()
        if not line:
            continue
        exception = line.startswith("!")
        if exception:
            line = line[1:].strip()
            if not line:
                raise ConfigError(f'{where}:{number}: illegal exclusion pattern: "!"')
        cleaned = posixpath.normpath(line)
        if cleaned.startswith("//"):  # normpath keeps two leading slashes
            cleaned = cleaned.lstrip("/") or "/"
        if len(cleaned) > 1 and cleaned.startswith("/"):
            cleaned = cleaned[1:]
        try:
            regex = compile_pattern(cleaned)
        except ValueError as e:
            raise ConfigError(f"{where}:{number}: {line!r}: {e}") from e
        patterns.append(Pattern(cleaned, exception, regex))
    return Rules(tuple(patterns))


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """``pattern`` (Go's ``filepath.Match`` syntax plus ``**``) as a regular expression
    matching a whole ``/``-separated path. ValueError for a malformed pattern."""
    out = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            if pattern.startswith("**", i):
                i += 2
                if pattern.startswith("/", i):
                    i += 1
                # "**" at the end matches anything; elsewhere any number of directories.
                out.append(".*" if i == n else "(?:.*/)?")
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "\\":
            if i + 1 == n:
                raise ValueError("syntax error in pattern: a trailing \\")
            i += 1
            out.append(re.escape(pattern[i]))
        elif c == "[":
            end, cls = _class(pattern, i)
            out.append(cls)
            i = end
            continue
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z")


def _class(pattern: str, start: int) -> tuple[int, str]:
    """The class ``[...]`` at ``start``: where it ends, and it as a regular expression."""
    i = start + 1
    negate = i < len(pattern) and pattern[i] == "^"
    if negate:
        i += 1
    items = []
    first = True
    while True:
        if i >= len(pattern):
            raise ValueError("syntax error in pattern: unterminated [")
        if pattern[i] == "]" and not first:
            break
        lo, i = _class_char(pattern, i)
        if i < len(pattern) and pattern[i] == "-":
            hi, i = _class_char(pattern, i + 1)
            if hi < lo:
                raise ValueError(f"syntax error in pattern: range {lo}-{hi} runs backwards")
            items.append(f"{re.escape(lo)}-{re.escape(hi)}")
        else:
            items.append(re.escape(lo))
        first = False
    body = "".join(items)
    # A class never matches the separator, negated or not (filepath.Match).
    return i + 1, f"[^/{body}]" if negate else f"(?!/)[{body}]"


def _class_char(pattern: str, i: int) -> tuple[str, int]:
    if i >= len(pattern) or pattern[i] in "-]":
        raise ValueError("syntax error in pattern: bad character class")
    if pattern[i] == "\\":
        i += 1
        if i >= len(pattern):
            raise ValueError("syntax error in pattern: unterminated [")
    return pattern[i], i + 1


def read_rules(context: Path) -> Rules:
    """The rules of ``context``/.dockerignore (none where there is no such file). The
    file is read without following a link: ConfigError for one, as for unreadable text."""
    path = context / IGNORE_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return Rules()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read (a link is not followed): {e.strerror}") from e
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"{path}: not a regular file")
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read()
    finally:
        os.close(fd)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text: {e}") from e
    return parse(text, str(path))


# What an entry of the context is.
FILE, DIR, LINK, OTHER = "file", "dir", "link", "other"


@dataclass(frozen=True)
class BuildContext:
    """The files of a build context that Docker would send, walked once: by relative
    path, what each is. Directories that hold only re-included entries are there too
    (their children need them). Nothing under a link is walked."""

    root: Path
    entries: dict[str, str]  # rel → FILE, DIR, LINK or OTHER; sorted as the walk found them
    complete: bool  # True when nothing was left out
    rules: Rules = field(default_factory=Rules)

    def under(self, rel: str) -> list[str]:
        """``rel`` itself and everything below it (``"."``: everything), sorted."""
        if rel == ".":
            return list(self.entries)
        prefix = rel + "/"
        return [r for r in self.entries if r == rel or r.startswith(prefix)]

    def glob(self, pattern: str) -> list[str]:
        """The entries matching ``pattern`` (``COPY``'s wildcards: ``*`` and ``?`` stop at
        ``/``, ``*`` matches a leading dot as in Docker), sorted."""
        regex = compile_pattern(pattern)
        return sorted(r for r in self.entries if regex.match(r))

    def tree_digest(self, rel: str = ".") -> str:
        """What :func:`stayer.workspace.hostfs.tree_digest` is of ``rel`` (a directory),
        over the entries sent only: names relative to it and contents of its regular
        files, links left out. Equal to it where nothing is excluded."""
        h = hashlib.sha256()
        names = [r for r in self.under(rel) if self.entries[r] == FILE and r != rel]
        base = "" if rel == "." else rel + "/"
        for r in sorted(names, key=lambda r: r.split("/")):
            h.update(os.fsencode(r[len(base) :]) + b"\0")
            h.update(file_digest(self.root / r))
        return h.hexdigest()

    def image_digest(self) -> str:
        """The content hash of the image built from this context: what is sent, and the
        builder's own files (Dockerfile, .dockerignore) when the rules exclude them."""
        digest = self.tree_digest()
        if self.complete:
            return digest  # as before .dockerignore counted: caches stay valid
        h = hashlib.sha256(digest.encode())
        for name in BUILDER_FILES:
            path = self.root / name
            if name not in self.entries and _regular(path):
                h.update(b"\0" + name.encode() + b"\0" + file_digest(path))
        return h.hexdigest()


def walk(context: Path, rules: Rules | None = None) -> BuildContext:
    """``context``'s entries that ``rules`` (default: its ``.dockerignore``'s) keep. An
    excluded directory is walked only where an exception could re-include something
    below it."""
    context = Path(context)
    rules = read_rules(context) if rules is None else rules
    entries: dict[str, str] = {}
    complete = True

    def visit(directory: Path, prefix: str) -> bool:
        """Walk one directory; whether anything below it was kept."""
        nonlocal complete
        kept = False
        with os.scandir(directory) as it:
            children = sorted(it, key=lambda e: e.name)
        for entry in children:
            rel = prefix + entry.name
            out = rules.excluded(rel)
            mode = entry.stat(follow_symlinks=False).st_mode
            kind = (
                DIR
                if stat.S_ISDIR(mode)
                else FILE
                if stat.S_ISREG(mode)
                else LINK
                if stat.S_ISLNK(mode)
                else OTHER
            )
            if out:
                complete = False
            if kind == DIR and (not out or rules.exceptions):
                mark = len(entries)
                entries[rel] = DIR
                below = visit(Path(entry.path), rel + "/")
                if out and not below:
                    # Nothing re-included below: the directory is not sent.
                    for key in list(entries)[mark:]:
                        del entries[key]
                    continue
                kept = True
            elif not out:
                entries[rel] = kind
                kept = True
        return kept

    visit(context, "")
    return BuildContext(context, entries, complete, rules)


def stage(context: BuildContext, dest: Path) -> None:
    """Copy what ``context`` sends into the new directory ``dest``: regular files (content,
    mode, times), directories, links as links; never through a link, nothing else."""
    os.mkdir(dest, 0o700)
    dirs = []
    for rel, kind in context.entries.items():
        src, dst = context.root / rel, dest / rel
        if kind == DIR:
            os.mkdir(dst, 0o700)
            dirs.append(rel)
        elif kind == FILE:
            fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                st = os.fstat(fd)
                out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                try:
                    copy_contents(fd, out, st)
                    os.fchmod(out, stat.S_IMODE(st.st_mode) & 0o777)
                finally:
                    os.close(out)
            finally:
                os.close(fd)
            os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
        elif kind == LINK:
            os.symlink(os.readlink(src), dst)
    for rel in reversed(dirs):  # deepest first: a read-only directory last
        st = os.lstat(context.root / rel)
        os.chmod(dest / rel, stat.S_IMODE(st.st_mode) & 0o777)
        os.utime(dest / rel, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)


def file_digest(path: Path) -> bytes:
    """SHA-256 of a regular file's content, opened without following a link."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        return content_digest(fd, os.fstat(fd))
    finally:
        os.close(fd)


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


__all__ = [
    "BUILDER_FILES",
    "IGNORE_FILE",
    "BuildContext",
    "Pattern",
    "Rules",
    "compile_pattern",
    "parse",
    "read_rules",
    "stage",
    "walk",
]
