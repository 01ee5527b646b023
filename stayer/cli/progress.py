"""Progress of long work (``stayer eval``): a live bar on a terminal, plain lines in a log.

Without a terminal (CI, ``nohup``, a pipe) a bar is either invisible or a mess of control
characters; a plain line every few seconds — done/total, ETA, running cost — is what a
person reading the log later needs.
"""

from __future__ import annotations

import threading
import time
from decimal import Decimal
from types import TracebackType
from typing import TYPE_CHECKING, Any

from stayer.cli.common import usd
from stayer.money import Usd

if TYPE_CHECKING:
    from rich.console import Console

# Seconds between plain lines; a line is also printed when the work ends.
PLAIN_INTERVAL_S = 5.0


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class WorkProgress:
    """Counts finished items and their cost; shows it as a bar or as plain lines."""

    def __init__(
        self, console: Console, label: str, total: int, *, interval_s: float = PLAIN_INTERVAL_S
    ) -> None:
        self.console, self.label, self.total, self.interval_s = console, label, total, interval_s
        self.done = 0
        self.reused = 0  # finished before this process started (resumed from --out)
        self.cost: Decimal | None = Decimal(0)  # None once a cost is unknown
        self.counts = ""
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._bar: Any = None  # a rich Progress once shown (rich.progress is imported then)
        self._bar_task: Any = None

    # --- what the work reports --------------------------------------------------------

    def advance(self, cost_usd: str | None, counts: str, reused: bool = False) -> None:
        with self._lock:
            self.done += 1
            self.reused += reused
            self.counts = counts
            if not reused and self.cost is not None:
                self.cost = (Usd(self.cost) + Usd.parse(cost_usd)).amount
        if self._bar is not None:
            from rich.markup import escape

            self._bar.update(self._bar_task, advance=1, description=escape(self.status()))

    # --- what people see ---------------------------------------------------------------

    def eta(self) -> str:
        """From this process's own pace: trials reused from --out took no time."""
        ran = self.done - self.reused
        left = self.total - self.done
        if left == 0:
            return "0s"
        if ran == 0:
            return "—"
        return duration((time.monotonic() - self.started) / ran * left)

    def status(self) -> str:
        return f"{self.counts} · {usd(self.cost)} so far"

    def line(self) -> str:
        with self._lock:
            return (
                f"{self.label}: {self.done}/{self.total} done · {self.status()} · "
                f"{duration(time.monotonic() - self.started)} elapsed · ETA {self.eta()}"
            )

    def _tick(self) -> None:
        from rich.markup import escape

        while not self._stop.wait(self.interval_s):
            self.console.print(escape(self.line()), highlight=False, soft_wrap=True)

    def __enter__(self) -> WorkProgress:
        if self.console.is_terminal:
            from rich.markup import escape
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(
                TextColumn(f"[bold]{escape(self.label)}[/]"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                TextColumn("{task.description}"),
                console=self.console,
                transient=False,
            )
            self._bar.__enter__()
            self._bar_task = self._bar.add_task("", total=self.total)
        else:
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.__exit__(kind, exc, tb)
            return
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        from rich.markup import escape

        self.console.print(escape(self.line()), highlight=False, soft_wrap=True)
