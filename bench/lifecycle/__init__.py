"""What one task lifecycle (submit -> assign -> claim -> report) costs: per Lua transition,
per phase, per batch size, per Redis command and record, in valgrind-counted instructions, in
lifecycles per second, and in Redis memory per queued task and after retention."""
