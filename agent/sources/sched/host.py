"""Whether this host can run the eBPF scheduler backend: privileges, bcc, kernel headers, tracepoints."""

from __future__ import annotations

import os
from pathlib import Path

from aaco.agent.sources.sched.btf import task_layout

TRACEPOINTS = (
    "sched/sched_switch",
    "sched/sched_wakeup",
    "sched/sched_wakeup_new",
    "sched/sched_process_exit",
    "exceptions/page_fault_user",
    "task/task_newtask",
    "sched/sched_process_exec",
)
TRACEFS_DIRS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))


def tracefs() -> Path | None:
    """Where tracefs is mounted (bcc reads tracepoint formats there), or None."""
    return next((d for d in TRACEFS_DIRS if (d / "events" / "sched" / "sched_switch").is_dir()), None)


def _capabilities() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


def privilege_problem() -> str | None:
    """Why this process may not load BPF programs (None: root, or CAP_SYS_ADMIN, or CAP_BPF + CAP_PERFMON)."""
    if os.geteuid() == 0:
        return None
    caps = _capabilities()
    sys_admin, perfmon, bpf = 1 << 21, 1 << 38, 1 << 39
    if caps & sys_admin or (caps & perfmon and caps & bpf):
        return None
    return f"eBPF needs root (or CAP_BPF and CAP_PERFMON); this agent runs as uid {os.geteuid()} without them"


def unavailable_reason() -> str | None:
    """The first reason the eBPF backend cannot run here, or None when it can be tried."""
    problem = privilege_problem()
    if problem:
        return problem
    try:
        import bcc  # noqa: F401
    except ImportError as exc:
        return (
            f"bcc is not importable ({exc}); install Debian's python3-bpfcc and run .ci/setup "
            "(the PyPI package named bcc is unrelated)"
        )
    except Exception as exc:  # libbcc present but broken
        return f"bcc failed to load: {type(exc).__name__}: {exc}"
    release = os.uname().release
    if not (Path("/lib/modules") / release / "build").exists() and not Path("/sys/kernel/kheaders.tar.xz").exists():
        return (
            f"no kernel headers for {release}: /lib/modules/{release}/build is missing "
            "(install linux-headers and link it, as .ci/setup does)"
        )
    if task_layout() is not None:
        return None  # raw tracepoints: no tracefs needed
    if tracefs() is None:
        return "tracefs is not mounted (mount -t tracefs nodev /sys/kernel/tracing) and the kernel has no usable BTF"
    missing = [tp for tp in TRACEPOINTS if not (tracefs() / "events" / tp).is_dir()]  # type: ignore[operator]
    if missing:
        return f"kernel tracepoint(s) missing: {', '.join(missing)}"
    return None
