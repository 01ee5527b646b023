"""Agent frameworks metered by stayer: each module hands the framework a client that
``stayer.meter`` wraps, or hooks its callback interface, so every model call it makes is
held against a ``stayer.Budget``, priced and on a ``stayer.Session``'s ledger. Each imports
its framework only when used (install ``stayer[integrations]``); docs/python.md says which
hook each uses and why.
"""
