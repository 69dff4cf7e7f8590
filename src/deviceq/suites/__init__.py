"""Suites: a list of tests split into shards (ordinary tasks) over the devices that match,
balanced on each test's past durations, with per-test results from the runs' JUnit files, an
ETA, failed tests retried on another device, or every test on every device."""
