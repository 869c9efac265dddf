"""XID lines of real kernel logs (tests/data/kernel-log, from GPUd) read, counted and judged by the catalogue."""

from __future__ import annotations

import re
from collections import Counter
from datetime import datetime, timedelta, timezone
from importlib import resources
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aaco.contract.xid import (
    MAX_KEYS,
    SEVERITIES,
    SEVERITY_BY_ACTION,
    XidCounter,
    XidEvent,
    catalogue,
    lookup,
    parse_line,
)

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "kernel-log"
LOGS = sorted(p.name for p in DATA.glob("*.log"))
# An independent reading of an XID line, as `grep` would: the GPU and the code, nothing else.
GREP = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2})\): (\d+),")


def lines(name: str) -> list[str]:
    return (DATA / name).read_text(encoding="utf-8").splitlines(keepends=True)


def line_with(name: str, needle: str) -> str:
    return next(ln for ln in lines(name) if needle in ln)


def read(line: str, **kw: object) -> XidEvent:
    event = parse_line(line, **kw)
    assert event is not None, line
    return event


def counted(name: str) -> XidCounter:
    counter = XidCounter()
    for ln in lines(name):
        counter.add_line(ln)
    return counter


def body(line: str) -> str:
    """A real line without its time prefix: what the driver wrote (``NVRM: Xid ...``)."""
    return line[line.index("NVRM: Xid") :].rstrip("\n")


# ---- the real logs: counts as grep gives them


def test_the_data_holds_the_five_logs():
    assert LOGS == [
        "dmesg-with-xid-119.log",
        "dmesg.decode.iso.log",
        "gpud-kmsg-test-gb200.log",
        "gpud-sxid-readme-xid79.log",
        "gpud-xid-readme-2024-08.log",
    ]
    readme = (DATA / "README.md").read_text()
    assert all(f"`{name}`" in readme for name in LOGS)


@pytest.mark.parametrize("name", LOGS)
def test_counts_by_gpu_and_code_are_greps(name: str):
    raw = lines(name)
    expected = Counter((bus + ".0", int(code)) for ln in raw for bus, code in GREP.findall(ln))
    grep_c = sum("NVRM: Xid" in ln for ln in raw)  # grep -c "NVRM: Xid"
    counter = counted(name)
    assert counter.counts == dict(expected)
    assert sum(counter.counts.values()) == grep_c == sum(expected.values())
    assert counter.malformed == 0
    assert counter.dropped == 0


def test_the_counts_of_each_log():
    assert counted("dmesg-with-xid-119.log").counts == {("0000:9b:00.0", 119): 5}
    assert counted("dmesg.decode.iso.log").counts == {("0000:38:00.0", 13): 16, ("0000:38:00.0", 43): 1}
    assert counted("gpud-sxid-readme-xid79.log").counts == {("0000:91:00.0", 79): 1}  # not the 8 SXid lines
    assert counted("gpud-xid-readme-2024-08.log").counts == {
        ("0000:cb:00.0", 13): 3,
        ("0000:cb:00.0", 109): 2,
        ("0000:cb:00.0", 31): 1,
    }
    gb200 = counted("gpud-kmsg-test-gb200.log")
    by_code: Counter[int] = Counter()
    by_gpu: Counter[str] = Counter()
    for (bus, code), n in gb200.counts.items():
        by_code[code] += n
        by_gpu[bus] += n
    assert by_code == {149: 5, 154: 4}
    assert by_gpu == {"0009:01:00.0": 4, "0008:01:00.0": 3, "0019:01:00.0": 1, "0018:01:00.0": 1}


def test_the_last_event_of_each_gpu_and_code():
    last = counted("dmesg-with-xid-119.log").last[("0000:9b:00.0", 119)]
    assert (last.pid, last.process) == (1240590, "gpud")
    assert last.message.endswith("Expected function 76 (GSP_RM_CONTROL) (0x20803032 0x58c).")
    assert last.raw == lines("dmesg-with-xid-119.log")[-1].rstrip("\n")
    xid43 = counted("dmesg.decode.iso.log").last[("0000:38:00.0", 43)]
    assert (xid43.pid, xid43.process, xid43.message) == (2924364, "pt_main_thread", "Ch 00000008")


# ---- the fields of a line


def test_unknown_pid_and_name_are_none():
    event = parse_line(line_with("dmesg.decode.iso.log", "): 13,"))
    assert event is not None
    assert (event.pid, event.process) == (None, None)  # pid='<unknown>', name=<unknown>
    assert event.message == "Graphics SM Global Exception on (GPC 8, TPC 5, SM 1): Multiple Warp Errors"
    xid79 = parse_line(line_with("gpud-sxid-readme-xid79.log", "NVRM: Xid"))
    assert xid79 is not None
    assert (xid79.code, xid79.pci_bus, xid79.pid, xid79.process) == (79, "0000:91:00.0", None, None)
    assert xid79.message == "GPU has fallen off the bus."


def test_a_line_without_pid_and_name_keeps_its_whole_message():
    event = parse_line(line_with("gpud-kmsg-test-gb200.log", "154, GPU recovery action changed from 0x0"))
    assert event is not None
    assert (event.code, event.pci_bus, event.pid, event.process) == (154, "0009:01:00.0", None, None)
    assert event.message == "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)"
    nvlink = parse_line(line_with("gpud-kmsg-test-gb200.log", "Link 15"))
    assert nvlink is not None
    assert nvlink.message.startswith("NETIR_LINK_EVT  Fatal   XC0 i0 Link 15 (0x0215e5c6")  # the driver's spaces


def test_the_catalogue_entry_of_an_event():
    event = parse_line(line_with("gpud-xid-readme-2024-08.log", "): 31,"))
    assert event is not None
    assert (event.pid, event.process) == (626486, "pt_main_thread")
    assert event.message.startswith("Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_14")
    assert (event.xid.description, event.xid.severity) == ("GPU memory page fault", "warning")


# ---- every format, real lines and variants built from them


EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def epoch_ns(*args: int, tz: timezone = timezone.utc, us: int = 0) -> int:
    """Unix epoch ns of a wall-clock time, computed apart from the module's arithmetic."""
    return int((datetime(*args, tzinfo=tz) - EPOCH).total_seconds()) * 10**9 + us * 1000


def test_dmesg_T_is_the_hosts_local_time():
    real = line_with("dmesg-with-xid-119.log", "NVRM: Xid")  # [Sun Feb 23 16:24:18 2025]
    assert read(real).ts_ns == epoch_ns(2025, 2, 23, 16, 24, 18)
    pst = timezone(timedelta(hours=-8))
    assert read(real, tz=pst).ts_ns == epoch_ns(2025, 2, 23, 16, 24, 18, tz=pst)
    assert read(real, tz=pst).ts_ns - read(real).ts_ns == 8 * 3600 * 10**9
    # the single-digit day dmesg pads with a space (a variant of the real line: 23 -> 3)
    variant = real.replace("[Sun Feb 23 ", "[Mon Feb  3 ")
    assert read(variant).ts_ns == epoch_ns(2025, 2, 3, 16, 24, 18)


def test_dmesg_decode_iso_carries_its_own_zone():
    events = [parse_line(ln) for ln in lines("dmesg.decode.iso.log") if "NVRM: Xid" in ln]
    assert events[0].ts_ns == epoch_ns(2025, 1, 21, 4, 41, 44, us=283302)
    assert [e.ts_ns for e in events] == sorted(e.ts_ns for e in events)
    # the same line from a host at -05:00 (a variant: the offset changed), whatever tz says
    variant = lines("dmesg.decode.iso.log")[0].replace("+00:00", "-05:00")
    at = epoch_ns(2025, 1, 21, 4, 41, 44, tz=timezone(timedelta(hours=-5)), us=283302)
    assert parse_line(variant, tz=timezone(timedelta(hours=9))).ts_ns == at
    # plain --time-format=iso, without --decode's facility and level (a variant)
    assert read(variant[variant.index("2025-") :]).ts_ns == at


def test_plain_dmesg_has_no_absolute_time():
    for name in ("gpud-sxid-readme-xid79.log", "gpud-kmsg-test-gb200.log"):
        events = [parse_line(ln) for ln in lines(name) if "NVRM: Xid" in ln]
        assert events
        assert all(e is not None and e.ts_ns is None for e in events)


def test_journald_and_syslog_lines():
    # variants of the real dmesg -T line, as journalctl -k and rsyslog print it
    real = body(line_with("dmesg-with-xid-119.log", "NVRM: Xid"))
    short = f"Feb 23 16:24:18 xe9680 kernel: {real}"
    event = parse_line(short)
    assert event is not None
    assert (event.code, event.pci_bus, event.process, event.ts_ns) == (119, "0000:9b:00.0", "nvidia-smi", None)
    assert read(short, year=2025).ts_ns == epoch_ns(2025, 2, 23, 16, 24, 18)
    precise = f"Feb 23 16:24:18.123456 xe9680 kernel: {real}"  # journalctl -o short-precise
    assert read(precise, year=2025).ts_ns == epoch_ns(2025, 2, 23, 16, 24, 18, us=123456)
    iso = f"2025-02-23T16:24:18+0000 xe9680 kernel: {real}"  # journalctl -o short-iso
    assert read(iso).ts_ns == epoch_ns(2025, 2, 23, 16, 24, 18)
    # syslog keeping the kernel's own [seconds since boot] (a variant of the real XID 79 line)
    xid79 = line_with("gpud-sxid-readme-xid79.log", "NVRM: Xid").rstrip("\n")
    with_boot = parse_line(f"Feb 23 16:24:18 xe9680 kernel: {xid79}", year=2025)
    assert with_boot is not None
    assert (with_boot.code, with_boot.ts_ns) == (79, epoch_ns(2025, 2, 23, 16, 24, 18))


def test_dev_kmsg_records_and_raw_dmesg():
    # /dev/kmsg: "priority,sequence,microseconds since boot,flags;message", the header shaped as the
    # records of GPUd's pkg/kmsg/testdata/kmsg.1.log; the message a real line's
    xid79 = body(line_with("gpud-sxid-readme-xid79.log", "NVRM: Xid"))
    event = parse_line(f"3,3964,6781741548779,-;{xid79}")
    assert event is not None
    assert (event.code, event.pci_bus, event.ts_ns) == (79, "0000:91:00.0", None)
    assert event.message == "GPU has fallen off the bus."
    # dmesg -r (the priority before the time), as GPUd's pkg/pstore/testdata dmesg.txt prints lines
    raw = parse_line(f"<3>[6781741.548779] {xid79}")
    assert raw is not None
    assert (raw.code, raw.ts_ns) == (79, None)


def test_old_drivers_print_the_gpu_without_pci():
    # a variant of the real line as older drivers print it: "Xid (0000:91:00): 79, ..."
    real = line_with("gpud-sxid-readme-xid79.log", "NVRM: Xid")
    old = parse_line(real.replace("(PCI:", "("))
    new = parse_line(real)
    assert old is not None and new is not None
    assert (old.code, old.pci_bus, old.message) == (new.code, new.pci_bus, new.message)
    assert (old.code, old.pci_bus, old.message) == (79, "0000:91:00.0", "GPU has fallen off the bus.")


def test_line_endings_and_raw():
    real = line_with("dmesg-with-xid-119.log", "NVRM: Xid").rstrip("\n")
    for ending in ("", "\n", "\r\n", "  \n"):
        event = parse_line(real + ending)
        assert event is not None
        assert event.raw == (real + ending).rstrip("\r\n")
        assert event.message.endswith("(0x2081 0x4).")


# ---- the catalogue


def test_the_catalogue_file_is_whole():
    text = resources.files("aaco.contract").joinpath("xid_catalog.tsv").read_text(encoding="utf-8")
    rows = [ln.split("\t") for ln in text.splitlines()]
    assert rows[0] == ["code", "mnemonic", "description", "immediate_resolution"]
    assert all(len(r) == 4 for r in rows)
    assert [int(r[0]) for r in rows[1:]] == list(range(1, 173))
    assert sorted(catalogue()) == list(range(1, 173))


def test_every_catalogue_action_maps_to_a_severity():
    for xid in catalogue().values():
        assert xid.action in SEVERITY_BY_ACTION, f"XID {xid.code}: map {xid.action!r} in contract/xid.py"
        assert xid.severity in SEVERITIES
    assert {x.action for x in catalogue().values()} == set(SEVERITY_BY_ACTION)  # no mapping left unused


def test_severities_of_the_catalogue():
    for code in (48, 62, 64, 74, 79, 95, 119, 120):
        assert lookup(code).severity == "critical", code
    for code in (13, 31):
        assert lookup(code).severity == "warning", code
    # where NVIDIA's catalogue says less than one might expect, it is followed as it is:
    assert (lookup(43).action, lookup(43).severity) == ("IGNORE", "info")  # GPU stopped processing
    assert (lookup(92).action, lookup(92).severity) == ("IGNORE", "info")  # high single-bit ECC rate
    assert (lookup(94).action, lookup(94).severity) == ("RESTART_APP", "warning")  # contained ECC error
    assert (lookup(63).action, lookup(63).severity) == ("IGNORE", "info")  # row remapping event
    assert lookup(48).mnemonic == "ROBUST_CHANNEL_GPU_ECC_DBE"
    assert lookup(79).description == "GPU has fallen off the bus"
    assert lookup(13).mnemonic == "ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY"  # joined lines
    assert lookup(167).action == "" and lookup(167).severity == "warning"  # no resolution given


def test_unknown_codes():
    unknown = lookup(999)
    assert (unknown.code, unknown.description, unknown.severity, unknown.action) == (999, "unknown XID", "warning", "")
    assert lookup(0).description == "unknown XID"
    # a variant of a real line with a code the catalogue lacks
    event = parse_line(line_with("gpud-sxid-readme-xid79.log", "NVRM: Xid").replace("): 79,", "): 4242,"))
    assert event is not None
    assert (event.code, event.xid.description, event.xid.severity) == (4242, "unknown XID", "warning")


def test_the_catalogue_is_a_copy():
    mine = catalogue()
    mine.clear()
    assert len(catalogue()) == 172
    assert lookup(79).severity == "critical"


def test_the_catalogue_ships_in_the_wheel():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "xid_catalog.tsv" in data["aaco.contract"]
    assert "xid_catalog.md" in data["aaco.contract"]


# ---- malformed lines, the bound, any text


def test_malformed_lines_are_counted_not_read():
    real = line_with("gpud-sxid-readme-xid79.log", "NVRM: Xid").rstrip("\n")
    malformed = [
        real[: real.index("): 79") + 3],  # cut after the GPU: no code
        real.replace("(PCI:0000:91:00)", "(PCI:zz)"),  # no bus
        real.replace("): 79,", "): seventy-nine,"),
        real.replace("): 79,", "): 1234567,"),  # more digits than any code
        "NVRM: Xid",
    ]
    counter = XidCounter()
    for ln in [*malformed, *lines("gpud-sxid-readme-xid79.log")]:
        counter.add_line(ln)
    assert all(parse_line(ln) is None for ln in malformed)
    assert counter.malformed == len(malformed)
    assert counter.counts == {("0000:91:00.0", 79): 1}  # the SXid and other NVRM lines are neither


def test_the_counter_is_bounded():
    # variants of the real XID 79 line on 300 GPUs (the bus number changed)
    real = line_with("gpud-sxid-readme-xid79.log", "NVRM: Xid")
    buses = [f"{d:04x}:{b:02x}:00" for d in range(2) for b in range(150)]
    counter = XidCounter()
    for bus in buses:
        assert counter.add_line(real.replace("0000:91:00", bus)) is not None
    assert len(counter.counts) == MAX_KEYS == 256
    assert counter.dropped == len(buses) - MAX_KEYS
    counter.add_line(real.replace("0000:91:00", buses[0]))  # a pair it holds still counts
    assert counter.counts[(buses[0] + ".0", 79)] == 2
    assert counter.dropped == len(buses) - MAX_KEYS
    small = XidCounter(max_keys=1)
    assert small.add_line(real) is not None
    small.add_line(real.replace("): 79,", "): 48,"))
    assert (small.counts, small.dropped) == ({("0000:91:00.0", 79): 1}, 1)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_any_text_never_raises(text: str):
    assert parse_line(text) is None or "NVRM: Xid" in text
    XidCounter(year=2025).add_line(text)


AFTER_MARKER = st.from_regex(r"\([A-Za-z:0-9.]{0,20}\): \d{0,9}(, .{0,40})?", fullmatch=True)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40), AFTER_MARKER, st.text(max_size=40))
def test_text_around_the_marker_never_raises(before: str, after: str, tail: str):
    line = f"{before}NVRM: Xid {after}{tail}"
    event = parse_line(line, year=2025)
    assert event is None or (event.pci_bus.count(":") == 2 and event.pci_bus[-2] == ".")
    counter = XidCounter()
    counter.add_line(line)
    assert counter.malformed + sum(counter.counts.values()) == 1
