"""Helpers shared by the benchmarks of every subject (nothing here runs on its own): private
redis-servers, command and CPU deltas, tables (`common`); the processes and temporary folders
of a run (`procs`); a measured server's INFO probe (`redisstats`); the drain measurement
(`drain`); deviceq's real daemons on a fresh server (`deviceq_daemons`) and their goal runners
(`runners`); the in-process fleet of the assignment benchmarks (`assignment`); the overlap-proving
runner command (`runlog`)."""
