"""The usage block LiteLLM attaches to a response (OpenAI's Chat Completions shape, plus
Anthropic's cache fields), as mini-swe-agent and OpenHands log it.

``prompt_tokens`` includes cache reads and, for Anthropic models, cache writes (checked on
the OpenHands corpus: ``prompt = uncached + cache_read_input_tokens +
cache_creation_input_tokens``); a log where it is smaller than reads plus writes left the
writes out, and they are added. ``completion_tokens`` includes reasoning.
"""

from __future__ import annotations

import msgspec

from stayer.audit.calls import ImportedSession
from stayer.usage import Usage


class _PromptDetails(msgspec.Struct):
    cached_tokens: int | None = None


class _CompletionDetails(msgspec.Struct):
    reasoning_tokens: int | None = None


class LiteLLMUsage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: _PromptDetails | None = None
    completion_tokens_details: _CompletionDetails | None = None
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None

    def to_usage(self) -> Usage | None:
        """The normalised usage; None when the counts are inconsistent (negative, or more
        reads than prompt)."""
        prompt = self.prompt_tokens or 0
        read = self.cache_read_input_tokens
        if read is None and self.prompt_tokens_details is not None:
            read = self.prompt_tokens_details.cached_tokens
        read = read or 0
        written = self.cache_creation_input_tokens or 0
        output = self.completion_tokens or 0
        details = self.completion_tokens_details
        reasoning = (details.reasoning_tokens or 0) if details is not None else 0
        if min(prompt, read, written, output, reasoning) < 0 or reasoning > output:
            return None
        if prompt < read + written:
            prompt += written  # writes left out of prompt_tokens
        if prompt < read + written:
            return None
        return Usage(
            input_tokens=prompt,
            cache_read_tokens=read,
            cache_write_5m_tokens=written,
            output_tokens=output,
            reasoning_tokens=reasoning,
        )


class LiteLLMResponse(msgspec.Struct):
    """The response LiteLLM logs with its usage: which call, of which model, when."""

    id: str | None = None
    model: str | None = None
    created: float | None = None
    usage: LiteLLMUsage | None = None
    service_tier: str | None = None


class Responses:
    """The responses of one session's log, each a call once: by its id (one without an id
    every time it stands)."""

    def __init__(self, out: ImportedSession) -> None:
        self.out = out
        self.seen: set[str] = set()

    def usage(self, response: LiteLLMResponse | None) -> Usage | None:
        """The usage of ``response`` where it is a call not seen before; None where it is
        none, a repeat, or has counts that do not add up (then counted as a skipped line)."""
        if response is None or response.usage is None:
            return None
        if response.id:
            if response.id in self.seen:
                return None
            self.seen.add(response.id)
        usage = response.usage.to_usage()
        if usage is None:
            self.out.skipped_lines += 1
        return usage
