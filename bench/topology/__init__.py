"""The real daemons on other Redis set-ups: a replica acknowledging every write (durable mode)
and Redis Cluster shards."""
