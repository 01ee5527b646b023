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
