"""The provider simulator as an HTTP server (``stayer sim serve``): wire formats in
``wire``, the Starlette app in ``app``."""
