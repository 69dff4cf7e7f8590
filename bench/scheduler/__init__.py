"""The scheduler's assignment cost against queue length, fleet size and constraint signatures
(``assign``), and the ``fair_share`` policy's cost against plain ``fifo_match`` (``policy``)."""
