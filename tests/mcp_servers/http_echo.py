"""A streamable-HTTP MCP server on the official SDK (``python http_echo.py PORT``), listening
on 127.0.0.1:PORT/mcp, with one tool ``echo``: for the tests of HTTP servers' addresses
(tests/test_mcp_addresses.py), where no node server is installed."""

import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("http-echo")


@server.tool()
def echo(text: str) -> str:
    """Echo the text back."""
    return f"echo: {text}"


if __name__ == "__main__":
    server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
