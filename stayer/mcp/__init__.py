"""MCP servers' tools for the agent (see ``docs/mcp.md``): ``config`` reads ``[mcp]``,
``client`` holds one connection, ``pipes`` runs a stdio server in the sandbox, ``tools``
turns the servers' tools into the agent's, ``lazy`` offers them through ``tool_search``,
``views`` gives each agent of a run (threads, sub-agents) its own view of them.
Importing this package imports no SDK."""
