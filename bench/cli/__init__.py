"""How long the ``deviceq`` command takes to start."""
