"""Hardware counter captures: rocprofv3 counter collection and rocprof-compute workloads (docs/counters.md)."""
