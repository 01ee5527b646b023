"""One metering core for every door: a provider call's request read as a ``ModelRequest``
(``requests``), its usage read from the response or its stream (``usage``), and the call
priced, reserved and settled against budgets (``meter``)."""
