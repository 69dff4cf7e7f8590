"""The shared core every role builds on: the models and their validation (``models``), the
Redis key layout (``keys``), the Lua transitions (``scripts``), pool and client settings
(``config``), typed errors (``errors``), one pool on one connection (``connection``), the
event stream (``events``), log lines (``logs``) and the host liveness rule (``liveness``);
and the package's version, `VERSION` (``deviceq.__version__``)."""

VERSION = "0.1.0"
