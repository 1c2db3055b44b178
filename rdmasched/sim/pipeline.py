"""A pipeline-parallel job with the 1F1B schedule, on the same node cores.

The cluster's N nodes hold N/p pipelines of p stages each, on consecutive nodes (node i is
stage i mod p of pipeline i div p). A step is m micro-batches; each stage runs a forward (F)
and a backward (B) pass of each, in the 1F1B order of PipeDream-Flush (Narayanan et al.,
"Memory-Efficient Pipeline-Parallel DNN Training", ICML 2021) that Megatron-LM runs
(Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", SC 2021, section 2.2.1): stage s first runs min(p - s - 1, m) forwards (the
warm-up), then alternates one forward and one backward, then runs the backwards left (the
cool-down). F of micro-batch j on stage s needs F of j on stage s - 1 (its activations);
B of j on stage s needs B of j on stage s + 1 (its gradients); a stage runs its passes in
that order. A pass whose input is there is handed to the node's scheduler while the pass
before it runs (a CUDA stream holds the kernels launched ahead: the device starts the next
one the moment the last ends, with no gap for co-located work to fill); at most two passes
are in flight. The node's K devices run a pass together (tensor parallelism
inside the node): a pass is K compute tasks of its length, one per device, and is done when
all K are. After its last backward a stage announces SYNC_READY; the step's sync (the
data-parallel gradient all-reduce over the pipelines and the optimizer, `--sync-ms`) is the
scheduler's sync task over every node, as in the synthetic job, and ends the step.

Activations and gradients go stage to stage over the link model (the level between the two
nodes: its latency plus `--pipeline-mb` megabytes over its bandwidth), not over the
scheduler's lanes (NCCL's send/recv carry them in a real job). With uniform stages and
passes of lengths tF and tB, stage 0 ends its step's passes (m + p - 1)(tF + tB) after it
began, of which m (tF + tB) is work: the bubble is (p - 1)/(m + p - 1) of it
(`bubble_fraction`), plus the transfers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rdmasched.demo.job import COMPUTE_PRIORITY, WorkloadConfig
from rdmasched.demo.taskid import KIND_BACKGROUND, KIND_COMPUTE, task_id, task_kind
from rdmasched.errors import ArgumentError
from rdmasched.scheduler import Task
from rdmasched.sim.drivers import Ledger, Shaped, SimTrainer

FORWARD, BACKWARD = 0, 1


@dataclass(frozen=True)
class PipelineConfig:
    stages: int = 8
    micro_batches: int = 16
    forward_ms: float = 1.0
    backward_ms: float = 2.0
    #: activations (or gradients) sent stage to stage per micro-batch, MB
    activation_mb: float = 0.0

    def check(self, nodes: int) -> None:
        if self.stages < 1 or self.micro_batches < 1:
            raise ArgumentError("a pipeline needs >= 1 stage and >= 1 micro-batch")
        if nodes % self.stages:
            raise ArgumentError(
                f"--pipeline {self.stages}: the nodes ({nodes}) must be a multiple of the "
                f"stages (pipelines on consecutive nodes)"
            )
        if not (self.forward_ms > 0 and self.backward_ms > 0 and self.activation_mb >= 0):
            raise ArgumentError("pipeline passes must be > 0 ms, activations >= 0 MB")

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """1F1B's (and GPipe's) bubble: (p - 1) / (m + p - 1) of a step's pipeline phase."""
    return (stages - 1) / (micro_batches + stages - 1)


def schedule(stage: int, stages: int, micro_batches: int) -> list[tuple[int, int]]:
    """Stage `stage`'s passes in 1F1B order: (FORWARD or BACKWARD, micro-batch)."""
    warm = min(stages - stage - 1, micro_batches)
    out = [(FORWARD, j) for j in range(warm)]
    for i in range(micro_batches - warm):
        out += [(FORWARD, warm + i), (BACKWARD, i)]
    out += [(BACKWARD, j) for j in range(micro_batches - warm, micro_batches)]
    return out


class PipelineTrainer(SimTrainer):
    """One stage of a 1F1B pipeline on one node."""

    def __init__(
        self,
        node: int,
        slots: int,
        cfg: WorkloadConfig,
        backend: Shaped,
        ledger: Ledger,
        pipe: PipelineConfig,
        peers: list[SimTrainer],
        hop_ns: Callable[[int, int], int],
    ) -> None:
        super().__init__(node, slots, cfg, backend, ledger)
        self.shaped = backend
        self.pipe = pipe
        self.stage = node % pipe.stages
        self.order = schedule(self.stage, pipe.stages, pipe.micro_batches)
        self.peers = peers  # every node's trainer, by node id
        self.hop_ns = hop_ns
        self._k = 0  # the next pass in `order` to hand in
        self._done_k = 0  # the next pass in `order` to end
        #: pass (its index in `order`) -> its tasks not done; task id -> its pass
        self._left: dict[int, int] = {}
        self._pass_of: dict[int, int] = {}
        #: (step, FORWARD/BACKWARD, micro-batch) received from the neighbour stage
        self._got: set[tuple[int, int, int]] = set()
        #: per step: from its start to the end of this stage's last pass (ns)
        self.phase_ns: list[int] = []

    def _start_step(self) -> None:
        self.step_started_ns = self.b.now()
        self._k = self._done_k = 0
        self._next()

    def _next(self) -> None:
        """Hand in the next passes whose input is here, up to two in flight."""
        p = self.pipe.stages
        while len(self._left) < 2 and self._k < len(self.order):
            kind, j = self.order[self._k]
            needs = self.stage > 0 if kind == FORWARD else self.stage < p - 1
            if needs and (self.step, kind, j) not in self._got:
                return  # its input (activations or gradients) is not here yet
            self._got.discard((self.step, kind, j))
            ms = self.pipe.forward_ms if kind == FORWARD else self.pipe.backward_ms
            k = self._k
            self._k += 1
            self._left[k] = self.slots
            for _ in range(self.slots):
                self.seq += 1
                tid = task_id(KIND_COMPUTE, self.node, self.seq)
                self._pass_of[tid] = k
                self.b.submit_local(Task(tid, 1, COMPUTE_PRIORITY, self._ms(ms), origin=self.node))

    def receive(self, step: int, kind: int, j: int) -> None:
        self._got.add((step, kind, j))
        if step == self.step and not self.done:
            self._next()

    def _send(self, kind: int, j: int) -> None:
        to = self.node + (1 if kind == FORWARD else -1)
        peer = self.peers[to]
        eng = self.shaped.engine
        eng.at(eng.now + self.hop_ns(self.node, to), _deliver, peer, self.step, kind, j)

    def _pass_done(self, k: int) -> None:
        kind, j = self.order[k]
        self._done_k = k + 1
        p = self.pipe.stages
        if (kind == FORWARD and self.stage < p - 1) or (kind == BACKWARD and self.stage > 0):
            self._send(kind, j)
        if self._done_k == len(self.order):
            now = self.b.now()
            self.phase_ns.append(now - self.step_started_ns)
            self.ready_ns.append(now)
            self.b.sync_ready(self.step)
        else:
            self._next()

    def _finish(self, task: Task, token: int) -> None:
        ended = self._end_run(task, token)
        if ended is None:
            return  # preempted meanwhile
        now, _ = ended
        if task.group is not None:  # the step's sync is done
            self.step_times_ns.append(now - self.step_started_ns)
            self.step += 1
            if not self._end_if_last(now):
                self._start_step()
        elif task_kind(task.id) == KIND_COMPUTE:
            k = self._pass_of.pop(task.id)
            self._left[k] -= 1
            # a stage's passes end in order (its tasks are in order of arrival on its
            # devices, one priority); a later one that ends first waits for it
            while self._left.get(self._done_k) == 0:
                del self._left[self._done_k]
                self._pass_done(self._done_k)
        elif task_kind(task.id) == KIND_BACKGROUND and not self.done:
            self._submit_background()


def _deliver(peer: SimTrainer, step: int, kind: int, j: int) -> None:
    if isinstance(peer, PipelineTrainer) and peer.shaped.ep.alive:
        peer.receive(step, kind, j)


def pipeline_figures(trainers: list[SimTrainer], pipe: PipelineConfig) -> dict[str, Any]:
    """The bubble of every step measured on the first stages (they end a step's passes
    last), against the formula."""
    work = pipe.micro_batches * (pipe.forward_ms + pipe.backward_ms) * 1e6
    fr = [
        1 - work * t.shaped.factor / ph
        for t in trainers
        if isinstance(t, PipelineTrainer) and t.stage == 0
        for ph in t.phase_ns
        if ph > 0
    ]
    return {
        "pipeline": pipe.as_dict(),
        "pipeline_bubble_pct": 100.0 * sum(fr) / len(fr) if fr else None,
        "pipeline_bubble_formula_pct": 100.0 * bubble_fraction(pipe.stages, pipe.micro_batches),
    }
