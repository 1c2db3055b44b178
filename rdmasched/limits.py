"""Every numeric bound of rdmasched, written once.

A leaf module: it imports nothing of rdmasched, so any layer may import it (the wire, the
ring's Python side, the cluster config, the scheduler, the API, the CLI, the simulator).
Each bound carries the reason for its value; a check that several layers make (a lane's
size) is a function here, and each layer turns its `ValueError` into its own error type.
"""

from __future__ import annotations

#: task ids, arguments and incarnations are u64 on the wire
U64_MAX = (1 << 64) - 1

# ---- nodes and slots --------------------------------------------------------------------------
#: node ids are 24-bit on the wire; 0xFFFFFF is reserved (a head naming it is malformed)
NODE_MAX = 0xFFFFFF - 1
#: the most nodes a cluster (and a topology) holds: 2**20, below the wire's u24 node ids.
#: Past a few dozen nodes give a [topology]: without one every node holds a lane to every other.
MAX_NODES = 1 << 20
#: execution slots (GPUs) per node: a slot number is one byte in the event ring
EXEC_SLOTS_MAX = 255
#: the slot of a sync task that takes none (an overlapping group's: docs/SCHEDULER.md): one
#: past the last slot a node can have
NO_SLOT = EXEC_SLOTS_MAX

# ---- priorities ---------------------------------------------------------------------------------
#: priorities are 0..255, higher is more urgent; 255 is reserved for group sync tasks
PRIORITY_MAX = 255
SYNC_PRIORITY = 255
#: the highest priority an ordinary (compute) task may carry
COMPUTE_PRIORITY_MAX = 254

# ---- jobs, groups, steps ----------------------------------------------------------------------
#: `job` is a u32 in wire version 2
JOB_MAX = 0xFFFFFFFF
#: sync group ids are 0..2**31-1 (a sync task's id holds the group above the step)
GROUP_MAX = (1 << 31) - 1
#: steps are 0..2**32-1 (a sync task's id holds the step in its low 32 bits)
STEP_MAX = (1 << 32) - 1
#: members of one gang, at most (docs/GANGS.md): a gang is placed on its node and that node's
#: links, so it never needs more than a node's slots times its lanes
GANG_MAX = 1 << 16

# ---- no thrash: the run quantum and the preemption budgets (docs/PREEMPTION.md) ----------------
#: the run quantum, us: 0 (off) by default, so that every higher-priority task preempts at
#: once, as the scheduler always did (the microsecond reaction is the project's figure);
#: a cluster whose ordinary work churns sets it (docs/PREEMPTION.md, "No thrash")
QUANTUM_US_DEFAULT = 0
#: at most a minute: a quantum longer than that is a reservation, not a guard
QUANTUM_US_MAX = 60_000_000
#: preemption budgets are counts; None (the default) is no budget
BUDGET_MAX = 1 << 32
#: the window a job's budget counts over, us: one second by default
JOB_WINDOW_US_DEFAULT = 1_000_000
#: at most an hour
JOB_WINDOW_US_MAX = 3_600_000_000
#: tasks at or above this priority (and sync tasks, 255) preempt at once, never governed: 200
#: is the PyTorch integration's training compute task (COMPUTE_PRIORITY), whose step must
#: push co-located work off its slot without a wait
CRITICAL_PRIORITY_DEFAULT = 200


def check_preemption(
    quantum_us: object = QUANTUM_US_DEFAULT,
    task_budget: object = None,
    job_budget: object = None,
    job_window_us: object = JOB_WINDOW_US_DEFAULT,
    critical_priority: object = CRITICAL_PRIORITY_DEFAULT,
) -> None:
    """The one rule for the no-thrash settings (the scheduler, the cluster config and the
    daemon's options check with it); raises ValueError naming the setting."""

    def whole(name: str, v: object, lo: int, hi: int, none: bool = False) -> None:
        if v is None and none:
            return
        if type(v) is not int or not lo <= v <= hi:
            extra = " or none" if none else ""
            raise ValueError(f"{name} must be an integer in {lo}..{hi}{extra}, not {v!r}")

    whole("quantum_us", quantum_us, 0, QUANTUM_US_MAX)
    whole("task_budget", task_budget, 0, BUDGET_MAX, none=True)
    whole("job_budget", job_budget, 0, BUDGET_MAX, none=True)
    whole("job_window_us", job_window_us, 1, JOB_WINDOW_US_MAX)
    whole("critical_priority", critical_priority, 0, PRIORITY_MAX)


# ---- a host's clients (its ranks) ---------------------------------------------------------------
#: tasks one rank may hold on its daemon (queued, running, or placed on another host) when
#: the daemon is not told otherwise (`rdmasched daemon --max-queued-per-client`): a task costs
#: the daemon about 1 KB, so 16 MB a rank at most
CLIENT_QUEUED_DEFAULT = 16_384
#: the most it may be set to: at the bound the daemon looks once over the rank's tasks for
#: ones that ended unseen (about 30 ms for this many, measured), within one loop pass
CLIENT_QUEUED_MAX = 1 << 18
#: queued tasks of a departed rank cancelled per pass of the daemon's loop (the rest in the
#: next passes): about 10 ms of work a slice, well under any `dead_after_ms`
CLIENT_CANCEL_SLICE = 2_000

# ---- lanes ---------------------------------------------------------------------------------------
#: a lane holds a power of two of 64-byte slots in this range
LANE_SLOTS_MIN = 16
LANE_SLOTS_MAX = 1 << 20
#: the lane size when the cluster config gives none (`cluster.slots_per_lane`): 256 slots of
#: 64 bytes, 16 KiB a lane (docs/SCALE.md sizes the ring memory with it)
LANE_SLOTS_DEFAULT = 256


def check_lane_slots(nslots: object) -> int:
    """The one lane-size rule: a power of two in LANE_SLOTS_MIN..LANE_SLOTS_MAX.

    Returns `nslots`; raises ValueError (callers re-raise it as their own error type).
    """
    if (
        type(nslots) is not int
        or not LANE_SLOTS_MIN <= nslots <= LANE_SLOTS_MAX
        or nslots & (nslots - 1)
    ):
        raise ValueError(
            f"must be a power of two in {LANE_SLOTS_MIN}..{LANE_SLOTS_MAX}, not {nslots!r}"
        )
    return nslots


# ---- the verbs lanes' class of service (docs/VERBS.md, "Traffic class") -----------------------
#: the InfiniBand service level is 4 bits (the LRH's SL); on RoCE it is the VLAN priority
#: (802.1p PCP, 0..7) where frames are tagged
SERVICE_LEVEL_MAX = 15
#: 6: the 802.1p priority RoCE deployments give congestion notifications (CNPs), the other
#: small packets a fabric must never queue behind bulk data
SERVICE_LEVEL_DEFAULT = 6
#: DSCP is the upper 6 bits of the GRH's traffic class (RoCE v2: of the IP header's TOS
#: byte); the lower 2 are ECN's, left 0 (not ECN-capable) for the NIC and the fabric
DSCP_MAX = 63
#: 48, CS6: "network control" (RFC 4594), the DSCP RoCE deployments give CNPs
DSCP_DEFAULT = 48


def check_traffic_class(service_level: int, dscp: int) -> None:
    """The one rule for the verbs lanes' class: a service level 0..SERVICE_LEVEL_MAX and a
    DSCP 0..DSCP_MAX, integers (never a bool or a float). Raises ValueError naming the bad
    one."""
    for what, value, hi in (
        ("service_level", service_level, SERVICE_LEVEL_MAX),
        ("dscp", dscp, DSCP_MAX),
    ):
        if type(value) is not int or not 0 <= value <= hi:
            raise ValueError(f"{what} must be an integer in 0..{hi}, not {value!r}")


# ---- files ---------------------------------------------------------------------------------------
#: the largest file read as a config, a topology or a token (rdmasched/files.py): a cluster
#: config of MAX_NODES [[node]] tables is about 100 MiB; the bound keeps a wrong path (a
#: device, a log) from being read into memory whole
FILE_BYTES_MAX = 256 << 20
#: a metrics bearer token (`rdmasched daemon --metrics-token-file`, telemetry/http.py): at
#: least 16 characters (guessing it over HTTP is then hopeless), its file at most 4 KiB
HTTP_TOKEN_BYTES_MIN = 16
HTTP_TOKEN_BYTES_MAX = 4096

# ---- polling -------------------------------------------------------------------------------------
#: the longest spin after a message before a loop or a lane reader sleeps, us (`--spin-us`,
#: RDMASCHED_SPIN_US): beyond it nothing useful happens on one host
MAX_SPIN_US = 10_000_000
#: an EEVDF slice a thread may ask for, us (`--slice-us`, RDMASCHED_SLICE_US,
#: daemon/tuning.py): the kernel clamps sched_runtime to 0.1-100 ms
SLICE_US_MIN, SLICE_US_MAX = 100, 100_000
