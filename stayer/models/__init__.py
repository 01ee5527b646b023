"""The model protocol and its request / response types (``stayer.models.base``), re-exported
here on first use: a command that only reads cache rules or prices
(``stayer.models.caching``) does not import the message types with them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stayer.models.base import (
        ConfigError,
        Message,
        Model,
        ModelError,
        ModelRequest,
        ModelResponse,
        ToolCall,
        ToolSpec,
    )

__all__ = [
    "ConfigError",
    "Message",
    "Model",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "ToolCall",
    "ToolSpec",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from stayer.models import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
