"""Teams of agents that talk: a roster (``team.toml``), one thread per agent in one
shared workspace, messages and handoffs between them, and one budget tree over all."""
