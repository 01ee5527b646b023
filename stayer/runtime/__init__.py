"""The hosted runtime: ``stayer serve`` (an HTTP API) and ``stayer worker`` (runs runs).

Everything durable lives in the journal's database: the runtime adds two tables beside the
journal's (``db``: tenants with hashed API keys, and service runs with their queue state
and lease) and reads the journal for everything a run did (``events``). So any number of
API processes and workers on any number of machines share one PostgreSQL (``STAYER_DB``),
and one process with the embedded SQLite journal is the same code, not a toy mode.

Modules: ``db`` (tables and the queue), ``tenants`` (keys and dollar budgets), ``worker``
(claims runs, executes them through ``stayer.run``, honours cancel), ``events`` (journal
events as the public event stream), ``api`` (the FastAPI app), ``schemas`` (pydantic
request and response bodies).
"""
