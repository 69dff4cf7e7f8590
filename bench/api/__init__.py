"""The HTTP API's cost against talking to Redis directly, with the real daemons."""
