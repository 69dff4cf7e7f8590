"""Fleet-scale cost of the scheduler and the host daemon (``python -m bench.fleet``): assignment
passes on fleets up to 100,000 devices, the longest script calls, heartbeats, device utilization
with the real daemons, a lab's day in miniature, and the host daemon's CPU per task."""
