"""Every per-call and per-task cost the simulator's baselines use, recorded once.

Each figure is a `Recorded`: its value and where it comes from, a run of ours (the command,
the date, the commit and the JSON that holds it) or a published source. The defaults of
`SimConfig` are these figures, so a run's headline does not depend on the load of the host
it runs on; `rdmasched sim --measure` measures again what this machine can measure (the
compiled coordinator's cost per call, `measure_central_call_ns`), prints it beside the
recorded figure and uses the measured one (docs/SIM.md, "Schedulers" and "Costs").

Nothing here imports the simulator: a leaf module of constants.
"""

from __future__ import annotations

from dataclasses import dataclass

from rdmasched.errors import ArgumentError


@dataclass(frozen=True)
class Recorded:
    """One recorded figure: `value` in `unit`, and where it comes from."""

    name: str
    value: float
    unit: str
    source: str

    def as_dict(self) -> dict[str, object]:
        return {"value": self.value, "unit": self.unit, "source": self.source}


_PEERS = (
    "rdmasched bench peers --json-out docs/figures/bench-peers.json, 2026-12-02T00:41Z, "
    "commit 07860f0, Ray 2.60.0 and Dask distributed 2026.8.0 on this 2-vCPU host, 4 slots, "
    "3 interleaved rounds"
)

#: the central coordinator's CPU time per call into one of its node cores (a DISPATCH, a
#: COMPLETE, a SYNC_READY counted), on the compiled node core: `measure_central_call_ns()`
#: (16 nodes, 20 steps, the median of three rounds, process CPU time)
CENTRAL_CALL = Recorded(
    "central_call_ns",
    8_089,
    "ns per call",
    "rdmasched sim --measure --sizes 16 --steps 2 --schedulers central --json, "
    "2026-12-02T02:22Z, commit 0076549, compiled node core, AMD EPYC 2-vCPU host, 1-min "
    "load 4.2 (process CPU time); docs/figures/sim-baselines.json, 'measure'",
)

#: a turn of the central coordinator's loop: what it pays once per batch of messages it
#: takes in, beside each message's call. One poll of a lane that holds a message through
#: the Python API (half the rdmasched-shm round trip)
CENTRAL_BATCH = Recorded(
    "central_batch_ns",
    481,
    "ns per turn",
    "rdmasched bench all (docs/figures/bench-all-2026-11-30.json): rdmasched-shm p50 round "
    "trip 0.962 us through the Python API on both sides, halved (the linkmodel's shm preset)",
)

#: Dask distributed's scheduler: one task costs it 1 / (tasks per second) of its one
#: event loop (bench peers' no-op throughput: 760 tasks/s with 4 workers). A task is two
#: messages at a central coordinator (its DISPATCH in, its COMPLETE in), so half of it per
#: call. Dask's docs give the same order: the scheduler "may impose overheads up to 1ms per
#: operation per chunk" (docs.dask.org, "Dask Array Best Practices")
DASK_TASK = Recorded(
    "dask_task_ns",
    1_315_790,
    "ns per task",
    f"{_PEERS}: dask throughput 30,000 tasks in 39.47 s = 760 tasks/s (1.316 ms a task); "
    "66.63 CPU-s, 2.22 ms of CPU a task over the whole system",
)

#: Ray: a task's turn through a node's local scheduler (the raylet): 1 / (tasks per
#: second) of bench peers' no-op throughput, 1,295 tasks/s with 4 CPUs
RAY_TASK = Recorded(
    "ray_task_ns",
    771_950,
    "ns per task",
    f"{_PEERS}: ray throughput 30,000 tasks in 23.16 s = 1,295 tasks/s (0.772 ms a task); "
    "41.03 CPU-s, 1.37 ms of CPU a task over the whole system",
)

#: Ray: submit -> the function's first line with a free slot, p50: what a task waits
#: before it starts beyond its turn through the local scheduler
RAY_START_P50 = Recorded(
    "ray_start_p50_ns",
    1_744_895,
    "ns",
    f"{_PEERS}: ray latency p50 1,744.9 us (p99 6,660 us), 900 samples",
)

#: Ray: one decision of the global scheduler (a spilled task placed on a node with a free
#: slot): a raylet scheduling decision and its lease, taken as one task's turn (RAY_TASK);
#: Ray publishes no separate figure for a spillback decision
RAY_GLOBAL_DECISION = Recorded(
    "ray_global_decision_ns",
    RAY_TASK.value,
    "ns per decision",
    "taken as one Ray task's turn through a scheduler (ray_task_ns): Ray's spillback is a "
    "raylet decision plus a lease request; no separate published figure",
)

#: Ray: how often a raylet reports its free resources to the rest of the cluster (the
#: view a spilled task is placed by)
RAY_REPORT_PERIOD = Recorded(
    "ray_report_period_ns",
    100_000_000,
    "ns",
    "Ray's src/ray/common/ray_config_def.h: raylet_report_resources_period_milliseconds = 100",
)

#: kube-scheduler's binding rate: what `exclusive` pays once per job, for its gang's pods
#: (one pod per node), and the per-task `k8s` baseline per order
K8S_PODS_PER_S = Recorded(
    "k8s_pods_per_s",
    100.0,
    "pods per s",
    "kube-scheduler: about 100-200 pods/s on a 1,000-node cluster (kubernetes-docs.pages.dev,"
    " 'kube-scheduler: scheduling throughput'); 30 pods/s in Kubernetes' 5,000-node density "
    "test (kubernetes/kubernetes issue #56714)",
)

#: every recorded figure, by name (the JSON's `costs`)
ALL = (
    CENTRAL_CALL,
    CENTRAL_BATCH,
    DASK_TASK,
    RAY_TASK,
    RAY_START_P50,
    RAY_GLOBAL_DECISION,
    RAY_REPORT_PERIOD,
    K8S_PODS_PER_S,
)

#: `--central-call-ns NAME`: the central coordinator's cost per call as a preset. A task
#: costs central two calls (its DISPATCH and its COMPLETE), so Dask's per-task figure is
#: split over the two
CENTRAL_CALL_PRESETS: dict[str, int] = {
    "compiled": int(CENTRAL_CALL.value),
    "dask": int(DASK_TASK.value // 2),
}


def central_call_ns(text: str) -> int:
    """`--central-call-ns`: ns per call (an integer >= 1) or a preset's name."""
    if text in CENTRAL_CALL_PRESETS:
        return CENTRAL_CALL_PRESETS[text]
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise ArgumentError(
            f"--central-call-ns {text!r}: ns per call (>= 1) or one of "
            f"{', '.join(CENTRAL_CALL_PRESETS)}"
        )
    return v


def table() -> dict[str, dict[str, object]]:
    """Every recorded figure, for the JSON document."""
    return {c.name: c.as_dict() for c in ALL}
