"""Exceptions that cross layers. The CLI maps them to exit codes (DESIGN.md)."""


class ConfigError(ValueError):
    """Bad input from the user (exit 2). The message is one line naming the file, field or
    flag, and how to fix it."""


class OrderlyStop(BaseException):  # noqa: N818 - a signal, like GeneratorExit
    """Raised through the agent loop by whoever runs it (the runtime) to stop a run at a
    clean point: a person's decision is awaited, or the run was cancelled. The journal
    writes what it has buffered before giving the run up, so the run can be resumed or
    closed with everything it did (a crash, by contrast, loses the buffer). A
    BaseException, so that no tool's or loop's error handling turns it into a result."""


class BudgetReached(OrderlyStop):
    """The next call does not fit the run's cap, and the run was asked to pause there
    (``GuardConfig.pause_at_cap``) rather than wrap up: raising the cap resumes it."""
