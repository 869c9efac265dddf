"""The scheduler source: off-CPU time of GPU processes, read by eBPF or from /proc."""
