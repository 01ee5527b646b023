"""Messages between a team's threads: posted by one, read by another at its next step.

A message's id is its sender's name and the sender's own count (``worker#2``), so a
thread replayed after a resume posts the same ids again and the bus keeps one copy. What a
receiver has read is its own business (its ``seen`` ids, rebuilt from its journal).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from stayer.records import Record


class TeamMessage(Record):
    id: str  # sender#n
    sender: str
    to: str
    content: str
    kind: str = "message"  # message, handoff (a brief that starts work), report (a thread's end)


class MessageBus:
    def __init__(self) -> None:
        self._messages: dict[str, TeamMessage] = {}  # in order of posting
        self._finished: set[str] = set()
        self._changed = asyncio.Event()

    def post(self, message: TeamMessage) -> bool:
        """False when a message of that id was posted already (a replayed send)."""
        if message.id in self._messages:
            return False
        self._messages[message.id] = message
        self.wake()
        return True

    def finish(self, name: str) -> None:
        """Thread ``name`` will say nothing more: whoever waits for it stops waiting."""
        self._finished.add(name)
        self.wake()

    def finished(self, name: str) -> bool:
        return name in self._finished

    def unread(self, to: str, seen: set[str], sender: str | None = None) -> list[TeamMessage]:
        return [
            m
            for m in self._messages.values()
            if m.to == to and m.id not in seen and (sender is None or m.sender == sender)
        ]

    async def wait(
        self,
        to: str,
        seen: set[str],
        sender: str | None,
        timeout: float,
        until: Callable[[], bool] = lambda: False,
    ) -> list[TeamMessage]:
        """The unread messages for ``to`` (from ``sender``), waiting up to ``timeout``
        seconds for one; at once when ``sender`` has finished or ``until()`` holds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            got = self.unread(to, seen, sender)
            if (
                got
                or (sender is not None and self.finished(sender))
                or until()
                or loop.time() >= deadline
            ):
                return got
            changed = self._changed
            # asyncio.timeout, not wait_for: on 3.11 wait_for loses the caller's cancellation
            # (a run's time limit) when the event is set at the same moment.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(deadline - loop.time()):
                    await changed.wait()

    def wake(self) -> None:
        """Every waiter looks again (something changed)."""
        # A fresh event per change, so that every waiter of the old one wakes and looks.
        self._changed.set()
        self._changed = asyncio.Event()
