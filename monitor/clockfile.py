"""The station's last known good time: `state_dir/clock.json`, a heartbeat of the gateway clock.

Why: at start, a meter's rows far ahead of the gateway clock are either a clock not set yet (a
gateway without a battery-backed clock booted before NTP answered: 1970 or its image's build
date) or a meter's bad stamps (an ingested file with a typo). The ledger alone cannot tell
them apart; a time the station wrote from outside it can (`MeterBook.found_at_start`): a clock
more than a day behind it is not set, one that is not behind it is. systemd-timesyncd keeps
such a file for the same reason (`/var/lib/systemd/timesync/clock`).

What is written, and when: the gateway clock's time, at most once a minute (`EVERY`, by that
clock: a step writes at once) and at a clean stop; atomically (a temporary file, fsync,
rename, fsync of the directory), so a kill -9 or a power cut leaves the old file or the new
one, never half of one. A refused write (a full or read-only disk) is logged once, counted,
and tried again on the next beat; the daemon goes on.

It must not be fooled by the clock it checks. It is written only while the clock is
plausible: not before `RELEASE_FLOOR` (the date this release was cut: an unset clock reads
1970, or a build date before it), and not more than a day behind the station's evidence at
start (`not_before`: what the daemon found in its state, this file among it; an unset clock
reading its image's build date, after the release, is behind that). Nor is it written at all
until the daemon has judged its start (`not_before` is None: a test's or the demo's clock).
A clock wrong in the future while the daemon runs writes its time here; NTP stepping it back
while the daemon runs writes the right time at once (a step).

A heartbeat more than a day ahead of the clock at start (`judge`) is a clock not set yet (the
heartbeat right) or a heartbeat a clock wrong in the future wrote (an RTC set a month ahead, a
bad NTP server, or a step back while the daemon was down; the clock right now). Every record of
the station was stamped by the same clock, so a second opinion decides: the kernel saying NTP
keeps the clock synchronised (`monitor.kernelclock`, as `timedatectl`) makes it right, and the
records ahead were the wrong clock's (the daemon moves a meter's rows as a step found at start,
and the heartbeat is written anew). Without one, the clock is taken for unset as before, but
not for ever (`settle`): it is taken as right once the kernel says so, or once it has run
`STEADY` without a step (an unset clock is stepped forward by NTP, which ends the doubt too).
Each is said once, in words, with what to do. The file records, besides the time, the boot it
was written in and how long after it, and the kernel's word then (a reader of the last release
ignores them): the warning says whether the clock stepped in this boot, and by how much.

Kept across a restart (`Kept`, the file's `doubt` key, its `time` untouched): the steady run in
doubt, and the moment the clock was taken as right, with the boot they were measured in and
the wall clock against CLOCK_BOOTTIME then. A restart in the same boot on a clock that has not
stepped since (the two moved alike) counts on, or is right at once; a step while the daemon was
down, a reboot (no boot's clock is known steady in the next) or a step seen while running
(kept at once) starts the 7 days again. Before, a daemon restarted every few days kept a clock
in doubt for ever, and a kill -9 between a settle and the heartbeat's write put a settled clock
back in doubt for 7 days.

Read, it is judged by the same rules: a time no clock of this release writes (before the
floor, past the year 9999) or a file that is not a small regular one is damage, taken as
missing; trusted, a heartbeat of 0 made a 1970 clock "set".
"""

from __future__ import annotations

import json
import logging
import math
import os
import stat
from pathlib import Path

from monitor.clockkept import Kept, seconds
from monitor.durable import replace_file
from monitor.kernelclock import Kernel
from monitor.meters.book import UNSYNCED_AT_START, Evidence
from monitor.model import iso

log = logging.getLogger(__name__)

CLOCK_FILE = "clock.json"
FORMAT = "station-monitor clock"
VERSION = 1
EVERY = 60.0  # seconds of the gateway clock between writes, at most
# The date this release was cut (2026-11-01T00:00:00Z): a clock before it is not set (1970, an
# old image's build date) and is never written here. Move it forward at each release:
# tests/test_release_floor.py fails when CHANGELOG.md dates a release more than 14 days after it.
RELEASE_FLOOR = 1_793_491_200.0
CEILING = 253_402_300_800.0  # 10000-01-01T00:00:00Z: past what a date (`iso`) can name
MAX_SIZE = 4096  # bytes: the file is one short line
# A clock more than a day behind the heartbeat at start, with no second opinion, is taken as
# right once it has run this long (awake: a suspend is no time NTP had to step it) without a
# step: an unset clock is stepped by NTP long before; a gateway without NTP whose RTC was wrong
# in the future is not left for a month.
# Kept in the file (`Kept`) for a restart in the same boot on a clock that has not stepped; a
# reload (SIGHUP) hands it over in the process.
STEADY = 7 * 86_400.0


class ClockFile:
    """The heartbeat file: read once at start (`held`), written by `beat`."""

    def __init__(
        self,
        path: Path,
        floor: float = RELEASE_FLOOR,
        every: float = EVERY,
        kernel: Kernel | None = None,
        steady_since: float | None = None,
    ) -> None:
        """`kernel`: the kernel's word on the clock (None: a test's or the demo's clock, of which
        the kernel knows nothing). `steady_since`: a reload's, the steady run in doubt of the
        file the daemon it replaces held (the same heartbeat: its time is not written in doubt)."""
        self.path = path
        self.floor = floor
        self.every = every
        self.kernel = kernel
        # The heartbeat's boot id and seconds since that boot (if written).
        self.boot: tuple[str | None, float | None] = (None, None)
        # The kernel's word when the heartbeat was written (None: not written, an older release).
        self.held_synchronised: bool | None = None
        # Monotonic time since the clock has run without a step while it is behind the
        # heartbeat and nothing said which is right (`judge`); None: no doubt.
        self.steady_since: float | None = None
        # In doubt although the kernel says synchronised: it said so when the heartbeat was
        # written too (`judge`); the cure is the NTP server, not `timedatectl set-ntp true`.
        self.ntp_disagrees = False
        self._carried = steady_since
        # The doubt the file keeps for a restart (`Kept`); None: none, or an older file.
        self.kept: Kept | None = None
        self._kept_damage: str | None = None  # why the file's doubt is no record (`_kept_here`)
        self._unkept = False  # a steady run started again (a step) not kept yet
        # The awake clock at the last keep of a step (`_keep_soon`); not the start's keep: a
        # step in the first minute is kept at once, or a restart counted on across it.
        self._kept_mono = -math.inf
        # The clock must reach this minus a day before anything is written (set by the daemon
        # once it judged its start); None: not judged, nothing written.
        self.not_before: float | None = None
        self.failures = 0  # writes refused (a full or read-only disk)
        self._written = -math.inf  # the clock's time at the last write
        self._failing = False
        self._told_implausible = False
        self.held, self.problem = self._read()
        if self.problem is not None:
            log.warning("%s: %s", self.path, self.problem)
        elif self.held is None:
            log.info("no heartbeat %s yet (a first start): written once the clock is judged", self.path)

    def _read(self) -> tuple[float | None, str | None]:
        """The time held, or why there is none (missing: no problem to report). Read as what
        it claims to be, a small regular file: a symlink to /dev/zero or a FIFO (opened without
        blocking) is not read at all, a file over `MAX_SIZE` not whole; a time no clock of this
        release writes (before `floor`: 1970, a negative, `true`; past year 9999) is damage.
        Trusted, a time before the floor made a 1970 clock "set" (its meter history moved back
        by the clock's error), and one past 9999 failed the start (OverflowError naming it)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None, None
        except OSError as exc:
            return None, f"cannot read the heartbeat ({exc.strerror or exc}); taken as missing"
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None, "the heartbeat is not a regular file; taken as missing"
            raw = b""
            while len(raw) <= MAX_SIZE and (chunk := os.read(fd, MAX_SIZE + 1 - len(raw))):
                raw += chunk
        except OSError as exc:
            return None, f"cannot read the heartbeat ({exc.strerror or exc}); taken as missing"
        finally:
            os.close(fd)
        try:
            if len(raw) > MAX_SIZE:
                raise ValueError(f"larger than {MAX_SIZE} bytes")
            try:
                doc = json.loads(raw.decode("utf-8"))
            except RecursionError:  # 1,000 nested lists fit in the size: not a ValueError
                raise ValueError("nested too deep") from None
            if not isinstance(doc, dict) or doc.get("format") != FORMAT:
                raise ValueError("not a heartbeat file")
            if doc.get("version") != VERSION:
                raise ValueError(f"version {doc.get('version')!r}, expected {VERSION}")
            held = seconds(doc.get("time"))
            if held is None:
                raise ValueError(f"time {doc.get('time')!r:.40}")
            if not self.floor <= held < CEILING:
                raise ValueError(f"time {held!r}, before this release or past the year 9999")
            boot, since = doc.get("boot_id"), doc.get("since_boot")
            if isinstance(boot, str) and isinstance(since, (int, float)) and not isinstance(since, bool):
                self.boot = (boot, seconds(since))
            if isinstance(synced := doc.get("synchronised"), bool):
                self.held_synchronised = synced
            if (doubt := doc.get("doubt")) is not None:
                try:
                    self.kept = Kept.from_json(doubt)
                except ValueError as exc:  # the time is still good: the doubt alone is damaged
                    self._kept_damage = str(exc)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            return None, f"the heartbeat is damaged ({exc}); taken as missing, written again"
        return held, None

    def evidence(self) -> list[Evidence]:
        """The time held as evidence for the start's verdict (none when missing or damaged)."""
        if self.held is None:
            return []
        return [Evidence(f"the heartbeat {self.path} ({iso(self.held)})", self.held, good=True)]

    def judge(self, now: float, mono: float) -> Evidence | None:
        """At start, the clock reading `now` more than a day behind the heartbeat: evidence that
        it is set (the kernel says NTP keeps it synchronised), or None and a doubt `settle`
        ends. Said once either way, in words, with what to do. The kernel is no second opinion
        when it said synchronised as the heartbeat was written too (`held_synchronised`): two
        NTP answers days apart, one source was wrong (a bad server) or the clock now is slewed,
        not stepped, towards the time (chrony without `makestep` says synchronised while it
        slews a large offset); trusted, it moved a right heartbeat's readings a month back."""
        if self.held is None or self.held - now <= UNSYNCED_AT_START or now < self.floor:
            return None  # not behind it, or unset for sure (before this release: no doubt)
        synced = self.kernel.synchronised() if self.kernel is not None else None
        said = self._said(now)
        if synced and not self.held_synchronised:
            log.warning(
                "%s, and the kernel says the clock is synchronised (NTP): the clock that wrote it"
                " was wrong in the future (an RTC set ahead, a bad NTP server). The records it"
                " stamped ahead are taken for a step back: a meter's readings ahead of the clock"
                " are moved below now (audited as found at start: `monitor meters show`, the"
                " export's flags), and the heartbeat is written anew. If it is this clock that is"
                " wrong, stop the daemon, set the clock (its NTP server) and start it again",
                said,
            )
            return self._settled("the kernel says NTP keeps it synchronised", now)
        kept = self._kept_here(now)
        if kept is not None and kept.settled is not None:
            log.warning(
                "%s: taken as right in this boot at %s (%s), and the clock has not stepped since;"
                " the heartbeat is written anew",
                said, iso(kept.wall), kept.settled,
            )  # fmt: skip
            return self._sure(f"{kept.settled}, at {iso(kept.wall)} in this boot", now)
        # A reload's new daemon goes on counting (a config pushed every few days, a reload each
        # time, kept the clock in doubt for ever); the same process's monotonic clock. So does
        # a restart's, on the steady run the file kept in this boot.
        runs = [mono, self._carried, kept.steady_since if kept is not None else None]
        self.steady_since = since = min(t for t in runs if t is not None)
        self._keep(now, steady_since=since)
        self.ntp_disagrees = bool(synced)
        if synced:  # and said so when the heartbeat was written
            kernel = (
                "says it is synchronised (NTP), but said so too when the heartbeat was written: one"
                " of the two NTP answers was wrong, or a large offset is being slewed, not stepped"
            )
            cure = ""
        else:
            kernel = "does not say the clock is synchronised" if synced is False else "cannot be asked"
            cure = (
                " once the kernel says it is synchronised (`timedatectl set-ntp true`, or chrony; at"
                " the next minute), or"
            )
        log.warning(
            "%s, and nothing says which is right (the kernel %s): this clock is not set yet (NTP"
            " steps it forward; nothing to do) or the clock that wrote the heartbeat was wrong in"
            " the future (an RTC set ahead, a bad NTP server). Nothing is moved until it is known."
            " If `date -u` is right: it is taken as right%s once it has run %.0f days without a"
            " step (at %s by this clock)",
            said, kernel, cure, STEADY / 86_400, iso(now + STEADY - (mono - since)),
        )  # fmt: skip
        return None

    def settle(self, now: float, mono: float) -> Evidence | None:
        """While the clock is in doubt (`judge`), each tick: evidence that it is right once the
        kernel says it is synchronised or it has run `STEADY` without a step (said once); the
        doubt simply ends when the clock reaches the heartbeat's day (NTP set an unset clock)."""
        if self.steady_since is None or self.held is None:
            return None
        if self.held - now <= UNSYNCED_AT_START:
            self.steady_since = None
            return None
        self._keep_soon(now, mono)
        if self.kernel is not None and not self.held_synchronised and self.kernel.synchronised():
            why = "the kernel says it is synchronised (NTP)"
        elif mono - self.steady_since >= STEADY:
            why = f"it has run {(mono - self.steady_since) / 86_400:.1f} days without a step"
        else:
            return None
        self.steady_since = None
        self._keep(now, settled=why)  # before the rows move: a kill -9 between
        log.warning(
            "gateway clock %s taken as right, %.1f days behind the heartbeat %s: %s. The heartbeat"
            " was written by a clock wrong in the future: a meter's readings stamped ahead of the"
            " clock are moved below now (audited as found at start), and the heartbeat is written"
            " anew",
            iso(now), (self.held - now) / 86_400, self.path, why,
        )  # fmt: skip
        return self._sure(why, now)

    def doubt(self, now: float, mono: float) -> tuple[float, float, bool]:
        """While in doubt (`judge`): how far the heartbeat is ahead of the clock, the seconds
        of steady running before it is taken as right, and whether the kernel said
        synchronised both times (`ntp_disagrees`); (0, 0, False) otherwise (/api/health)."""
        if self.steady_since is None or self.held is None:
            return 0.0, 0.0, False
        left = max(0.0, STEADY - (mono - self.steady_since))
        return max(0.0, self.held - now), left, self.ntp_disagrees

    def stepped(self, now: float, mono: float) -> None:
        """The clock stepped to `now`: a steady run in doubt starts again (an unset clock is
        stepped), kept for a restart (`_keep_soon`)."""
        if self.steady_since is not None:
            self.steady_since = mono
            self._unkept = True
            self._keep_soon(now, mono)

    def _keep_soon(self, now: float, mono: float) -> None:
        """Keep a steady run that started again, at most once per `EVERY` of the awake clock: a
        clock flapping each second wrote (and fsynced) the file each second. Until it is kept,
        the record held is of a clock that stepped since: a restart starts the 7 days again
        (`_kept_here`), or, the clock stepped back onto the record's line, counts from the step
        kept before (under a minute of the 7 days), never from before it."""
        if self._unkept and self.steady_since is not None and mono - self._kept_mono >= self.every:
            self._unkept = False
            self._kept_mono = mono
            self._keep(now, steady_since=self.steady_since)

    def _kept_here(self, now: float) -> Kept | None:
        """The doubt the file kept, if it holds for this clock (`Kept.here`); None otherwise,
        and for a clock the kernel knows nothing of (a test's or the demo's). A record no
        daemon of this boot wrote is damage, said once: the 7 days start again."""
        if self.kernel is None:
            return None
        damage = self._kept_damage
        if self.kept is not None:
            holds, damage = self.kept.here(self.kernel.boot_id(), self.kernel.since_boot(), now)
            if holds:
                return self.kept
        if damage is not None:
            log.warning(
                "the heartbeat %s keeps a doubt record that is damaged (%s): not kept, the clock"
                " in doubt counts %.0f days without a step again", self.path, damage, STEADY / 86_400,
            )  # fmt: skip
        return None

    def _settled(self, why: str, now: float) -> Evidence:
        """The clock taken as right at start: kept before the rows move (`_keep`)."""
        self._keep(now, settled=why)
        return self._sure(why, now)

    def _keep(self, now: float, steady_since: float | None = None, settled: str | None = None) -> None:
        """Keep the doubt of the heartbeat's time in its file for a restart (its `time` and
        the keys of its write untouched), stamped with this boot and CLOCK_BOOTTIME now. Not
        without the kernel's boot (nothing to tell the next start's clock by). Refused (a full
        disk): counted and logged as a refused beat; a restart then starts the 7 days again."""
        boot = self.kernel.boot_id() if self.kernel is not None else None
        if boot is None or self.held is None or self.kernel is None:
            return
        kept = Kept(boot, self.kernel.since_boot(), now, steady_since, settled)
        held = self.held
        doc: dict[str, object] = {"format": FORMAT, "version": VERSION, "time": held, "iso": iso(held)}
        written_boot, since = self.boot
        if written_boot is not None and since is not None:
            doc.update(boot_id=written_boot, since_boot=since)
        if self.held_synchronised is not None:
            doc["synchronised"] = self.held_synchronised
        doc["doubt"] = kept.to_json()
        if self._write(doc):
            self.kept = kept

    @staticmethod
    def _sure(what: str, now: float) -> Evidence:
        """Evidence that the clock reading `now` is set: it outweighs the records ahead."""
        return Evidence(what, now, good=True, sure=True)

    def _said(self, now: float) -> str:
        """What the heartbeat says against the clock reading `now`, and where it was written."""
        boot, since = self.boot
        where = ""
        if self.kernel is not None and boot is not None:
            if boot != self.kernel.boot_id():
                where = " in an earlier boot"
            elif since is not None and self.held is not None:
                ago = self.kernel.since_boot() - since
                back = self.held + ago - now
                where = f" in this boot {ago / 3600:.1f} h ago (the clock stepped back"
                where += f" {back / 86_400:.1f} days since)"
        assert self.held is not None
        return (
            f"the heartbeat {self.path} says the gateway clock read {iso(self.held)} at its last write"
            f"{where}, {(self.held - now) / 86_400:.1f} days ahead of it now ({iso(now)})"
        )

    def plausible(self, now: float) -> bool:
        """Whether the clock may be written here: judged, not before the release, not a day
        behind what the station held at start."""
        if self.not_before is None or not math.isfinite(now):
            return False
        return now >= self.floor and now >= self.not_before - UNSYNCED_AT_START

    def beat(self, now: float, force: bool = False) -> bool:
        """Write `now` if the clock is plausible and a minute passed since the last write (or
        `force`: a clean stop); True when written."""
        if not force and abs(now - self._written) < self.every:
            return False
        if not self.plausible(now):
            if self.not_before is not None and not self._told_implausible:
                self._told_implausible = True
                log.info(
                    "gateway clock %s is not written to %s: before this release or more than a day"
                    " behind the station's records (not set yet?); written once it is", iso(now), self.path,
                )  # fmt: skip
            return False
        self._told_implausible = False
        doc: dict[str, object] = {"format": FORMAT, "version": VERSION, "time": now, "iso": iso(now)}
        if self.kernel is not None:  # read by `_said` at the next start; ignored by the last release
            doc.update(
                boot_id=self.kernel.boot_id(),
                since_boot=self.kernel.since_boot(),
                synchronised=self.kernel.synchronised(),
            )
        if not self._write(doc):
            self._written = now  # tried: again in a minute, not every tick
            return False
        self._written = now
        self.kept = None  # the time written supersedes any doubt kept
        return True

    def _write(self, doc: dict[str, object]) -> bool:
        """Replace the file with `doc`, atomically; a refusal counted and logged once."""
        data = (json.dumps(doc) + "\n").encode("utf-8")
        try:
            replace_file(self.path, lambda f: f.write(data))
        except OSError as exc:
            self.failures += 1
            if not self._failing:
                self._failing = True
                log.warning(
                    "cannot write the heartbeat %s (%s): the next start tells an unset clock from"
                    " bad meter stamps by what it last held", self.path, exc.strerror or exc,
                )  # fmt: skip
            return False
        if self._failing:
            self._failing = False
            log.info("heartbeat %s written again", self.path)
        return True
