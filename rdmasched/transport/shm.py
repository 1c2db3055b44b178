"""shm transport: lanes in POSIX shared memory, for processes on one host.

The receiver creates a lane segment (mode 0600) named after the lane; a sender maps it and
stores slots straight into it, so a write costs the receiver's CPU nothing. The credit word
is a line of the same segment that only the receiver writes. On shm every byte is equally
local to both sides, so keeping it there (rather than in a segment of the sender's) changes
no cache traffic and saves a second mapping; the verbs transport keeps it in the sender's
memory, as the design says.

Crashes: each end of a lane (and a doorbell's creator) holds a **liveness token**: an
open-file-description lock on one byte of the segment (`Token`), which the kernel drops when
the process dies, however it dies, and which a process in any PID namespace sharing the
segment can test (Kubernetes pods, docs/KUBERNETES.md). The header also records each end's
pid and process start time, to name the process in messages. A new receiver that finds a
segment whose owner is gone removes it and starts afresh, even while senders of the old
incarnation still map it; one whose owner is alive gets LaneBusyError naming that process.
A restarted sender takes the next epoch, and the receiver accepts it once it has drained the
previous one, so nothing already written is lost and nothing stale is delivered.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import pwd
import re
import stat
import struct
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

from rdmasched._ring import DEFAULT_GRACE_US, DEFAULT_TIMEOUT_US, check_nslots
from rdmasched._shm import (
    HEADER_BYTES,
    LANE_VERSION,
    MAGIC,
    ShmRxLane,
    ShmSegment,
    ShmTxLane,
    read_header,
    ring_doorbell,
    segment_size,
)
from rdmasched.errors import LaneBusyError, LaneError, PeerDeadError

__all__ = [
    "HEADER_BYTES",
    "CleanupReport",
    "Doorbell",
    "Entry",
    "ShmRxLane",
    "ShmSegment",
    "ShmTxLane",
    "Token",
    "attach_lane",
    "cleanup",
    "create_lane",
    "inspect",
    "lane_segment_name",
    "list_segments",
    "peer_alive",
    "remove_stale",
    "sender_alive",
]

_log = logging.getLogger("rdmasched.shm")
PREFIX = "/rdmasched."
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")
SHM_DIR = "/dev/shm"


def lane_segment_name(name: str) -> str:
    """The POSIX shm name of lane `name` (letters, digits, '_', '.', '-')."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"lane name must match {_NAME.pattern}, not {name!r}")
    return f"{PREFIX}{name}"


def _stat(pid: int) -> list[bytes] | None:
    """Fields 3.. of /proc/PID/stat (state first), or None if there is no such process."""
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces and parentheses; fields after it are plain.
    return data[data.rindex(b")") + 2 :].split()


def process_start(pid: int) -> int | None:
    """The start time of process `pid` (clock ticks after boot), or None if it is gone.

    With the pid it names a process uniquely: a recycled pid has another start time.
    """
    fields = _stat(pid)
    return None if fields is None else int(fields[19])


def alive(pid: int, start: int) -> bool:
    """Process `pid` started at `start` still runs. A zombie (killed or exited, not yet
    reaped by its parent: state Z) does not: it holds no mapping and writes nothing."""
    fields = _stat(pid)
    return fields is not None and fields[0] != b"Z" and int(fields[19]) == start


def describe_pid(pid: int) -> str:
    """'pid N (command line)' for error messages."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = ""
    return f"pid {pid} ({cmd[:120]})" if cmd else f"pid {pid}"


def describe_receiver(hdr: dict[str, Any], live: bool | None = None) -> str:
    """A note for errors: is the receiver of this lane still running? `live`: its token
    is held (None: test the token of this process's sender on that lane, if it has one)."""
    pid = hdr["receiver_pid"]
    if hdr["closed"]:
        return f"; the receiver (pid {pid}) closed the lane"
    if live is None:
        live = _receiver_token_held(int(pid), int(hdr["receiver_start"]))
    if not live:
        return f"; the receiver (pid {pid}) is no longer running"
    return f"; the receiver (pid {pid}) is running but not consuming"


def _receiver_token_held(pid: int, start: int) -> bool:
    """Whether the receiver (pid, start) of a lane this process sends on holds its token
    (a lane this process has no sender on: its pid, in this PID namespace)."""
    with _registry:
        mine = list(_lane_tokens.items())
    for lane, t in mine:
        live = isinstance(lane, ShmTxLane) and not lane.closed and t.fd >= 0
        if live and _receiver_of(read_header(lane.segment)) == (pid, start):
            return t.held(RECEIVER_TOKEN)
    return alive(pid, start)


def describe_holder(pid: int, start: int) -> str:
    """'pid N (command line)' of a live token holder if it is a process of this PID
    namespace (the pid and start time match), else 'pid N of another PID namespace'."""
    if alive(pid, start):
        return describe_pid(pid)
    return f"pid {pid} of another PID namespace"


# ---- liveness tokens (docs/PROTOCOL.md section 9, "Liveness tokens") ------------------------
#: the byte of a segment whose lock is an end's liveness token: a lane's receiver's (its pid
#: field), a lane's sender's (its pid field), a doorbell's creator's (its pid field)
RECEIVER_TOKEN = 20
SENDER_TOKEN = 68
BELL_TOKEN = 16
#: struct flock of Linux's 64-bit ABIs: l_type, l_whence, l_start, l_len, l_pid (4 bytes pad)
_FLOCK = struct.Struct("@hhqqi4x")


def _mapped_file(address: int) -> tuple[int, int] | None:
    """(device, inode) of the file this process maps at `address` (/proc/self/maps)."""
    head = f"{address:08x}-"  # (the kernel pads to 8 digits: low addresses, valgrind)
    with open("/proc/self/maps") as f:
        for line in f:
            if line.startswith(head):
                dev, ino = line.split(maxsplit=5)[3:5]
                major, minor = dev.split(":")
                return os.makedev(int(major, 16), int(minor, 16)), int(ino)
    return None


class Token:
    """This process's own open file description of a segment it maps (an open(2) of
    /dev/shm/<name>, checked to be the very object mapped): on it this end holds its
    liveness token, a write lock on one byte (`F_OFD_SETLK`), and tests the other end's
    (`F_OFD_GETLK`). The kernel drops the lock when the description's last descriptor
    closes: when the process exits, however it exits, before it is a zombie. A lock is on the
    file, so a process of any PID namespace that shares /dev/shm sees it; a segment is mode
    0600, so no other user can open it to take or hold a token. A forked child closes its
    copies at once (`os.register_at_fork`): a rank's dataloader worker does not keep a
    killed rank alive; an exec'd one never gets them (O_CLOEXEC)."""

    def __init__(self, seg: ShmSegment) -> None:
        path = SHM_DIR + seg.name
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or _mapped_file(seg.address) != (
                st.st_dev,
                st.st_ino,
            ):
                raise LaneError(f"{path} was replaced while it was being opened")
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        self.name = seg.name
        #: the byte whose token this description holds (None: it only tests)
        self.holds: int | None = None
        with _registry:
            _tokens.add(self)

    def hold(self, offset: int) -> bool:
        """Take this end's token at `offset`; False if another description holds it."""
        try:
            fcntl.fcntl(self.fd, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_WRLCK, 0, offset, 1, 0))
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise
        self.holds = offset
        return True

    def held(self, offset: int) -> bool:
        """Another open file description (a live process's) holds the token at `offset`.
        Never blocks. False once this description is closed (in a forked child)."""
        if self.fd < 0:
            return False
        got = fcntl.fcntl(self.fd, fcntl.F_OFD_GETLK, _FLOCK.pack(fcntl.F_WRLCK, 0, offset, 1, 0))
        return bool(_FLOCK.unpack(got)[0] != fcntl.F_UNLCK)

    def close(self) -> None:
        """Release the token (closing the description). Safe to call twice."""
        fd, self.fd = self.fd, -1
        with _registry:
            _tokens.discard(self)
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # (at interpreter exit the module may be gone)
            self.close()


#: every open Token of this process (a forked child closes its copies: `_forked`), and the
#: lock of both registries (lanes are opened on several threads)
_tokens: weakref.WeakSet[Token] = weakref.WeakSet()
_registry = threading.RLock()  # (reentrant: a Token collected while it is held)
#: the Token of each lane end this process opened (released with the lane's last reference)
_lane_tokens: weakref.WeakKeyDictionary[Any, Token] = weakref.WeakKeyDictionary()


def _forked() -> None:
    global _registry
    _registry = threading.RLock()  # (another thread may have held it at the fork)
    for t in list(_tokens):
        fd, t.fd = t.fd, -1
        if fd >= 0:
            os.close(fd)
    _tokens.clear()


os.register_at_fork(after_in_child=_forked)


def _release_closed(seg_name: str) -> None:
    """Release the tokens of this process's closed lane ends of `seg_name` (a closed lane
    still referenced somewhere keeps its description until it is collected)."""
    with _registry:
        mine = list(_lane_tokens.items())
    for lane, t in mine:
        if t.name == seg_name and lane.closed:
            t.close()


def peer_alive(lane: ShmTxLane) -> bool:
    """The receiver of the lane this process sends on is alive: it holds its token and has
    not closed the lane (from any PID namespace)."""
    t = _lane_tokens.get(lane)
    if t is None or lane.closed:
        return False
    return t.held(RECEIVER_TOKEN) and not read_header(lane.segment)["closed"]


def sender_alive(lane: ShmRxLane) -> bool:
    """The sender of a lane this process receives on is alive: it holds its token and has
    not closed its end (from any PID namespace)."""
    t = _lane_tokens.get(lane)
    if t is None or lane.closed:
        return False
    return t.held(SENDER_TOKEN) and read_header(lane.segment)["sender_pid"] != 0


#: A doorbell segment: 64 bytes. u32 futex word at 0; at 8 the magic, stored last; at 16 the
#: creator's pid (u32) and at 24 its start time (u64), so a restart can tell its own dead
#: predecessor's doorbell (replaced) from a live one (PROTOCOL.md section 9).
BELL_BYTES = 64
BELL_MAGIC = 0x31304C4C45425352  # b"RSBELL01" little-endian
_BELL_OWNER = struct.Struct("<IIQ")  # pid, 0, start at offset 16


class Doorbell:
    """A futex word in shared memory that a receiver sleeps on and senders ring.

    One per receiving node: every lane created with it names it in its header, and every
    sender that attaches to such a lane wakes the receiver after writing if it is asleep.
    """

    def __init__(self, segment: ShmSegment, name: str, token: Token | None = None) -> None:
        self.segment = segment
        self.name = name
        #: the creator's liveness token (BELL_TOKEN)
        self.token = token

    @classmethod
    def create(cls, name: str) -> Doorbell:
        seg_name = lane_segment_name(name)
        if len(seg_name) > 31:
            raise ValueError(f"doorbell name {name!r} is too long (at most 21 characters)")
        seg = _create_segment(seg_name, BELL_BYTES)
        try:
            token = _holding(seg, BELL_TOKEN, "doorbell")
        except BaseException:
            seg.close()
            raise
        pid = os.getpid()
        start = process_start(pid)
        assert start is not None
        ctypes.memmove(seg.address + 16, _BELL_OWNER.pack(pid, 0, start), _BELL_OWNER.size)
        ctypes.c_uint64.from_address(seg.address + 8).value = BELL_MAGIC
        return cls(seg, name, token)

    @property
    def address(self) -> int:
        return int(self.segment.address)

    def ring(self) -> bool:
        """Wake the receiver if it sleeps on this doorbell (from any thread or process)."""
        return ring_doorbell(self.address)

    def close(self) -> None:
        self.segment.close()
        if self.token is not None:
            self.token.close()

    def __enter__(self) -> Doorbell:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _holding(seg: ShmSegment, offset: int, what: str) -> Token:
    """A new Token on a segment this process just created, holding the token at `offset`."""
    token = Token(seg)
    if not token.hold(offset):  # a new object: no one else can hold it
        token.close()
        raise LaneBusyError(f"{what} {SHM_DIR}{seg.name}: its liveness token is held already")
    return token


def _create_segment(seg_name: str, size: int) -> ShmSegment:
    """Create a segment; if a stale one holds the name (its creator is gone), replace it.
    Anything else there (a live owner's segment, or an entry that is not an rdmasched
    segment: a directory, a symlink, random bytes) is LaneBusyError naming it and its owner."""
    what = "doorbell" if size == BELL_BYTES else "lane segment"
    for _ in range(3):  # a name freed, then taken again meanwhile: look again
        try:
            return ShmSegment.create(seg_name, size)
        except FileExistsError:
            pass
        e = inspect(seg_name)
        if e is None:
            continue
        if e.state == "live":
            raise LaneBusyError(
                f"{what} {e.path} belongs to a running process, {e.who}: "
                "is this node (or this lane's receiver) already running? Stop that process "
                "first, or use another node id or cluster name. If it is not an rdmasched "
                "process, remove the segment with `rm` once nothing uses it"
            )
        if e.state == "foreign":
            raise LaneBusyError(
                f"cannot create {what} {e.path}: it is {e.why}, owned by {e.owner}: not a "
                "segment this node may replace. Remove it (`rm -r`) if nothing uses it, or "
                "use another cluster name"
            )
        _log.info("removing stale shared-memory segment %s (its creator is gone)", seg_name)
        ShmSegment.unlink_name(seg_name)
    raise LaneBusyError(f"{what} {SHM_DIR}{seg_name} keeps being created by another process")


@dataclass(frozen=True)
class Entry:
    """What holds a name in /dev/shm, as ``inspect`` finds it.

    ``state``: "live" (an rdmasched segment whose creator runs: ``pid``), "stale" (one whose
    creator is gone, or a creation that died half way: safe to remove) or "foreign" (not an
    rdmasched segment, or not this user's to judge). ``why`` says what it is; ``owner``
    the user who owns the entry; ``bell`` a lane's doorbell segment name ("" if none);
    ``who`` names a live creator (`describe_holder`).
    """

    name: str
    state: str
    why: str
    owner: str
    pid: int | None = None
    bell: str = ""
    who: str = ""

    @property
    def path(self) -> str:
        return SHM_DIR + self.name


def _user(uid: int) -> str:
    try:
        return f"user {pwd.getpwuid(uid).pw_name}"
    except KeyError:
        return f"uid {uid}"


def _kind(mode: int) -> str:
    for test, what in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return what
    return "not a regular file"


def inspect(seg_name: str) -> Entry | None:
    """What holds ``seg_name`` ("/rdmasched....") in /dev/shm (None: nothing). It follows
    no symlink, opens no FIFO or directory, and maps only a regular file of this user's
    (root: anyone's), so nothing a local user leaves there can make it fail or block."""
    try:
        st = os.lstat(SHM_DIR + seg_name)
    except FileNotFoundError:
        return None
    owner = _user(st.st_uid)

    def entry(state: str, why: str, pid: int | None = None, bell: str = "", who: str = "") -> Entry:
        return Entry(seg_name, state, why, owner, pid, bell, who)

    if not stat.S_ISREG(st.st_mode):
        return entry("foreign", _kind(st.st_mode))
    if st.st_uid != os.geteuid() and os.geteuid() != 0:
        return entry("foreign", f"belongs to {owner}: not yours to check or remove")
    if st.st_size == 0:
        return entry("foreign", "empty: not an rdmasched segment (or one still being created)")
    try:
        seg = ShmSegment.open(seg_name)
    except FileNotFoundError:
        return None
    except (OSError, LaneError) as exc:  # replaced meanwhile, or unreadable
        return entry("foreign", f"cannot be opened ({getattr(exc, 'strerror', None) or exc})")
    hdr: dict[str, Any] | None
    with seg:
        try:
            token = Token(seg)  # liveness: the creator's token (PROTOCOL.md section 9)
        except FileNotFoundError:
            return None
        except (OSError, LaneError) as exc:
            return entry("foreign", f"cannot be opened ({getattr(exc, 'strerror', None) or exc})")
        try:
            size = seg.size
            if size == BELL_BYTES:
                magic = ctypes.c_uint64.from_address(seg.address + 8).value
                if magic == BELL_MAGIC:
                    # Senders of the node's lanes map its doorbell too: only the creator owns it.
                    pid, _, start = _BELL_OWNER.unpack(ctypes.string_at(seg.address + 16, 16))
                    if token.held(BELL_TOKEN):
                        return entry("live", "a doorbell", pid, who=describe_holder(pid, start))
                    return entry("stale", "a doorbell whose creator is gone")
                hdr = {"magic": magic}
            elif size < HEADER_BYTES:
                hdr = {"magic": None}
            else:
                hdr = read_header(seg)
            receiver_live = token.held(RECEIVER_TOKEN)
        finally:
            token.close()
    if hdr["magic"] == 0:  # its magic not written yet: a creation under way, or one that died
        if receiver_live:
            return entry("live", "being created")
        # (a creator that died before it took its token, or has not taken it yet: found
        # through /proc, which sees this PID namespace's processes only)
        user = _any_user(seg_name)
        if user is not None:
            return entry("live", "being created", user, who=describe_pid(user))
        return entry("stale", "a creation that did not finish")
    if hdr["magic"] != MAGIC or size == BELL_BYTES:
        return entry("foreign", f"not an rdmasched segment ({size} bytes without our magic)")
    bell = str(hdr["bell"])
    if receiver_live and not hdr["closed"]:
        pid, start = _receiver_of(hdr)
        return entry("live", "a lane", pid, bell, describe_holder(pid, start))
    return entry("stale", "a lane whose receiver is gone", bell=bell)


def _any_user(seg_name: str) -> int | None:
    """A live process (other than us) that maps the segment, found through /proc."""
    path = SHM_DIR + seg_name
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/maps") as f:
                if any(line.rstrip().endswith(path) for line in f):
                    return int(entry)
        except OSError:
            continue
    return None


def create_lane(
    name: str,
    nslots: int = 256,
    *,
    grace_us: int = DEFAULT_GRACE_US,
    doorbell: Doorbell | None = None,
) -> ShmRxLane:
    """Create the receiving end of lane `name` with `nslots` 64-byte slots.

    `grace_us`: how long a slot that looks torn may still be landing before it is skipped
    as corrupt. `doorbell`: the receiver's doorbell, if it will sleep when idle.
    """
    check_nslots(nslots)
    if grace_us < 0:
        raise ValueError("grace_us must be >= 0")
    seg_name = lane_segment_name(name)
    seg = _create_segment(seg_name, segment_size(nslots))
    pid = os.getpid()
    start = process_start(pid)
    assert start is not None
    token = None
    try:
        token = _holding(seg, RECEIVER_TOKEN, "lane segment")  # before the magic is stored
        lane = ShmRxLane._create(
            seg,
            name,
            nslots,
            grace_us * 1000,
            pid,
            start,
            lane_segment_name(doorbell.name) if doorbell else "",
        )
    except BaseException:
        if token is not None:
            token.close()
        seg.close()
        raise
    with _registry:
        _lane_tokens[lane] = token
    return lane


def _receiver_of(hdr: dict[str, Any]) -> tuple[int, int]:
    """The receiver incarnation that created a lane segment."""
    return int(hdr["receiver_pid"]), int(hdr["receiver_start"])


#: the open sender of each lane attached by this process: (pid, lane); the pid tells a
#: forked child (which holds no sender of its own) from the process that attached
_senders: dict[str, tuple[int, weakref.ref[ShmTxLane]]] = {}


def attach_lane(name: str, *, src: int = 0, timeout_us: int = DEFAULT_TIMEOUT_US) -> ShmTxLane:
    """Attach as the sender of lane `name` (created by its receiver), as node `src`.

    Takes the lane's next sender epoch. The first sender of a lane can send at once; a later
    one (a restart) waits on its first send until the receiver has drained the previous
    epoch, up to `timeout_us`.
    """
    seg_name = lane_segment_name(name)
    try:
        seg = ShmSegment.open(seg_name)
    except FileNotFoundError:
        raise PeerDeadError(
            f"lane {name!r} does not exist (no {SHM_DIR}{seg_name}): "
            "its receiver has not created it, or is gone"
        ) from None
    except LaneError as exc:
        # (ShmSegment.open's LaneErrors: the segment is empty, or not a regular file.) A
        # receiver creates a lane in two steps, shm_open then ftruncate: an empty segment is
        # one still being created, as a header without its magic is: retryable.
        raise PeerDeadError(f"lane {name!r} is not ready: {exc}") from None
    bell = None
    token = None
    try:
        hdr = _check_header(seg, name)
        token = Token(seg)
        if not token.held(RECEIVER_TOKEN) or hdr["closed"]:
            raise PeerDeadError(
                f"lane {name!r}{describe_receiver(hdr, False)[1:]}: its receiver must start again "
                "(a new receiver replaces the lane; then attach again). To clean up segments "
                "whose creators are gone: `rdmasched cleanup`"
            )
        mine = _senders.get(name)
        held = mine[1]() if mine is not None and mine[0] == os.getpid() else None
        if (
            held is not None
            and not held.closed
            and _receiver_of(read_header(held.segment)) == _receiver_of(hdr)
        ):
            # (a sender still open on a restarted receiver's old segment does not count)
            raise LaneBusyError(
                f"lane {name!r} already has a sender in this process (attached earlier and "
                "still open); a lane has one sender: send through that one, or close it "
                "before attaching again"
            )
        _release_closed(seg_name)
        if not token.hold(SENDER_TOKEN):  # before the epoch is claimed
            who = describe_holder(hdr["sender_pid"], hdr["sender_start"])
            raise LaneBusyError(
                f"lane {name!r} already has a live sender, {who}; a lane has one sender. "
                "Stop that process first (a sender that was killed frees the lane at once, "
                "even before it is reaped)"
            )
        if hdr["bell"]:
            bell = ShmSegment.open(hdr["bell"])
        pid = os.getpid()
        start = process_start(pid)
        assert start is not None  # we are running
        lane = ShmTxLane._attach(seg, name, src, pid, start, bell)
        _senders[name] = (pid, weakref.ref(lane))
    except BaseException:
        if token is not None:
            token.close()
        seg.close()
        if bell is not None:
            bell.close()
        raise
    with _registry:
        _lane_tokens[lane] = token
    lane.timeout_ns = timeout_us * 1000
    return lane


def _check_header(seg: ShmSegment, name: str) -> dict[str, Any]:
    if seg.size < HEADER_BYTES:
        raise LaneError(f"lane {name!r}: segment too small ({seg.size} bytes)")
    hdr = read_header(seg)
    if hdr["magic"] == 0:
        # The receiver stores the magic last: it is still writing the header (or died doing
        # so). Either way there is no lane yet, as if the segment did not exist: retryable.
        raise PeerDeadError(
            f"lane {name!r} is still being created by its receiver (or its creator died doing so)"
        )
    if hdr["magic"] != MAGIC:
        raise LaneError(f"lane {name!r}: not an rdmasched lane (bad magic)")
    if hdr["version"] != LANE_VERSION:
        raise LaneError(
            f"lane {name!r} speaks wire protocol version {hdr['version']}, this node "
            f"version {LANE_VERSION}: run the same rdmasched version on every node "
            "(docs/PROTOCOL.md section 9)"
        )
    nslots = hdr["nslots"]
    if hdr["slot_size"] != 64 or nslots < 16 or nslots & (nslots - 1):
        raise LaneError(f"lane {name!r}: bad geometry ({nslots} slots of {hdr['slot_size']})")
    if seg.size != segment_size(nslots):
        raise LaneError(
            f"lane {name!r}: segment is {seg.size} bytes, expected {segment_size(nslots)}"
        )
    return hdr


def list_segments() -> list[str]:
    """Names of rdmasched shared-memory segments on this host."""
    try:
        entries = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    return sorted("/" + e for e in entries if ("/" + e).startswith(PREFIX))


@dataclass
class CleanupReport:
    """What ``cleanup`` did (a dry run: would do), by segment name ("/rdmasched....")."""

    removed: list[str] = field(default_factory=list)  #: stale: removed (dry run: to remove)
    live: list[str] = field(default_factory=list)  #: their creators run: kept
    skipped: list[tuple[str, str]] = field(default_factory=list)  #: (name, why): left alone
    dry_run: bool = False


def cleanup(cluster: str | None = None, dry_run: bool = False) -> CleanupReport:
    """Remove the rdmasched segments whose creating process is gone (``dry_run``: only say
    which). ``cluster``: only that cluster's (its lanes, ``rdmasched.<cluster>.*``, and the
    doorbells they name); ValueError if no lane can have that name. An entry that is not an
    rdmasched segment (a directory, a symlink, a FIFO, random bytes, another user's) is
    skipped and reported, never fatal."""
    names = list_segments()
    if cluster is not None:
        mine = lane_segment_name(cluster) + "."
        names = [n for n in names if n.startswith(mine)]
    rep = CleanupReport(dry_run=dry_run)
    bells: set[str] = set()
    seen: set[str] = set()
    while names:
        for seg_name in names:
            seen.add(seg_name)
            e = inspect(seg_name)
            if e is None:
                continue
            if e.bell:
                bells.add(e.bell)
            if e.state == "live":
                rep.live.append(seg_name)
            elif e.state == "foreign":
                rep.skipped.append((seg_name, e.why))
            elif dry_run:
                rep.removed.append(seg_name)
            else:
                try:
                    ShmSegment.unlink_name(seg_name)
                except OSError as exc:
                    rep.skipped.append((seg_name, f"cannot be removed ({exc.strerror})"))
                else:
                    rep.removed.append(seg_name)
        # then the doorbells the lanes named (with --cluster: not found by their names)
        names = sorted(b for b in bells - seen if b.startswith(PREFIX))
    return rep


def remove_stale() -> list[str]:
    """Remove segments whose creating process is gone; returns their names (``cleanup``)."""
    return cleanup().removed
