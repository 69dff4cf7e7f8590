"""The real daemons under real faults (SIGKILL, restarts, a Redis restart), then the books
checked: no lost, duplicated or overlapping run."""
