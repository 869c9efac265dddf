"""NVIDIA XID errors from the kernel log, with NVIDIA's catalogue's meaning and a severity per code.

The NVIDIA driver reports a GPU error as an XID line in the kernel log::

    NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting ...

``parse_line`` reads one such line in the formats people feed it: plain ``dmesg`` (``[ 1234.567890]``,
seconds since boot), ``dmesg -T`` (``[Sun Feb 23 16:24:18 2025]``, the host's local time: give its
``tz``), ``dmesg --decode --time-format=iso`` (``kern  :warn  : 2025-01-21T04:41:44,283302+00:00``),
journald and syslog (``Oct 06 17:59:27 host kernel: ...``, no year: ``ts_ns`` is None unless ``year`` is
given; ``2025-01-21T04:41:44+0000 host kernel: ...`` too) and ``/dev/kmsg`` records
(``4,1234,5678901234,-;NVRM: ...``, monotonic microseconds: no ``ts_ns``). Older drivers print the
GPU without ``PCI:`` (``NVRM: Xid (0000:01:00): 79, ...``); both are read. ``XidCounter``
counts lines by GPU and code, bounded. ``lookup`` gives a code's mnemonic, description, action (the
catalogue's immediate resolution) and severity from ``xid_catalog.tsv`` (NVIDIA's XID catalogue,
provenance in ``xid_catalog.md``).

The severity is the catalogue's immediate resolution's (what NVIDIA says to do at once), every value
the catalogue uses mapped here (``SEVERITY_BY_ACTION``):

==========================================================  ========  ===================================
immediate resolution                                        severity  meaning
==========================================================  ========  ===================================
``IGNORE``                                                  info      nothing to do (63, 92, 43, ...)
``XID_154``                                                 info      recovery action changed: about
                                                                      another XID, which has its own
``RESTART_APP``                                             warning   the application faulted (13, 31, 94)
``WORKFLOW_XID_45``                                         warning   cleanup after another error
``CHECK_UVM``                                               warning   check the unified memory driver
``UPDATE_SWFW``                                             warning   update the driver or firmware
(empty: 162 to 172)                                         warning   no resolution given, as unknown
``RESET_GPU``                                               critical  reset the GPU (62, 64, 95, 119)
``RESTART_BM``, ``RESTART_VM``                              critical  reboot the machine (79)
``CONTACT_SUPPORT``                                         critical  hardware fault, or a code unused
``CHECK_MECHANICALS``                                       critical  power or cabling (54)
``WORKFLOW_XID_48``                                         critical  double-bit ECC error (48)
``WORKFLOW_NVLINK_ERR``, ``WORKFLOW_NVLINK5_ERR``           critical  NVLink failure (74, 144 to 150)
==========================================================  ========  ===================================

A code the catalogue lacks is a warning ("unknown XID"). XIDs 144 to 150 are critical at the code's
level: the NVLink5 decode table (by the message's unit and status) that says some are ignorable is
not applied.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo
from importlib import resources
from typing import Final, Literal

from aaco.contract.telemetry import normalize_pci

Severity = Literal["info", "warning", "critical"]
SEVERITIES: Final[tuple[Severity, ...]] = ("info", "warning", "critical")
SEVERITY_BY_ACTION: Final[dict[str, Severity]] = {
    "IGNORE": "info",
    "XID_154": "info",
    "RESTART_APP": "warning",
    "WORKFLOW_XID_45": "warning",
    "CHECK_UVM": "warning",
    "UPDATE_SWFW": "warning",
    "": "warning",
    "RESET_GPU": "critical",
    "RESTART_BM": "critical",
    "RESTART_VM": "critical",
    "CONTACT_SUPPORT": "critical",
    "CHECK_MECHANICALS": "critical",
    "WORKFLOW_XID_48": "critical",
    "WORKFLOW_NVLINK_ERR": "critical",
    "WORKFLOW_NVLINK5_ERR": "critical",
}
UNKNOWN_SEVERITY: Final[Severity] = "warning"
CATALOG_FILE: Final = "xid_catalog.tsv"
MARKER: Final = "NVRM: Xid"  # a line with it that does not parse is malformed
MAX_KEYS: Final = 256  # (GPU, code) pairs an XidCounter keeps

_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9a-fA-F]{1,8}:[0-9a-fA-F]{1,2}:[0-9a-fA-F]{1,2}(?:\.[0-7])?)\): "
    r"(?P<code>\d{1,6})(?:,(?P<rest>.*))?\s*$"
)
_PID = re.compile(r"pid=(?P<pid>\d{1,10}|'?<unknown>'?)(?:,\s*|$)")
_NAME = re.compile(r"name=(?P<name>'?<unknown>'?|[^,]*)(?:,\s*|$)")
_MONTH_NAMES: Final = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MONTHS: Final = {name: number for number, name in enumerate(_MONTH_NAMES, 1)}
_MON = "(?P<mon>" + "|".join(_MONTHS) + ")"
_HMS = r"(?P<h>\d{2}):(?P<m>\d{2}):(?P<s>\d{2})"
# dmesg -T: "[Sun Feb 23 16:24:18 2025]"
_CTIME = re.compile(rf"\[[A-Z][a-z]{{2}} {_MON} +(?P<day>\d{{1,2}}) {_HMS} (?P<year>\d{{4}})\]")
# dmesg --time-format=iso (after --decode's "kern  :warn  : "), journalctl -o short-iso, RFC 3339 syslog
_ISO = re.compile(
    rf"(?:[a-z]+ *:[a-z]+ *: )?(?P<year>\d{{4}})-(?P<month>\d{{2}})-(?P<day>\d{{2}})[T ]{_HMS}"
    r"(?:[.,](?P<frac>\d{1,9}))?(?P<off>Z|[+-]\d{2}:?\d{2})?"
)
# journalctl (short, short-precise) and BSD syslog: "Oct 06 17:59:27 host kernel: "
_SYSLOG = re.compile(rf"{_MON} +(?P<day>\d{{1,2}}) {_HMS}(?:\.(?P<frac>\d{{1,9}}))? ")
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True, slots=True)
class Xid:
    """One XID code as NVIDIA's catalogue has it; ``action`` is its immediate resolution."""

    code: int
    mnemonic: str
    description: str
    action: str
    severity: Severity


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One XID line: the GPU (``0000:9b:00.0``), the process the driver named, the time when absolute."""

    code: int
    pci_bus: str
    pid: int | None
    process: str | None
    message: str
    ts_ns: int | None  # Unix epoch ns from the line's own absolute time, else None
    raw: str

    @property
    def xid(self) -> Xid:
        """The catalogue's entry for this code."""
        return lookup(self.code)


def severity_of(action: str) -> Severity:
    """The severity of an immediate resolution; one the table lacks is a warning."""
    return SEVERITY_BY_ACTION.get(action, UNKNOWN_SEVERITY)


@functools.lru_cache(maxsize=1)
def _catalogue() -> dict[int, Xid]:
    text = resources.files("aaco.contract").joinpath(CATALOG_FILE).read_text(encoding="utf-8")
    out: dict[int, Xid] = {}
    for line in text.splitlines()[1:]:
        code, mnemonic, description, action = line.split("\t")
        out[int(code)] = Xid(int(code), mnemonic, description, action, severity_of(action))
    return out


def catalogue() -> dict[int, Xid]:
    """Every code of NVIDIA's catalogue (read once; a copy)."""
    return dict(_catalogue())


def lookup(code: int) -> Xid:
    """The catalogue's entry for ``code``; an unknown code is an "unknown XID" warning."""
    found = _catalogue().get(code)
    return found if found is not None else Xid(code, "", "unknown XID", "", UNKNOWN_SEVERITY)


def _frac_ns(frac: str | None) -> int:
    return int(frac.ljust(9, "0")) if frac else 0


def _epoch_ns(year: int, month: int, day: int, hms: tuple[str, str, str], frac: str | None, tz: tzinfo) -> int | None:
    """Unix epoch ns of a wall-clock time in ``tz``; None for a time that does not exist."""
    try:
        dt = datetime(year, month, day, int(hms[0]), int(hms[1]), int(hms[2]), tzinfo=tz)
        return (dt - _EPOCH) // timedelta(seconds=1) * 1_000_000_000 + _frac_ns(frac)
    except (ValueError, OverflowError):
        return None


def _offset(text: str) -> tzinfo | None:
    """``Z``, ``+00:00`` or ``-0400`` as a zone; None when out of range."""
    if text == "Z":
        return timezone.utc
    hours, minutes = int(text[1:3]), int(text[-2:])
    if hours > 23 or minutes > 59:
        return None
    delta = timedelta(hours=hours, minutes=minutes)
    return timezone(-delta if text[0] == "-" else delta)


def _timestamp(prefix: str, year: int | None, tz: tzinfo) -> int | None:
    """The absolute time a line's prefix (what precedes ``NVRM: Xid``) starts with, if it has one."""
    prefix = prefix.lstrip()
    if m := _CTIME.match(prefix):
        hms = (m["h"], m["m"], m["s"])
        return _epoch_ns(int(m["year"]), _MONTHS[m["mon"]], int(m["day"]), hms, None, tz)
    if m := _ISO.match(prefix):
        zone = _offset(m["off"]) if m["off"] else tz
        if zone is None:
            return None
        hms = (m["h"], m["m"], m["s"])
        return _epoch_ns(int(m["year"]), int(m["month"]), int(m["day"]), hms, m["frac"], zone)
    if year is not None and (m := _SYSLOG.match(prefix)):
        return _epoch_ns(year, _MONTHS[m["mon"]], int(m["day"]), (m["h"], m["m"], m["s"]), m["frac"], tz)
    return None  # dmesg's seconds since boot, /dev/kmsg's microseconds, or no time at all


def _pci_bus(text: str) -> str:
    """``0000:9b:00`` (the kernel prints no function) -> ``0000:9b:00.0``, like ``normalize_pci``."""
    bus = normalize_pci(text)
    return bus if "." in bus else bus + ".0"


def parse_line(line: str, *, year: int | None = None, tz: tzinfo = timezone.utc) -> XidEvent | None:
    """One kernel log line as an XID event; None for any line that is not one (never raises).

    ``year`` dates syslog lines (which print none); ``tz`` is the zone of times printed without one
    (``dmesg -T``, syslog).
    """
    at = line.find(MARKER)
    if at < 0:
        return None
    m = _XID.match(line, at)
    if m is None:
        return None
    rest = (m["rest"] or "").strip()
    pid: int | None = None
    process: str | None = None
    if p := _PID.match(rest):
        pid = int(p["pid"]) if p["pid"].isdigit() else None
        rest = rest[p.end() :]
    if n := _NAME.match(rest):
        process = None if n["name"].strip("'") == "<unknown>" else n["name"].strip() or None
        rest = rest[n.end() :]
    return XidEvent(
        code=int(m["code"]),
        pci_bus=_pci_bus(m["bus"]),
        pid=pid,
        process=process,
        message=rest.strip(),
        ts_ns=_timestamp(line[:at], year, tz),
        raw=line.rstrip("\r\n"),
    )


class XidCounter:
    """XID lines counted by (GPU, code), with the last event of each; bounded to ``max_keys`` pairs.

    A line that holds ``NVRM: Xid`` but does not read as an XID counts as ``malformed``; an event of a
    new pair once ``max_keys`` pairs are held counts as ``dropped``.
    """

    def __init__(self, *, year: int | None = None, tz: tzinfo = timezone.utc, max_keys: int = MAX_KEYS) -> None:
        self.year = year
        self.tz = tz
        self.max_keys = max_keys
        self.malformed = 0
        self.dropped = 0
        self._counts: dict[tuple[str, int], int] = {}
        self._last: dict[tuple[str, int], XidEvent] = {}

    def add_line(self, line: str) -> XidEvent | None:
        """Read one kernel log line; the event when it is an XID line (kept or dropped)."""
        event = parse_line(line, year=self.year, tz=self.tz)
        if event is None:
            if MARKER in line:
                self.malformed += 1
            return None
        self.add(event)
        return event

    def add(self, event: XidEvent) -> bool:
        """Count one event; False when it is dropped (a new pair beyond ``max_keys``)."""
        key = (event.pci_bus, event.code)
        if key not in self._counts and len(self._counts) >= self.max_keys:
            self.dropped += 1
            return False
        self._counts[key] = self._counts.get(key, 0) + 1
        self._last[key] = event
        return True

    @property
    def counts(self) -> dict[tuple[str, int], int]:
        """Events by (GPU, code)."""
        return dict(self._counts)

    @property
    def last(self) -> dict[tuple[str, int], XidEvent]:
        """The last event of each (GPU, code)."""
        return dict(self._last)
