"""Exceptions that cross layers. The CLI maps them to exit codes (DESIGN.md)."""


class ConfigError(ValueError):
    """Bad input from the user (exit 2). The message is one line naming the file, field or
    flag, and how to fix it."""


class BudgetExceeded(Exception):  # noqa: N818 - the public name (stayer.BudgetExceeded)
    """A call that cannot fit its budget: refused before anything was sent or billed."""


class JournalError(ConfigError):
    """A journal that cannot be used as asked: an unknown run, an unopenable database, a
    newer schema, a run held by another live process. One line, exit 2 in the CLI."""


class StoreUnavailable(JournalError):
    """The database did not answer (restarting, unreachable, out of connections). Nothing
    was written by the operation that raised it; try again later (the API answers 503)."""


class OrderlyStop(BaseException):  # noqa: N818 - a signal, like GeneratorExit
    """Raised through the agent loop by whoever runs it (the runtime) to stop a run at a
    clean point: a person's decision is awaited, or the run was cancelled. The journal
    writes what it has buffered before giving the run up, so the run can be resumed or
    closed with everything it did (a crash, by contrast, loses the buffer). A
    BaseException, so that no tool's or loop's error handling turns it into a result."""


class BudgetReached(OrderlyStop):
    """The next call does not fit the run's cap, and the run was asked to pause there
    (``GuardConfig.pause_at_cap``) rather than wrap up: raising the cap resumes it."""


class RunEnded(Exception):  # noqa: N818 - a control-flow signal, like StopIteration
    """The end of an agent run, raised by whoever decides it (the guard, the context
    policy, the model layer, a tool's submit) and caught in one place, ``Agent.run``.
    ``status`` and ``stop_reason`` are what the run's result reports."""

    status = ""

    def __init__(self, stop_reason: str, detail: str = "") -> None:
        super().__init__(detail or stop_reason)
        self.stop_reason = stop_reason
        self.detail = detail


class Submitted(RunEnded):
    """The agent called ``submit``: the task is done as far as it can tell."""

    status = "submitted"

    def __init__(self) -> None:
        super().__init__("submit")


class Stopped(RunEnded):
    """A limit ended the run (steps, tokens, wall time, cost, a breaker), or the wrap-up it
    began is over. The reason is the guard's."""

    status = "budget_exhausted"


class Failed(RunEnded):
    """The run cannot go on: the model failed past its retries and failover
    (``model_error``), or the pinned context alone exceeds ``--max-context``
    (``max_context``). The message is the error the result reports."""

    status = "error"
