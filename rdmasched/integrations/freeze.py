"""Preemption that the OS enforces: hold a group of processes, stop and resume them for real.

A `Freezer` holds co-located low-priority work (processes, and the children they spawn) and
stops it on `freeze()`, resumes it on `thaw()`, each call returning once the kernel confirms
the new state. Two mechanisms (docs/PREEMPTION.md says which is chosen when, and why):

- ``"cgroup"``: a child group of the cgroup v2 hierarchy (found in /proc/self/mounts: the
  ``cgroup2`` mount, which on hybrid machines sits beside the v1 controllers, e.g. at
  /sys/fs/cgroup/unified). Processes are moved in through ``cgroup.procs``; ``cgroup.freeze``
  freezes and thaws the whole group (children the work forks are in it from birth), and
  the call waits until ``cgroup.events`` says ``frozen 1`` / ``frozen 0``: re-read after
  20, 40, ... us, then waited for with poll() (POLLPRI: the kernel's change notification)
  and re-read at least every 1 ms, as the kernel sends at most one notification per 10 ms.
  Needs root or a delegated subtree (pass ``parent=``).
- ``"signal"``: SIGSTOP / SIGCONT to every process of the group, sent through pidfds (a
  recycled pid is never signalled). The group is the processes added, their descendants
  (found by walking the ppid links of /proc/<pid>/stat, again at every freeze, until no
  new one appears) and, for an added process that leads its own session, every process of
  that session. Stopped means every thread of each is 'T' in /proc/<pid>/task/<tid>/stat.

``mechanism="auto"`` (the default) takes the cgroup where one is writable, else signals; the
choice and its reason are in `Freezer.mechanism`, `Freezer.reason` and a log line on the
``rdmasched.freeze`` logger. A process that exits while held is dropped, not an error.

``Freezer(kill=True)``: the work dies with its freezer. `close()` (and the owner's normal
exit) kills the group (SIGKILL; the cgroup's ``cgroup.kill`` where the kernel has it) and
removes the cgroup; and a **reaper** process, started with the freezer in a session of its
own, watches the owner through a pidfd: if the owner dies without `close()` (SIGKILL, a
crash, a launcher's SIGTERM that ends it before any ``finally``), the reaper kills the
group and removes the cgroup. The owner tells it what to reap on a pipe (the cgroup, or
each process added under signals) and says ``done`` when it has closed the group itself.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from rdmasched.errors import ArgumentError, ArgumentTypeError, RdmaschedError

_log = logging.getLogger("rdmasched.freeze")

MECHANISMS = ("cgroup", "signal")
#: how long freeze(), thaw() and close() wait for the kernel to confirm, by default
DEFAULT_TIMEOUT_S = 10.0
#: cgroup.events is re-read at least this often while waiting, even without a notification:
#: the kernel rate-limits its notifications to one per 10 ms per file
#: (CGROUP_FILE_NOTIFY_MIN_INTV), so a freeze soon after a thaw would wait for the timer
_EVENTS_POLL_MS = 1
#: looks at /proc for children of an added process forked outside the group (one per
#: generation forked while its parent was being moved in)
_LATE_CHILD_ROUNDS = 100


# ---- errors ----------------------------------------------------------------------------------
class FreezeError(RdmaschedError):
    """A freezer that cannot do what was asked."""


class NoSuchProcessError(FreezeError, ProcessLookupError):
    """The pid given to `Freezer.add` does not exist (or has already exited)."""


class FreezePermissionError(FreezeError, PermissionError):
    """The kernel refused: a cgroup file that cannot be written, a process that cannot be
    signalled. The message names the file or the pid."""


class FreezerUnavailableError(FreezeError, OSError):
    """The mechanism asked for cannot be used here (no cgroup2 mount, read-only, a parent
    that is not a cgroup v2 directory, a kernel without cgroup.freeze)."""


class FreezeTimeoutError(FreezeError, TimeoutError):
    """The kernel did not confirm the new state in time (a process in uninterruptible
    sleep holds a cgroup freeze back). The group stays as asked: thaw() undoes a freeze."""


class FreezerClosedError(FreezeError, ValueError):
    """The freezer was closed."""


# ---- parsing (pure) --------------------------------------------------------------------------
PF_KTHREAD = 0x00200000


def _unescape(field: str) -> str:
    """A field of /proc/self/mounts: spaces, tabs, newlines and backslashes are octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def cgroup2_mounts(mounts: str) -> list[tuple[str, bool]]:
    """(mount point, read-only) of every ``cgroup2`` mount in a /proc/self/mounts text."""
    out: list[tuple[str, bool]] = []
    for line in mounts.splitlines():
        f = line.split()
        if len(f) >= 4 and f[2] == "cgroup2":
            out.append((_unescape(f[1]), "ro" in f[3].split(",")))
    return out


def cgroup2_path(cgroup: str) -> str | None:
    """The v2 group (``0::/path`` line) of a /proc/<pid>/cgroup text, or None."""
    for line in cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:] or "/"
    return None


@dataclass(frozen=True, slots=True)
class ProcStat:
    """The fields of /proc/<pid>/stat that the freezer reads."""

    pid: int
    comm: str
    state: str  #: R running, S/D sleeping, T stopped, t traced, Z zombie, X dead, ...
    ppid: int
    pgrp: int
    session: int
    flags: int  #: the kernel's PF_* flags (PF_KTHREAD: a kernel thread)
    utime: int  #: clock ticks in user mode
    stime: int  #: clock ticks in kernel mode
    starttime: int  #: clock ticks after boot: with the pid, the identity of a process


def parse_stat(text: str) -> ProcStat:
    """Parse a /proc/<pid>/stat (or task stat) line; ValueError if it is not one."""
    lp, rp = text.find("("), text.rfind(")")
    if lp <= 0 or rp < lp:
        raise ValueError(f"not a /proc stat line: {text[:60]!r}")
    rest = text[rp + 2 :].split()
    if len(rest) < 20:
        raise ValueError(f"a /proc stat line with {len(rest) + 2} fields, not >= 22")
    return ProcStat(
        int(text[:lp]),
        text[lp + 1 : rp],
        rest[0],
        int(rest[1]),
        int(rest[2]),
        int(rest[3]),
        int(rest[6]),
        int(rest[11]),
        int(rest[12]),
        int(rest[19]),
    )


def parse_events(text: str) -> dict[str, int]:
    """``key value`` lines of cgroup.events."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        k, _, v = line.partition(" ")
        if v.strip().lstrip("-").isdigit():
            out[k] = int(v)
    return out


# ---- /proc -----------------------------------------------------------------------------------
def _read(path: str) -> str | None:
    """A small file of /proc or cgroupfs (one read: what the kernel generates at once)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, ProcessLookupError):
        return None
    try:
        data = os.read(fd, 65536)
        while len(data) % 65536 == 0 and data:  # a long file (cgroup.procs): to its end
            more = os.read(fd, 65536)
            if not more:
                break
            data += more
        return data.decode("utf-8", "replace")
    except ProcessLookupError:  # the process exited between open and read
        return None
    finally:
        os.close(fd)


def read_stat(pid: int) -> ProcStat | None:
    """/proc/<pid>/stat, or None if there is no such process."""
    text = _read(f"/proc/{pid}/stat")
    return parse_stat(text) if text else None


def thread_states(pid: int) -> list[str] | None:
    """The state letter of every thread of `pid`, or None if it is gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return None
    out = []
    for tid in tids:
        text = _read(f"/proc/{pid}/task/{tid}/stat")
        if text:  # a thread that exited in between is not running
            out.append(text[text.rfind(")") + 2])
    return out


def proc_table() -> dict[int, ProcStat]:
    """Every process of this pid namespace, from /proc."""
    out: dict[int, ProcStat] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = read_stat(int(name))
            if st is not None:
                out[st.pid] = st
    return out


def _self_and_ancestors(table: dict[int, ProcStat] | None = None) -> set[int]:
    out: set[int] = set()
    pid = os.getpid()
    while pid > 0 and pid not in out:
        out.add(pid)
        st = table.get(pid) if table is not None else read_stat(pid)
        if st is None:
            break
        pid = st.ppid
    return out


def descendants(roots: Iterable[int], table: dict[int, ProcStat]) -> set[int]:
    kids: dict[int, list[int]] = {}
    for st in table.values():
        if not st.flags & PF_KTHREAD:
            kids.setdefault(st.ppid, []).append(st.pid)
    out: set[int] = set()
    todo = list(roots)
    while todo:
        for k in kids.get(todo.pop(), ()):
            if k not in out:
                out.add(k)
                todo.append(k)
    return out


def find_cgroup2() -> str | None:
    """The first writable-mounted cgroup v2 hierarchy in /proc/self/mounts, or None."""
    for mount, ro in cgroup2_mounts(_read("/proc/self/mounts") or ""):
        if not ro:
            return mount
    return None


def _wait(cond: Callable[[], bool], deadline: float, what: Callable[[], str]) -> None:
    """Poll `cond` with a backoff from 20 us to 1 ms until it holds or `deadline` passes."""
    delay = 0.0
    while not cond():
        if time.monotonic() > deadline:
            raise FreezeTimeoutError(what())
        time.sleep(delay)
        delay = min(delay * 2 or 20e-6, 1e-3)


# ---- the cgroup v2 mechanism -----------------------------------------------------------------
_names = iter(range(1, 1 << 62))


class _Cgroup:
    mechanism = "cgroup"

    def __init__(self, parent: str | None, name: str | None) -> None:
        mounts = cgroup2_mounts(_read("/proc/self/mounts") or "")
        if not mounts:
            raise FreezerUnavailableError("no cgroup2 mount in /proc/self/mounts")
        if parent is None:
            rw = [m for m, ro in mounts if not ro]
            if not rw:
                raise FreezerUnavailableError(
                    f"the cgroup2 mount {mounts[0][0]} is read-only (/proc/self/mounts)"
                )
            self.mount = rw[0]
            own = cgroup2_path(_read("/proc/self/cgroup") or "") or "/"
            parent = os.path.join(self.mount, own.lstrip("/"))
            if not os.path.isdir(parent):  # another cgroup namespace: the mount's root
                parent = self.mount
        else:
            real = os.path.realpath(parent)
            found = [
                (m, ro) for m, ro in mounts if real == m or real.startswith(m.rstrip("/") + "/")
            ]
            if not found or not os.path.isfile(os.path.join(real, "cgroup.procs")):
                raise FreezerUnavailableError(
                    f"{parent} is not a directory of a cgroup v2 hierarchy "
                    f"(cgroup2 mounts: {', '.join(m for m, _ in mounts)})"
                )
            mount, ro = max(found, key=lambda f: len(f[0]))  # the innermost mount
            if ro:
                raise FreezerUnavailableError(f"the cgroup2 mount {mount} is read-only")
            self.mount, parent = mount, real
        self.parent = parent
        self.path = os.path.join(parent, name or f"rdmasched-freeze-{os.getpid()}-{next(_names)}")
        try:
            os.mkdir(self.path)
        except PermissionError as exc:
            raise FreezePermissionError(
                f"permission denied creating {self.path} (cgroup v2 needs root or a "
                "delegated subtree: pass parent=)"
            ) from exc
        except OSError as exc:
            raise FreezerUnavailableError(f"cannot create {self.path}: {exc.strerror}") from exc
        self.frozen = False
        self.origin: dict[int, str] = {}
        self._events = -1
        try:
            if not os.path.isfile(os.path.join(self.path, "cgroup.freeze")):
                raise FreezerUnavailableError(
                    f"{self.path} has no cgroup.freeze (the kernel predates 5.2)"
                )
            self._write("cgroup.freeze", "0")  # proves the group is ours to freeze
            self._events = os.open(os.path.join(self.path, "cgroup.events"), os.O_RDONLY)
        except BaseException:
            self._remove()
            raise

    def _write(self, name: str, text: str, path: str | None = None) -> None:
        file = os.path.join(path or self.path, name)
        try:
            fd = os.open(file, os.O_WRONLY)
        except PermissionError as exc:
            raise FreezePermissionError(f"permission denied opening {file}") from exc
        except OSError as exc:  # the group was removed under us, say
            raise FreezeError(f"cannot open {file}: {exc.strerror}") from exc
        try:
            os.write(fd, text.encode())
        except PermissionError as exc:
            hint = (
                " (moving a process needs write access to cgroup.procs of the common "
                "ancestor of both groups too)"
                if name == "cgroup.procs"
                else ""
            )
            raise FreezePermissionError(
                f"permission denied writing {text!r} to {file}{hint}"
            ) from exc
        except ProcessLookupError:
            raise  # the process exited: the callers drop it
        except OSError as exc:
            raise FreezeError(f"cannot write {text!r} to {file}: {exc.strerror}") from exc
        finally:
            os.close(fd)

    def _events_state(self) -> dict[str, int]:
        os.lseek(self._events, 0, os.SEEK_SET)
        return parse_events(os.read(self._events, 4096).decode())

    def _wait_frozen(self, want: int, deadline: float) -> None:
        """Until cgroup.events says ``frozen <want>``: re-read after 20, 40, ... us, then
        poll() it for the kernel's notification, re-reading at least every 1 ms (the
        kernel sends at most one notification per 10 ms per file)."""
        poller = select.poll()
        poller.register(self._events, select.POLLPRI)
        delay = 0.0
        while True:
            ev = self._events_state()  # the read re-arms the notification
            if ev.get("frozen") == want:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise FreezeTimeoutError(
                    f"{self.path}/cgroup.events still says frozen {ev.get('frozen')} "
                    f"(processes: {self.pids()})"
                )
            if delay < _EVENTS_POLL_MS / 1000:
                time.sleep(delay)
                delay = delay * 2 or 20e-6
            else:
                poller.poll(_EVENTS_POLL_MS)

    def add(self, pids: list[int], children: bool) -> list[int]:
        """Move `pids` in; the ones that no longer exist are returned. (What they fork
        later is born in the group whatever `children` says.)"""
        gone = []
        for p in pids:
            origin = cgroup2_path(_read(f"/proc/{p}/cgroup") or "")
            try:
                self._write("cgroup.procs", str(p))
            except ProcessLookupError:
                gone.append(p)
                continue
            if origin is not None:
                self.origin.setdefault(p, os.path.join(self.mount, origin.lstrip("/")))
        return gone

    def _groups(self) -> list[str]:
        """This group and every group created below it (by the work, say), deepest first."""
        return [d for d, _, _ in os.walk(self.path, topdown=False)]

    def pids(self) -> list[int]:
        out: set[int] = set()
        for g in self._groups():
            out.update(int(x) for x in (_read(os.path.join(g, "cgroup.procs")) or "").split())
        return sorted(out)

    def freeze(self, deadline: float) -> None:
        self._write("cgroup.freeze", "1")
        self.frozen = True
        self._wait_frozen(1, deadline)

    def thaw(self, deadline: float) -> None:
        self._write("cgroup.freeze", "0")
        self.frozen = False
        self._wait_frozen(0, deadline)

    def _move_out(self, group: str) -> None:
        for p in (int(x) for x in (_read(os.path.join(group, "cgroup.procs")) or "").split()):
            dest = self.origin.get(p, self.parent)
            if dest.startswith(self.path + "/") or dest == self.path or not os.path.isdir(dest):
                dest = self.parent
            try:
                self._write("cgroup.procs", str(p), dest)
            except ProcessLookupError:
                continue
            except FreezeError:
                if dest == self.parent:
                    raise
                try:  # the origin does not take processes (any more): the parent does
                    self._write("cgroup.procs", str(p), self.parent)
                except ProcessLookupError:
                    continue

    def _remove(self) -> None:
        if self._events >= 0:
            os.close(self._events)
            self._events = -1
        os.rmdir(self.path)

    def close(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        try:
            if self.frozen:
                self.thaw(deadline)
        except FreezeError as exc:
            _log.warning("freezer %s: thaw before close: %s", self.path, exc)
        if self._events >= 0:  # the open file first, then the group
            os.close(self._events)
            self._events = -1
        while True:  # groups below ours (children) first, then ours
            try:
                for g in self._groups():
                    self._move_out(g)
                    os.rmdir(g)
                return
            except FreezeError:
                raise
            except FileNotFoundError:
                continue  # a group went away under us: walk again
            except OSError as exc:  # EBUSY: a process forked while we moved its parent
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise FreezeError(f"cannot remove {exc.filename}: {exc.strerror}") from exc
                time.sleep(0.001)

    def kill(self, timeout: float) -> None:
        """Kill every process of the group and of the groups below it; remove them."""
        if self._events >= 0:
            os.close(self._events)
            self._events = -1
        kill_cgroup(self.path, time.monotonic() + timeout)
        self.frozen = False

    def describe(self) -> str:
        return (
            f"cgroup v2 group {self.path}, frozen through cgroup.freeze "
            "(confirmed by cgroup.events: re-read with a backoff, then poll())"
        )


# ---- the signal mechanism --------------------------------------------------------------------
class _Proc:
    __slots__ = ("fd", "pid", "start")

    def __init__(self, pid: int, start: int, fd: int) -> None:
        self.pid, self.start, self.fd = pid, start, fd


class _Signals:
    mechanism = "signal"
    path = None

    def __init__(self) -> None:
        self.frozen = False
        self.roots: set[int] = set()  # added by the user
        self.follow: set[int] = set()  # members whose descendants are members too
        self.members: dict[int, _Proc] = {}

    def _open(self, st: ProcStat) -> _Proc | None:
        try:
            fd = os.pidfd_open(st.pid)
        except ProcessLookupError:
            return None
        now = read_stat(st.pid)
        if now is None or now.starttime != st.starttime or now.state in "ZX":
            os.close(fd)  # a different process behind the pid now, or it has exited
            return None
        return _Proc(st.pid, st.starttime, fd)

    def _drop(self, pid: int) -> None:
        p = self.members.pop(pid, None)
        if p is not None:
            os.close(p.fd)
        self.roots.discard(pid)
        self.follow.discard(pid)

    def _send(self, p: _Proc, sig: int) -> bool:
        try:
            signal.pidfd_send_signal(p.fd, sig)
        except ProcessLookupError:
            self._drop(p.pid)
            return False
        except PermissionError as exc:
            name = signal.Signals(sig).name if sig else "a signal"
            raise FreezePermissionError(
                f"permission denied sending {name} to pid {p.pid}: the freezer runs as uid "
                f"{os.getuid()} and may signal only its own user's processes (or run as root)"
            ) from exc
        return True

    def sweep(self) -> list[_Proc]:
        """Refresh the members from /proc: drop the dead, add new descendants (and session
        members of a root that leads its session). Returns the new members. Without
        children to follow, it reads only the members' own stat files, not all of /proc."""
        if not self.follow:
            for pid, p in list(self.members.items()):
                st = read_stat(pid)
                if st is None or st.starttime != p.start or st.state in "ZX":
                    self._drop(pid)
            return []
        table = proc_table()
        for pid, p in list(self.members.items()):
            st = table.get(pid)
            if st is None or st.starttime != p.start or st.state in "ZX":
                self._drop(pid)
        leaders = {r for r in self.roots & self.follow if (st := table.get(r)) and st.session == r}
        found = descendants(self.follow, table)
        if leaders:
            found |= {pid for pid, st in table.items() if st.session in leaders}
        found -= _self_and_ancestors(table)
        new = []
        for pid in sorted(found - self.members.keys()):
            st = table[pid]
            if st.state in "ZX":
                continue
            q = self._open(st)
            if q is not None:
                self.members[pid] = q
                self.follow.add(pid)
                new.append(q)
        return new

    def add(self, pids: list[int], children: bool) -> list[int]:
        gone = []
        for pid in pids:
            st = read_stat(pid)
            p = self._open(st) if st is not None else None
            if p is None:
                gone.append(pid)
                continue
            try:
                self._send(p, 0)  # may we signal it? a clear error now, not at freeze
            except BaseException:
                os.close(p.fd)
                raise
            old = self.members.pop(pid, None)
            if old is not None:
                os.close(old.fd)
            self.members[pid] = p
            if children:
                self.follow.add(pid)
        self.roots |= set(pids) - set(gone)
        return gone

    def pids(self) -> list[int]:
        self.sweep()
        return sorted(self.members)

    def _stopped(self, p: _Proc) -> bool:
        states = thread_states(p.pid)
        return states is None or all(s in "TtZX" for s in states)

    def _running(self, p: _Proc) -> bool:
        states = thread_states(p.pid)
        return states is None or not any(s == "T" for s in states)

    def freeze(self, deadline: float) -> None:
        self.frozen = True
        # the members known first (the pidfds make a recycled pid harmless), then sweeps:
        # once every member is stopped none can fork, and children forked before that are
        # in /proc already, so when a sweep finds no new one the whole group is held
        todo = list(self.members.values())
        while todo:
            for p in todo:
                self._send(p, signal.SIGSTOP)
            self._wait_all([p for p in todo if p.pid in self.members], deadline)
            todo = self.sweep()

    def _wait_all(self, live: list[_Proc], deadline: float) -> None:
        _wait(
            lambda: all(self._stopped(p) for p in live),
            deadline,
            lambda: (
                "not stopped (no 'T' in /proc/<pid>/task/*/stat): "
                + ", ".join(str(p.pid) for p in live if not self._stopped(p))
            ),
        )

    def thaw(self, deadline: float) -> None:
        self.frozen = False
        live = [p for p in list(self.members.values()) if self._send(p, signal.SIGCONT)]
        _wait(
            lambda: all(self._running(p) for p in live),
            deadline,
            lambda: (
                "still stopped after SIGCONT: "
                + ", ".join(str(p.pid) for p in live if not self._running(p))
            ),
        )

    def close(self, timeout: float) -> None:
        try:
            if self.frozen:
                self.thaw(time.monotonic() + timeout)
        except FreezeError as exc:
            _log.warning("freezer (signals): thaw before close: %s", exc)
        finally:
            for pid in list(self.members):
                self._drop(pid)

    def kill(self, timeout: float) -> None:
        """Kill every member, its descendants and, for a root that leads its session, that
        session."""
        self.sweep()
        roots = {p.pid: p.start for p in self.members.values()}
        for pid in list(self.members):
            self._drop(pid)
        self.frozen = False
        kill_processes(roots, time.monotonic() + timeout)

    def describe(self) -> str:
        return (
            "SIGSTOP/SIGCONT to each process and its descendants (through pidfds), "
            "confirmed by 'T' in /proc/<pid>/task/*/stat"
        )


# ---- killing a group: the freezer's close(kill=True) and its reaper --------------------------
def _cgroup_pids(groups: list[str]) -> list[int]:
    return [int(x) for g in groups for x in (_read(os.path.join(g, "cgroup.procs")) or "").split()]


def kill_cgroup(path: str, deadline: float) -> None:
    """SIGKILL every process of cgroup `path` and of the groups below it (``cgroup.kill``
    where the kernel has it: frozen ones too), wait until none is left, then remove the
    groups, deepest first. A group already gone is not an error."""
    while True:
        groups = [d for d, _, _ in os.walk(path, topdown=False)]
        pids = _cgroup_pids(groups)
        if not pids:
            break
        if os.path.isfile(os.path.join(path, "cgroup.kill")):
            with contextlib.suppress(OSError):
                Path(path, "cgroup.kill").write_text("1")
        else:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise FreezeTimeoutError(f"{path}: processes {pids} still there after SIGKILL")
        time.sleep(0.001)
    while True:
        try:
            for g in [d for d, _, _ in os.walk(path, topdown=False)]:
                os.rmdir(g)
            return
        except FileNotFoundError:
            continue  # a group went away under us: walk again
        except OSError as exc:  # EBUSY: the last exits are still being accounted
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise FreezeError(f"cannot remove {exc.filename}: {exc.strerror}") from exc
            time.sleep(0.001)


def kill_processes(roots: dict[int, int], deadline: float) -> None:
    """SIGKILL processes `roots` (pid -> start time: a recycled pid is left alone), their
    descendants and, for a root that leads its session, that session; until none lives."""
    roots = dict(roots)
    while True:
        table = proc_table()
        live = {p for p, start in roots.items() if (st := table.get(p)) and st.starttime == start}
        leaders = {p for p in live if table[p].session == p}
        found = live | descendants(live, table)
        found |= {p for p, st in table.items() if st.session in leaders}
        found -= _self_and_ancestors(table)
        found = {p for p in found if table[p].state not in "ZX"}
        if not found:
            return
        for p in found:
            roots.setdefault(p, table[p].starttime)  # followed once its parent is gone
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise FreezeTimeoutError(f"processes {sorted(found)} still alive after SIGKILL")
        time.sleep(0.001)


class _Reaper:
    """The process that kills a `Freezer(kill=True)`'s group if its owner dies first: told
    what to reap on its stdin (``cgroup PATH``, ``proc PID START``), ``done`` ends it."""

    def __init__(self, timeout: float) -> None:
        root = str(Path(__file__).resolve().parents[2])
        path = os.environ.get("PYTHONPATH")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rdmasched.integrations.freeze", "--reap",
             str(os.getpid()), str(timeout)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,  # a launcher that kills the owner's group spares it
            env={**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")},
        )  # fmt: skip

    def tell(self, line: str) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        try:
            stdin.write(line.encode() + b"\n")
            stdin.flush()
        except (BrokenPipeError, ValueError) as exc:  # it died: the work is not watched
            _log.warning("freezer: the reaper (pid %d) is gone: %s", self.proc.pid, exc)

    def done(self) -> None:
        self.tell("done")
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _reap_main(owner: int, timeout: float) -> int:
    """The reaper: wait until `owner` dies or says ``done``; if it died, kill and remove what
    it told us to."""
    cgroups: list[str] = []
    procs: dict[int, int] = {}
    try:
        pidfd = os.pidfd_open(owner)
    except ProcessLookupError:
        pidfd = -1
    dead = pidfd < 0 or os.getppid() != owner  # (the owner started us: it was our parent)
    poller = select.poll()
    poller.register(0, select.POLLIN)
    if pidfd >= 0:
        poller.register(pidfd, select.POLLIN)
    buf = b""
    while True:
        # once the owner is dead: what it wrote before, without waiting, then reap
        data = b""
        for fd, _ in poller.poll(0 if dead else None):
            if fd == pidfd:
                dead = True
            else:
                data = os.read(0, 65536)
                if not data:  # closed without "done": the owner is gone
                    poller.unregister(0)
                    dead = True
        *lines, buf = (buf + data).split(b"\n")
        for line in lines:
            word, _, rest = line.decode().partition(" ")
            if word == "done":
                return 0
            if word == "cgroup":
                cgroups.append(rest)
            elif word == "proc":
                pid, start = rest.split()
                procs[int(pid)] = int(start)
        if dead and not data:
            break
    deadline = time.monotonic() + timeout
    for path in cgroups:
        with contextlib.suppress(FreezeError):
            kill_cgroup(path, deadline)
    if procs:
        with contextlib.suppress(FreezeError):
            kill_processes(procs, deadline)
    return 0


# ---- the resource ----------------------------------------------------------------------------
def _timeout(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ArgumentTypeError(f"timeout must be a number of seconds, not {value!r}")
    if not 0 < value < 1e9:
        raise ArgumentError(f"timeout must be a finite number of seconds > 0, not {value}")
    return float(value)


def _close(backend: _Cgroup | _Signals, owner: int, timeout: float, reaper: _Reaper | None) -> None:
    """Release the group (with a reaper: kill it), in the process that owns it only (never
    in a forked child); then tell the reaper it is done."""
    if os.getpid() != owner:
        return
    try:
        if reaper is not None:
            backend.kill(timeout)
        else:
            backend.close(timeout)
    finally:
        if reaper is not None:
            reaper.done()


class Freezer:
    """A group of processes that `freeze()` stops and `thaw()` resumes, for real.

    `mechanism`: ``"auto"`` (cgroup v2 where writable, else signals), ``"cgroup"`` or
    ``"signal"`` to force one. `parent`: the cgroup v2 directory to create the group in
    (default: this process's own v2 group; give a delegated subtree when not root). `name`:
    the group's directory name. `timeout`: seconds each call waits for the kernel. `kill`:
    the work dies with the freezer: `close()` kills it instead of releasing it, and a reaper
    process kills it if this process dies without closing (the module's docstring).

    One owner: the process that creates a freezer owns its group (the cgroup directory, the
    pidfds); a forked child that inherits the object cannot use it, and its close() (or
    exit) leaves the group alone. `close()` (or the end of a ``with`` block, or the owner's
    normal exit) thaws the work, then releases the children before the parents: the open
    files, then the processes (moved back to the groups they came from, else the parent
    group), then any group created below ours, then ours; the processes are left running.
    `close()` is safe twice; every call after it raises `FreezerClosedError`. All methods
    are thread-safe (one lock). With `kill`, `close()` (and the owner's exit or death)
    kills every process of the group, their children included, and removes the group.
    """

    def __init__(
        self,
        mechanism: str = "auto",
        *,
        parent: str | None = None,
        name: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        kill: bool = False,
    ) -> None:
        if mechanism not in ("auto", *MECHANISMS):
            raise ArgumentError(
                f"mechanism must be 'auto', 'cgroup' or 'signal', not {mechanism!r}"
            )
        if name is not None and (not name or "/" in name or name in (".", "..")):
            raise ArgumentError(f"name must be one directory name, not {name!r}")
        self.timeout = _timeout(timeout)
        self._lock = threading.RLock()
        self._closed = False
        self._owner = os.getpid()
        backend: _Cgroup | _Signals | None = None
        reason = f"{mechanism} asked for"
        if mechanism in ("auto", "cgroup"):
            try:
                backend = _Cgroup(parent, name)
            except (FreezePermissionError, FreezerUnavailableError) as exc:
                if mechanism == "cgroup":
                    raise
                reason = f"cgroup v2 not usable: {exc}"
            else:
                reason = "cgroup v2 is writable here" if mechanism == "auto" else reason
        if backend is None:
            backend = _Signals()
        self._backend = backend
        self.reason = reason
        #: with `kill`: the process that kills the group if this one dies first
        self._reaper: _Reaper | None = None
        if kill:
            try:
                self._reaper = _Reaper(self.timeout)
            except BaseException:
                backend.close(self.timeout)
                raise
            if backend.path is not None:
                self._reaper.tell(f"cgroup {backend.path}")
        self._finalize = weakref.finalize(
            self, _close, backend, self._owner, self.timeout, self._reaper
        )
        _log.info("freezer: %s (%s)", backend.describe(), reason)

    # ---- state -------------------------------------------------------------------------------
    @property
    def mechanism(self) -> str:
        """``"cgroup"`` or ``"signal"``: the mechanism in use."""
        return self._backend.mechanism

    @property
    def path(self) -> str | None:
        """The cgroup directory of the group (None with signals, or once closed)."""
        return None if self._closed else self._backend.path

    @property
    def frozen(self) -> bool:
        return self._backend.frozen

    @property
    def closed(self) -> bool:
        return self._closed

    def pids(self) -> list[int]:
        """The live processes held now (children the work spawned included), sorted."""
        with self._lock:
            self._check()
            return self._backend.pids()

    # ---- operations --------------------------------------------------------------------------
    def add(self, pid: int, *, children: bool = True) -> None:
        """Hold process `pid` and its children, now and later. With `children=False` the
        process alone: its current children stay out; under signals its future ones too
        (and while no member follows children a freeze reads no /proc but the members'
        own files: faster), under the cgroup they are born in the group. Added to a frozen group,
        it is frozen before this returns. Raises `NoSuchProcessError` for a pid that does
        not exist or has exited, `ArgumentError` for this process or one of its ancestors,
        `FreezePermissionError` when the kernel refuses."""
        if isinstance(pid, bool) or not hasattr(pid, "__index__"):
            raise ArgumentTypeError(f"pid must be an integer, not {pid!r}")
        pid = int(pid)
        if pid <= 0:
            raise ArgumentError(f"pid must be > 0, not {pid}")
        with self._lock:
            self._check()
            st = read_stat(pid)
            if st is None:
                raise NoSuchProcessError(f"pid {pid} does not exist")
            if st.state in "ZX":
                raise NoSuchProcessError(f"pid {pid} ({st.comm}) has exited (a zombie)")
            if st.flags & PF_KTHREAD:
                raise ArgumentError(f"pid {pid} ({st.comm}) is a kernel thread: it cannot be held")
            table = proc_table() if children else {pid: st}
            if pid in _self_and_ancestors(table if children else None):
                raise ArgumentError(
                    f"pid {pid} is the calling process or one of its ancestors: "
                    "freezing it would freeze the caller"
                )
            pids = [pid]
            if children:
                pids += sorted(descendants([pid], table) - _self_and_ancestors(table))
            gone = self._backend.add(pids, children)
            if children and isinstance(self._backend, _Cgroup) and pid not in gone:
                self._add_late_children(pid)
            if self._reaper is not None and isinstance(self._backend, _Signals):
                for p in pids:
                    if p not in gone and p in self._backend.members:
                        self._reaper.tell(f"proc {p} {self._backend.members[p].start}")
            if pid in gone:
                raise NoSuchProcessError(f"pid {pid} does not exist (it exited)")
            if self._backend.frozen:
                self._backend.freeze(time.monotonic() + self.timeout)

    def _add_late_children(self, pid: int) -> None:
        """Move in the descendants of `pid` forked after /proc was read but before their
        parent was in the group (born outside it): until a look at /proc finds none outside.
        Once a parent is in, what it forks is born in the group, so this ends."""
        backend = self._backend
        for _ in range(_LATE_CHILD_ROUNDS):
            table = proc_table()
            inside = set(backend.pids())
            late = sorted(descendants([pid], table) - inside - _self_and_ancestors(table))
            if not late:
                return
            backend.add(late, True)
        raise FreezeError(f"pid {pid}: its children kept appearing outside {backend.path}")

    def freeze(self, timeout: float | None = None) -> None:
        """Stop every process of the group; returns once the kernel says all are stopped.
        Freezing a frozen group confirms it again (and holds newcomers)."""
        with self._lock:
            self._check()
            self._backend.freeze(time.monotonic() + _timeout(timeout or self.timeout))

    def thaw(self, timeout: float | None = None) -> None:
        """Resume the group; returns once the kernel says it runs. Idempotent."""
        with self._lock:
            self._check()
            if self._backend.frozen:
                self._backend.thaw(time.monotonic() + _timeout(timeout or self.timeout))

    def close(self) -> None:
        """Thaw, release every process (left running), remove the group; with `kill`, kill
        every process of the group instead of releasing it. Safe twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._finalize()

    def _check(self) -> None:
        if self._closed:
            raise FreezerClosedError("the freezer is closed")
        if os.getpid() != self._owner:
            raise FreezeError(
                f"this freezer belongs to pid {self._owner}, which created it; a forked "
                "child cannot use it (its close() leaves the group alone)"
            )

    def __enter__(self) -> Freezer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("frozen" if self.frozen else "thawed")
        where = f" {self._backend.path}" if self._backend.path else ""
        return f"<Freezer {self.mechanism}{where} {state}>"


def cgroup_available(parent: str | None = None) -> tuple[bool, str]:
    """Whether a cgroup v2 group can be created and frozen here: (True, its parent
    directory) or (False, why not). Creates and removes an empty group."""
    try:
        with Freezer("cgroup", parent=parent) as fz:
            return True, os.path.dirname(fz.path or "")
    except FreezeError as exc:
        return False, str(exc)


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "MECHANISMS",
    "FreezeError",
    "FreezePermissionError",
    "FreezeTimeoutError",
    "Freezer",
    "FreezerClosedError",
    "FreezerUnavailableError",
    "NoSuchProcessError",
    "ProcStat",
    "cgroup2_mounts",
    "cgroup2_path",
    "cgroup_available",
    "descendants",
    "find_cgroup2",
    "kill_cgroup",
    "kill_processes",
    "parse_events",
    "parse_stat",
    "proc_table",
    "read_stat",
    "thread_states",
]


if __name__ == "__main__":  # the reaper of a Freezer(kill=True): _Reaper starts it
    if sys.argv[1:2] != ["--reap"] or len(sys.argv) != 4:
        sys.exit("usage: python -m rdmasched.integrations.freeze --reap OWNER_PID TIMEOUT_S")
    sys.exit(_reap_main(int(sys.argv[2]), float(sys.argv[3])))
