"""Claude Code transcripts: ``~/.claude/projects/<project>/<session>.jsonl``.

Details and rationale: docs/notes.md, ``stayer/audit/claude_code.py``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Annotated, Any, BinaryIO

import msgspec

from stayer.audit.calls import (
    MAIN_CHAIN,
    Call,
    ImportedSession,
    LogFile,
    SessionRef,
    json_object,
    open_log,
    open_session_log,
    parse_ts,
)
from stayer.usage import Usage

_CHUNK = 1 << 22  # read and decoded at once: whole lines, bounded memory
_SESSION_ID = re.compile(rb'"sessionId":"([^"]+)"')


class _Message(msgspec.Struct, gc=False):
    """The fields of ``message`` read here; any JSON value each (``None`` when absent)."""

    id: Any = None
    model: Any = None
    usage: Any = None


class _Line(msgspec.Struct, gc=False):
    """The fields of a transcript line read here; any JSON value each (``None`` when absent)."""

    type: Any = None
    subtype: Any = None
    isSidechain: Any = None
    isCompactSummary: Any = None
    agentId: Any = None
    uuid: Any = None
    parentUuid: Any = None
    timestamp: Any = None
    requestId: Any = None
    sessionId: Any = None
    message: _Message | None = None


_LINE = msgspec.json.Decoder(_Line)

# The usual shape, decoded first: ``message.usage`` as a struct whose token counts are
# non-negative integers (what ``_entry`` accepts) and with no ``output_tokens_details``
# (which ``Usage.from_anthropic`` reads). A line of any other shape fails to decode here
# and is read as a ``_Line``, so this shape changes only how fast a line is read.

_Count = Annotated[int, msgspec.Meta(ge=0)]


class _Split(msgspec.Struct, gc=False):
    """``usage.cache_creation``: the cache writes by lifetime."""

    ephemeral_5m_input_tokens: int | None = None
    ephemeral_1h_input_tokens: int | None = None


class _Usage(msgspec.Struct, gc=False):
    input_tokens: _Count | None = None
    output_tokens: _Count | None = None
    cache_creation_input_tokens: _Count | None = None
    cache_read_input_tokens: _Count | None = None
    cache_creation: _Split | None = None
    output_tokens_details: None = None
    service_tier: Any = None
    speed: Any = None


class _UsualMessage(_Message, gc=False):
    usage: _Usage | None = None


class _UsualLine(_Line, gc=False):
    """``_Line`` with ``message.usage`` of the usual shape."""

    message: _UsualMessage | None = None


_USUAL = msgspec.json.Decoder(_UsualLine)


def _decode(line: bytes, out: ImportedSession) -> _Line | None:
    """The line's fields; None, counted in ``out.skipped_lines``, when it is not a JSON object."""
    try:
        return _LINE.decode(line)
    except msgspec.DecodeError:  # not the usual shape (or not JSON): read it as plain JSON
        pass
    d = json_object(line, out)
    if d is None:
        return None
    m = d.get("message")
    fields = {k: d.get(k) for k in _Line.__struct_fields__ if k != "message"}
    message = _Message(m.get("id"), m.get("model"), m.get("usage")) if type(m) is dict else None
    return _Line(**fields, message=message)


class _Entry(msgspec.Struct, gc=False):
    """One usage-bearing line, before deduplication (a Struct: one is made per usage line,
    and a Struct is made several times faster than a dataclass instance)."""

    ts: float
    model: str
    usage: _Usage | dict[str, Any]  # the usual shape, or any other (a dict)
    total: int  # all four token counts: the larger of two repeats is the complete one
    chain: str
    sidechain: bool
    compacted: bool
    message_id: str | None
    request_id: str | None
    session_id: str
    speed: Any  # usage.speed


_TOKEN_KEYS = (
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
)


class _Dedup:
    """ccusage's rule for repeated entries of one API response (see module docstring)."""

    def __init__(self) -> None:
        self.kept: list[_Entry] = []
        self._exact: dict[tuple[str, str | None, str], int] = {}
        self._by_message: dict[tuple[str, str], list[int]] = {}

    def add(self, e: _Entry) -> None:
        kept, mid = self.kept, e.message_id
        if mid is None:
            kept.append(e)
            return
        key = (mid, e.request_id, e.session_id)
        index = self._exact.get(key)
        if index is None:
            message = (mid, e.session_id)
            same = self._by_message.get(message)
            if same is not None:
                for j in same:
                    other = kept[j]
                    if other.ts == e.ts and (e.sidechain or other.sidechain):
                        index = j
                        break
            self._exact[key] = len(kept) if index is None else index
            if index is None:  # a response not seen before (the common case)
                if same is None:
                    self._by_message[message] = [len(kept)]
                else:
                    same.append(len(kept))
                kept.append(e)
                return
        old = kept[index]
        if _replaces(e, old):
            e.compacted = e.compacted or old.compacted
            kept[index] = e
        elif e.compacted:
            old.compacted = True


def _replaces(new: _Entry, old: _Entry) -> bool:
    if new.sidechain != old.sidechain:
        return old.sidechain
    a, b = new.total, old.total
    if a != b:
        return a > b
    return new.speed is not None and old.speed is None


def _layout(path: str) -> tuple[str, str | None, bool]:
    """(project, session id if the path says it, is a sub-agent file). Otherwise the session
    is the first ``sessionId`` the file holds: a transcript's name is its session id, but a
    copied or renamed one — or a sub-agent's ``agent-<id>.jsonl`` — is known by its entries."""
    parent, name = os.path.split(path)
    grandparent, parent_name = os.path.split(parent)
    if parent_name == "subagents":  # <project>/<session>/subagents/agent-<id>.jsonl
        project_dir, session = os.path.split(grandparent)
        return os.path.basename(project_dir), session, True
    return parent_name, None, name.startswith("agent-")


class ClaudeCodeImporter:
    """Reads Claude Code session transcripts (see module docstring)."""

    source = "claude-code"

    def sniff(self, name: str, head: bytes) -> bool:
        return (
            name.endswith(".jsonl")
            and (b'"sessionId"' in head or b'"leafUuid"' in head)
            and b'"session_meta"' not in head
        )

    def group(self, files: Sequence[LogFile]) -> Iterable[SessionRef]:
        sessions: dict[tuple[str, str], list[tuple[bool, str, int]]] = {}
        for f in files:
            project, session, agent = _layout(f.path)
            if session is None:
                m = _SESSION_ID.search(f.head) or _SESSION_ID.search(_read_head(f.path, 1 << 16))
                session = m.group(1).decode() if m else f.name.removesuffix(".jsonl")
            sessions.setdefault((project, session), []).append((agent, f.path, f.size))
        for (project, session), members in sessions.items():
            members.sort()  # the session's own file first, then its sub-agents by name
            yield SessionRef(
                self.source,
                session,
                project,
                tuple(p for _, p, _ in members),
                sum(s for _, _, s in members),
            )

    def read(self, ref: SessionRef) -> ImportedSession:
        out = ImportedSession(self.source, ref.id, ref.project)
        dedup = _Dedup()
        for path in ref.paths:
            out.bytes += self._read_file(path, ref, dedup, out)
        calls = out.calls
        for e in dedup.kept:
            u = e.usage
            if type(u) is dict:  # another shape
                try:
                    usage = Usage.from_anthropic(u)
                except (TypeError, ValueError):  # a count that is no number: not a call
                    out.skipped_lines += 1
                    continue
                tier = u.get("service_tier")
            else:
                assert isinstance(u, _Usage)
                usage = _usual_usage(u)
                tier = u.service_tier
            if e.speed == "fast":
                tier = "fast"
            calls.append(
                Call(
                    e.ts,
                    e.model,
                    usage,
                    e.chain,
                    "anthropic",
                    tier if isinstance(tier, str) else None,
                    e.compacted,
                )
            )
        return out

    def _read_file(self, path: str, ref: SessionRef, dedup: _Dedup, out: ImportedSession) -> int:
        _, _, agent_file = _layout(path)
        name = os.path.basename(path).removesuffix(".jsonl")  # (every transcript's suffix)
        chain = name.removeprefix("agent-") if agent_file else None
        lines = _FileLines(ref.id, chain, dedup, out)
        size = 0
        opened = open_session_log(path, out, buffering=0)
        if opened is None:
            return 0
        f, st = opened
        with f:
            for chunk in _chunks(f, st.st_size):
                size += len(chunk)
                decoded: Sequence[_UsualLine | _Line]
                try:
                    decoded = _USUAL.decode_lines(chunk)
                except msgspec.DecodeError:  # a line of another shape, or not JSON: one by one
                    decoded = _each_line(chunk, out)
                lines.take(decoded)
        return size


def _chunks(f: BinaryIO, size: int) -> Iterator[bytes]:
    """The file's bytes in pieces of whole lines (the last one's may lack its newline), so
    that what is held does not grow with the file. A file of ``size`` up to a piece (most
    transcripts) is read whole, in one read of its own size: reading it as a piece of
    ``_CHUNK`` bytes costs three times as long (a buffer of that size, then copies)."""
    if size <= _CHUNK:
        if whole := f.read():  # to its end, should it have grown since
            yield whole
        return
    parts: list[bytes] = []
    while block := f.read(_CHUNK):
        cut = block.rfind(b"\n") + 1
        if cut == 0:  # no line ends in it: part of a longer line
            parts.append(block)
            continue
        parts.append(block[:cut])
        yield b"".join(parts)
        parts = [block[cut:]]
    if parts and parts[0]:
        yield b"".join(parts)


def _each_line(chunk: bytes, out: ImportedSession) -> list[_UsualLine | _Line]:
    """The lines of ``chunk`` decoded one by one: those that are not JSON objects are
    counted in ``out.skipped_lines``, blank ones are passed over."""
    decoded: list[_UsualLine | _Line] = []
    for line in chunk.split(b"\n"):
        if not line.strip():
            continue
        try:
            decoded.append(_USUAL.decode(line))
        except msgspec.DecodeError:  # another shape, or not JSON: see _decode
            d = _decode(line, out)
            if d is not None:
                decoded.append(d)
    return decoded


class _FileLines:
    """What one file's lines mean, taken in order: its calls (into the session's
    deduplication), the chain each belongs to and where a chain was compacted."""

    def __init__(
        self, session: str, file_chain: str | None, dedup: _Dedup, out: ImportedSession
    ) -> None:
        self.session = session  # the session id of entries that name none
        self.file_chain = file_chain  # a sub-agent's own file: the chain of all its entries
        self.dedup = dedup
        self.out = out
        self.roots: dict[str, str] = {}  # sidechain entry uuid -> uuid of its chain's first
        self.compaction: set[str] = set()  # chains with a compaction since their last call

    def take(self, decoded: Sequence[_UsualLine | _Line]) -> None:
        usual_usage, entry_of, parse, add = _Usage, _Entry, parse_ts, self.dedup.add
        compaction, session, file_chain, roots = (
            self.compaction,
            self.session,
            self.file_chain,
            self.roots,
        )
        skipped = 0
        for d in decoded:
            if d.isSidechain is not True:
                sidechain, chain = False, MAIN_CHAIN
            else:
                sidechain, agent = True, d.agentId
                if type(agent) is str and agent:
                    chain = agent
                elif file_chain is not None:  # a sub-agent's own file
                    chain = file_chain
                else:
                    # A sidechain entry of the session's own file that names no agent: the
                    # sub-agent is the root of its parentUuid chain (here, not in a method:
                    # most lines of older transcripts are such entries).
                    uuid, parent = d.uuid, d.parentUuid
                    root = roots.get(parent, parent) if type(parent) is str else uuid
                    if type(root) is str:
                        if type(uuid) is str:
                            roots[uuid] = root
                        chain = root[:8]
                    else:
                        chain = "sidechain"
            msg = d.message
            usage = msg.usage if msg is not None else None
            if type(usage) is usual_usage:
                # the usual shape: its counts are non-negative integers (or absent)
                ts = parse(d.timestamp)
                model = msg.model  # type: ignore[union-attr]
                if ts is None or type(model) is not str or not model:
                    skipped += 1
                    continue
                mid, rid, sid = msg.id, d.requestId, d.sessionId  # type: ignore[union-attr]
                entry = entry_of(
                    ts,
                    model,
                    usage,
                    (usage.input_tokens or 0)
                    + (usage.output_tokens or 0)
                    + (usage.cache_creation_input_tokens or 0)
                    + (usage.cache_read_input_tokens or 0),
                    chain,
                    sidechain,
                    chain in compaction,
                    mid if type(mid) is str and mid else None,
                    rid if type(rid) is str and rid else None,
                    sid if type(sid) is str and sid else session,
                    usage.speed,
                )
            elif type(usage) is dict:  # another shape
                assert msg is not None
                general = self._entry(d, msg, usage, chain, sidechain)
                if general is None:
                    skipped += 1
                    continue
                entry = general
            else:
                if (
                    d.type == "summary"
                    or d.subtype == "compact_boundary"
                    or d.isCompactSummary is True
                ):
                    compaction.add(chain)
                continue
            if entry.model == "<synthetic>":
                continue  # Claude Code's own notices (errors, interruptions): no API call
            if compaction:
                compaction.discard(chain)
            add(entry)
        self.out.skipped_lines += skipped

    def _entry(
        self,
        d: _UsualLine | _Line,
        msg: _UsualMessage | _Message,
        usage: dict[str, Any],
        chain: str,
        sidechain: bool,
    ) -> _Entry | None:
        """The entry of a usage of another shape than the usual one; None if it is not one."""
        ts = parse_ts(d.timestamp)
        model = msg.model
        if ts is None or type(model) is not str or not model:
            return None
        total = 0
        for k in _TOKEN_KEYS:
            v = usage.get(k)
            if v is None:
                continue
            if type(v) is not int or v < 0:
                return None
            total += v
        mid, rid, sid = msg.id, d.requestId, d.sessionId
        return _Entry(
            ts,
            model,
            usage,
            total,
            chain,
            sidechain,
            chain in self.compaction,
            mid if type(mid) is str and mid else None,
            rid if type(rid) is str and rid else None,
            sid if type(sid) is str and sid else self.session,
            usage.get("speed"),
        )


def _read_head(path: str, n: int) -> bytes:
    opened = open_log(path, buffering=0)
    if opened is None:
        return b""
    with opened[0] as f:
        try:
            return f.read(n)
        except OSError:
            return b""


def _usual_usage(u: _Usage) -> Usage:
    """``Usage.from_anthropic`` of a usage of the usual shape (the same arithmetic)."""
    written = u.cache_creation_input_tokens or 0
    read = u.cache_read_input_tokens or 0
    w5m, w1h = written, 0
    split = u.cache_creation
    if split is not None:  # an empty or unrelated split leaves every write at 5 m, as there
        w1h = split.ephemeral_1h_input_tokens or 0
        w5m = split.ephemeral_5m_input_tokens or 0
        if w5m + w1h != written:
            w5m = written - w1h
    return Usage((u.input_tokens or 0) + read + written, read, w5m, w1h, u.output_tokens or 0, 0)
