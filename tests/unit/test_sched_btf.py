"""The BTF reader: task_struct offsets and raw tracepoint arities from a synthetic BTF blob."""

from __future__ import annotations

import struct
from pathlib import Path

from aaco.agent.sources.sched.btf import RAW_TRACEPOINTS, TASK_PROGRAM_TRACEPOINTS, task_layout, task_program_layout


class Blob:
    """Builds a minimal BTF: strings and types, ids from 1."""

    def __init__(self) -> None:
        self.strings = b"\0"
        self.types = b""
        self.count = 0

    def s(self, text: str) -> int:
        off = len(self.strings)
        self.strings += text.encode() + b"\0"
        return off

    def add(self, kind: int, name: str, size: int, vlen: int = 0, extra: bytes = b"") -> int:
        self.types += struct.pack("<III", self.s(name) if name else 0, (kind << 24) | vlen, size) + extra
        self.count += 1
        return self.count

    def bytes(self) -> bytes:
        hdr = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(self.types), len(self.types), len(self.strings))
        return hdr + self.types + self.strings


def kernel_blob(
    switch_params: int = 5, exit_params: int = 3, with_state: bool = True, sched_info: tuple[int, int] | None = (0, 8)
) -> bytes:
    """A kernel's BTF; ``sched_info``: byte offsets of its pcount and run_delay (None: no sched_info member)."""
    b = Blob()
    u32 = b.add(1, "unsigned int", 4, extra=struct.pack("<I", 32))
    members = [("pid", 1264 * 8, u32), ("tgid", 1268 * 8, u32)] + ([("__state", 24 * 8, u32)] if with_state else [])
    if sched_info is not None:
        info = b"".join(
            struct.pack("<III", b.s(n), u32, off * 8)
            for n, off in zip(("pcount", "run_delay"), sched_info, strict=True)
        )
        members.append(("sched_info", 1008 * 8, b.add(4, "sched_info", 48, 2, info)))
    body = b"".join(struct.pack("<III", b.s(n), t, off) for n, off, t in members)
    b.add(4, "task_struct", 4096, len(members), body)
    for tp in RAW_TRACEPOINTS:
        n = {"sched_switch": switch_params, "sched_process_exit": exit_params}.get(tp, 2)
        proto = b.add(13, "", 0, n, b"".join(struct.pack("<II", 0, u32) for _ in range(n)))
        ptr = b.add(2, "", proto)
        b.add(8, f"btf_trace_{tp}", ptr)
    return b.bytes()


def test_layout_from_btf(tmp_path: Path):
    path = tmp_path / "vmlinux"
    path.write_bytes(kernel_blob())
    layout = task_layout(path)
    assert layout is not None
    assert (layout.pid_offset, layout.tgid_offset, layout.state_offset) == (1264, 1268, 24)
    assert layout.switch_has_state and layout.exit_has_group_dead
    assert layout.sched_info_offset == 1008


def test_sched_info_only_when_it_starts_with_pcount_and_run_delay(tmp_path: Path):
    path = tmp_path / "vmlinux"
    for info in (None, (8, 0), (0, 16)):
        path.write_bytes(kernel_blob(sched_info=info))
        layout = task_layout(path)
        assert layout is not None and layout.sched_info_offset is None, info


def test_older_kernels_read_the_state_from_the_task(tmp_path: Path):
    path = tmp_path / "vmlinux"
    path.write_bytes(kernel_blob(switch_params=4, exit_params=2))
    layout = task_layout(path)
    assert layout is not None and not layout.switch_has_state and not layout.exit_has_group_dead
    path.write_bytes(kernel_blob(switch_params=4, with_state=False))
    assert task_layout(path) is None  # no prev_state anywhere: classic tracepoints instead


def test_unusable_btf_gives_none(tmp_path: Path):
    assert task_layout(tmp_path / "missing") is None
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x00" * 64)
    assert task_layout(bad) is None
    truncated = tmp_path / "truncated"
    truncated.write_bytes(kernel_blob()[:100])
    assert task_layout(truncated) is None


def test_inconsistent_strings_give_none(tmp_path: Path):
    blob = bytearray(kernel_blob())
    str_len_at = 20
    struct.pack_into("<I", blob, str_len_at, 1)
    path = tmp_path / "v"
    path.write_bytes(bytes(blob[: len(blob) - 40]))  # names point past the end
    assert task_layout(path) is None


def task_program_blob(last_arrival: int = 32, iterator: bool = True) -> bytes:
    """A kernel's BTF with what sched_task.c reads: task_struct.comm and .se, sched_entity.sum_exec_runtime,
    sched_info.last_arrival, the tracepoints' typedefs and the task iterator's function."""
    b = Blob()
    u64 = b.add(1, "unsigned long long", 8, extra=struct.pack("<I", 64))

    def struct_of(name: str, size: int, fields: list[tuple[str, int, int]]) -> int:
        body = b"".join(struct.pack("<III", b.s(n), t, off * 8) for n, off, t in fields)
        return b.add(4, name, size, len(fields), body)

    se = struct_of("sched_entity", 256, [("exec_start", 96, u64), ("sum_exec_runtime", 104, u64)])
    info = struct_of("sched_info", 48, [("pcount", 0, u64), ("run_delay", 8, u64), ("last_arrival", last_arrival, u64)])
    struct_of("task_struct", 4096, [("se", 128, se), ("sched_info", 1008, info), ("comm", 1752, u64)])
    proto = b.add(13, "", 0, 1, struct.pack("<II", 0, u64))
    for tp in TASK_PROGRAM_TRACEPOINTS:
        b.add(8, f"btf_trace_{tp}", b.add(2, "", proto))
    if iterator:
        b.add(12, "bpf_iter_task", proto, 1)
    return b.bytes()


def test_task_program_layout_from_btf(tmp_path: Path):
    path = tmp_path / "vmlinux"
    path.write_bytes(task_program_blob())
    layout = task_program_layout(path)
    assert layout is not None
    assert (layout.comm_offset, layout.sum_exec_offset) == (1752, 128 + 104)
    assert set(layout.btf_ids) == {f"btf_trace_{tp}" for tp in TASK_PROGRAM_TRACEPOINTS} | {"bpf_iter_task"}
    assert len(set(layout.btf_ids.values())) == len(layout.btf_ids)  # each its own type id


def test_task_program_layout_refuses_what_the_program_would_misread(tmp_path: Path):
    path = tmp_path / "vmlinux"
    for blob in (task_program_blob(last_arrival=40), task_program_blob(iterator=False), b"junk" * 10):
        path.write_bytes(blob)
        assert task_program_layout(path) is None
    assert task_program_layout(tmp_path / "missing") is None
