"""Honest timing: every sample kept, warm-up excluded, no cache or queue flattering a result.

One sample is one call of the measured function (or one replay of its CUDA graph):

- **CUDA**: two CUDA events recorded on the current stream around the call; the
  elapsed time between them is the sample. Before each sample (untimed) the L2
  cache is overwritten with a buffer twice its size and the next of several input
  sets is taken, so the call never reads operands an earlier call left in L2.
  An eager call starts on an idle device (synchronised first), so it pays its
  launches, as it would in an eager decode loop. A graph replay is submitted while
  the device still flushes and then waits :data:`HOST_SLACK_S` (a spin kernel), so
  its sample is the replay's device time, as ``triton.testing.do_bench`` measures
  it: a decode loop enqueues the next replay while the last one runs, and neither
  the host's few microseconds of graph submission nor a host that stalls (a
  garbage collection, pytest-benchmark's own loop) should count as step time. A
  ``queued`` runner (the prefill tables) enqueues its calls back to back and waits
  for the device once, after the last: the host runs ahead, so a sample is the
  call's device time, as ``do_bench`` takes it, and the launches count only where
  the device outruns the host.
- **CPU**: :func:`time.perf_counter` around the call.

:class:`Runner` holds the function and its input sets; :func:`measure` runs the
loop itself (the CLI), and :func:`run_pedantic` runs it through pytest-benchmark's
``benchmark.pedantic`` with :data:`TIMER` as the timer (the test suites), so both
measure the same way. No pytest import here.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

#: Flushing writes this many times the L2 size (one pass may leave lines resident).
FLUSH_FACTOR = 2
#: L2 size assumed when torch does not report it (every data-centre GPU so far is below).
FALLBACK_L2_BYTES = 64 * 2**20
#: Input sets never exceed this count (beyond a few, rotation adds nothing over the flush).
MAX_INPUT_SETS = 8
#: Device time a graph replay's sample waits behind, after the flush, while the host records the
#: start event and submits the replay. The flush alone (tens of microseconds) was not enough under
#: pytest-benchmark: in session 66 the H200's batch-1 replays at 64k took 19.1-145 us there, median
#: 33.7, where the CLI's took 19.0.
HOST_SLACK_S = 0.5e-3
#: Spin cycles of the one-off calibration of the device's wait (about 5 ms at 2 GHz).
CALIBRATION_CYCLES = 10_000_000


@dataclass(frozen=True)
class Samples:
    """Durations of the timed calls in seconds, in the order they ran (warm-up excluded).

    Attributes:
        times: one duration per call.
        method: how they were taken, e.g. ``"cuda-events, L2 flushed, 4 input sets, graph"``.
    """

    times: Tuple[float, ...]
    method: str

    def __post_init__(self) -> None:
        if not self.times:
            raise ValueError("Samples needs at least one duration")

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def quartiles(self) -> Tuple[float, float]:
        """``(q1, q3)`` as pytest-benchmark computes them (both the median for one sample)."""
        if len(self.times) < 2:
            return self.times[0], self.times[0]
        q = statistics.quantiles(self.times, n=4)
        return q[0], q[2]

    @property
    def iqr(self) -> float:
        q1, q3 = self.quartiles
        return q3 - q1

    def summary(self) -> Dict[str, float]:
        """``median``, ``iqr``, ``q1``, ``q3``, ``mean``, ``min``, ``max``, ``stddev`` (seconds) and ``rounds``."""
        q1, q3 = self.quartiles
        stddev = statistics.stdev(self.times) if len(self.times) > 1 else 0.0
        return {
            "median": self.median, "iqr": q3 - q1, "q1": q1, "q3": q3, "mean": statistics.mean(self.times),
            "min": min(self.times), "max": max(self.times), "stddev": stddev, "rounds": len(self.times),
        }  # fmt: skip


class PairTimer:
    """A timer called in pairs, ``start = timer(); work(); end = timer()``, with ``end - start``
    the duration of ``work`` on :attr:`device` (CUDA events there, ``perf_counter`` on CPU).

    This is the calling pattern of pytest-benchmark's pedantic mode, so an instance
    can be given as ``@pytest.mark.benchmark(timer=TIMER)``. Every duration is also
    kept in :attr:`durations` (warm-up rounds included: the caller knows how many).
    """

    __name__ = "nsa_pair_timer"  # how pytest-benchmark names the timer in its reports

    def __init__(self) -> None:
        self.device = torch.device("cpu")
        self.durations: List[float] = []
        self._start: Any = None

    def reset(self, device: torch.device) -> None:
        """Time on ``device`` from now on and forget earlier durations."""
        self.device = torch.device(device)
        self.durations = []
        self._start = None

    def __call__(self) -> float:
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            if self._start is None:
                self._start = event
                return 0.0
            event.synchronize()
            duration = self._start.elapsed_time(event) / 1e3  # elapsed_time is in ms
        else:
            now = time.perf_counter()
            if self._start is None:
                self._start = now
                return now
            duration = now - self._start
        self._start = None
        self.durations.append(duration)
        return duration if self.device.type == "cuda" else now


#: The timer the benchmark suites hand to pytest-benchmark (``@pytest.mark.benchmark(timer=TIMER)``).
TIMER = PairTimer()


def l2_bytes(device: torch.device) -> int:
    """The L2 cache size of a CUDA ``device`` (``FALLBACK_L2_BYTES`` when torch does not say)."""
    props = torch.cuda.get_device_properties(device)
    size = getattr(props, "L2_cache_size", 0)
    return int(size) if size else FALLBACK_L2_BYTES


def input_set_count(set_bytes: int, device: torch.device, *, memory_fraction: float = 0.25) -> int:
    """How many independent input sets to rotate through on ``device``.

    On CUDA: enough that together they exceed ``FLUSH_FACTOR`` times the L2 size
    (at most :data:`MAX_INPUT_SETS`, and at most ``memory_fraction`` of the free
    memory); so even without the flush one call never finds the previous call's
    operands in L2. On CPU: one (the flush is what matters there, and none runs).
    """
    device = torch.device(device)
    if device.type != "cuda" or set_bytes <= 0:
        return 1
    wanted = math.ceil(FLUSH_FACTOR * l2_bytes(device) / set_bytes)
    free, _ = torch.cuda.mem_get_info(device)
    affordable = int(free * memory_fraction) // set_bytes
    return max(1, min(wanted, MAX_INPUT_SETS, affordable))


_spin_rates: Dict[int, float] = {}


def spin_cycles_per_s(device: torch.device) -> float:
    """Cycles per second of ``torch.cuda._sleep`` (a kernel that spins that many GPU clock cycles)
    on a CUDA ``device``, measured once per device with CUDA events."""
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    if index not in _spin_rates:
        with torch.cuda.device(index):
            torch.cuda._sleep(1000)  # load the kernel outside the measurement
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(CALIBRATION_CYCLES)
            end.record()
            end.synchronize()
            _spin_rates[index] = CALIBRATION_CYCLES / (start.elapsed_time(end) / 1e3)
    return _spin_rates[index]


def _capture(fn: Callable[..., Any], args: Sequence[Any]) -> "torch.cuda.CUDAGraph":
    """Capture ``fn(*args)`` into a CUDA graph (warm-up on a side stream first, as torch requires)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # lazy allocations, autotuning and compilation happen outside the capture
            fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(*args)
    torch.cuda.synchronize()
    return graph


class Runner:
    """The measured call and its untimed preparation.

    Args:
        fn: the work; called as ``fn(*input_sets[i])``.
        input_sets: argument tuples, rotated round-robin (one set is fine on CPU).
        device: where ``fn`` runs.
        flush_l2: overwrite the L2 cache before each call (CUDA only). Default True.
        graph: capture ``fn`` once per input set into a CUDA graph and replay it.
            Raises whatever torch raises when ``fn`` cannot be captured (a host sync).
        queued: never wait for the device before a call; :func:`measure` then
            enqueues every round and reads the events after the last (CUDA only;
            pytest-benchmark's timer reads each call at once, so not there).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        input_sets: Sequence[Sequence[Any]],
        device: torch.device,
        *,
        flush_l2: bool = True,
        graph: bool = False,
        queued: bool = False,
    ) -> None:
        if not input_sets:
            raise ValueError("Runner needs at least one input set")
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        if graph and not cuda:
            raise ValueError(f"graph replay needs a CUDA device, got {self.device}")
        self.fn, self.input_sets, self.graph = fn, [tuple(s) for s in input_sets], graph
        #: The host's part of each eager call (``perf_counter`` around it; not of replays): see :meth:`host_share`.
        self.host_times: List[float] = []
        self.queued = queued and cuda
        self._next = 0
        self._flush: Optional[torch.Tensor] = None
        if cuda and flush_l2:
            self._flush = torch.empty(FLUSH_FACTOR * l2_bytes(self.device) // 4, dtype=torch.int32, device=self.device)
        self._graphs = [_capture(fn, args) for args in self.input_sets] if graph else []
        # A replay waits behind the device's spin, so the host's submission (and any stall) is not timed.
        self._slack_cycles = 0
        if graph and hasattr(torch.cuda, "_sleep"):
            self._slack_cycles = int(HOST_SLACK_S * spin_cycles_per_s(self.device))

    @property
    def method(self) -> str:
        """How the samples are taken, for reports (``extra_info["timing"]``)."""
        if self.device.type != "cuda":
            return f"cpu perf_counter, {len(self.input_sets)} input set(s)"
        flushed = "L2 flushed" if self._flush is not None else "L2 not flushed"
        replay = "eager"
        if self.graph:
            behind = ["the flush"] if self._flush is not None else []
            if self._slack_cycles:
                behind.append(f"a {HOST_SLACK_S * 1e3:g} ms device wait")
            replay = "graph replay" + (f" submitted behind {' and '.join(behind)}" if behind else "")
        if self.queued:
            replay += ", calls queued back to back"
        return f"cuda-events, {flushed}, {len(self.input_sets)} input set(s), {replay}"

    def setup(self) -> Tuple[Tuple[int], Dict[str, Any]]:
        """Untimed: pick the next input set, flush L2, then wait for the device (an eager call) or
        enqueue the device's wait (a graph replay; neither when ``queued``). Returns
        pytest-benchmark's ``(args, kwargs)`` for :meth:`target`."""
        index = self._next
        self._next = (self._next + 1) % len(self.input_sets)
        if self._flush is not None:
            self._flush.zero_()
        if self._slack_cycles:
            torch.cuda._sleep(self._slack_cycles)
        queued_behind = self.graph and (self._flush is not None or self._slack_cycles)  # the replay's wait
        if self.device.type == "cuda" and not self.queued and not queued_behind:
            torch.cuda.synchronize(self.device)
        return (index,), {}

    def target(self, index: int) -> Any:
        """Timed: one call on input set ``index`` (or one replay of its graph)."""
        if self.graph:
            self._graphs[index].replay()
            return None
        start = time.perf_counter()
        out = self.fn(*self.input_sets[index])
        self.host_times.append(time.perf_counter() - start)
        return out

    def host_share(self, samples: Samples) -> Optional[float]:
        """How much of ``samples`` (this runner's last ones) the host's submission takes: the median
        host part of those calls over their median sample. Near 1 the call is host-bound, its time the
        host's launches (it follows the host machine as much as the code); ``None`` where a sample
        holds no host time (replays, queued calls) or is all host time (the CPU)."""
        if self.device.type != "cuda" or self.graph or self.queued or len(self.host_times) < len(samples.times):
            return None
        return statistics.median(self.host_times[-len(samples.times):]) / samples.median


def measure(runner: Runner, *, rounds: int, warmup: int, timer: Optional[PairTimer] = None) -> Samples:
    """Time ``rounds`` calls of ``runner`` after ``warmup`` untimed ones (never in the samples);
    a ``queued`` runner's calls are all enqueued first and read at the end."""
    if rounds < 1 or warmup < 0:
        raise ValueError(f"rounds must be >= 1 and warmup >= 0, got rounds={rounds}, warmup={warmup}")
    if runner.queued:
        return _measure_queued(runner, rounds=rounds, warmup=warmup)
    timer = timer or PairTimer()
    timer.reset(runner.device)
    for _ in range(warmup + rounds):
        (index,), _ = runner.setup()
        timer()
        runner.target(index)
        timer()
    return Samples(tuple(timer.durations[warmup:]), runner.method)


def _measure_queued(runner: Runner, *, rounds: int, warmup: int) -> Samples:
    """Every call enqueued behind the last one's flush, its events read once the device is done."""
    pairs = []
    for i in range(warmup + rounds):
        (index,), _ = runner.setup()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        runner.target(index)
        end.record()
        if i >= warmup:
            pairs.append((start, end))
    torch.cuda.synchronize(runner.device)
    return Samples(tuple(start.elapsed_time(end) / 1e3 for start, end in pairs), runner.method)


def plan_rounds(runner: Runner, *, rounds: int, warmup: int, budget_s: float, min_rounds: int = 3) -> int:
    """Warm ``runner`` up and return how many of the asked ``rounds`` fit in ``budget_s``.

    Warm-up is at most ``warmup`` calls (at least one) and, past the first two, no more
    than a fifth of the budget; the rounds are those that fit in ``budget_s`` at the
    warm call's duration, never fewer than ``min_rounds``, so that one slow path
    cannot stall a whole suite and still gets a median and a spread.
    """
    probe = measure(runner, rounds=1, warmup=1 if warmup > 1 else 0).median
    if probe <= 0:
        return rounds
    extra = min(max(warmup - 2, 0), int(0.2 * budget_s / probe))
    if extra:
        measure(runner, rounds=extra, warmup=0)  # more warm-up: its samples are discarded
    return max(min(rounds, min_rounds), min(rounds, int(budget_s / probe)))


def measure_within(runner: Runner, *, rounds: int, warmup: int, budget_s: float) -> Samples:
    """:func:`plan_rounds`, then :func:`measure` that many rounds (no further warm-up)."""
    return measure(runner, rounds=plan_rounds(runner, rounds=rounds, warmup=warmup, budget_s=budget_s), warmup=0)


def run_pedantic(
    benchmark: Any, runner: Runner, *, rounds: int, warmup: int, budget_s: float = 30.0
) -> Optional[Samples]:
    """Time ``runner`` through pytest-benchmark's ``benchmark.pedantic`` with :data:`TIMER`.

    ``benchmark`` is pytest-benchmark's fixture, and the test must carry
    ``@pytest.mark.benchmark(timer=TIMER)`` so pytest-benchmark times with the same
    timer. Warm-up runs first (outside pytest-benchmark's statistics); the rounds
    are those of :func:`plan_rounds`. Returns the samples pytest-benchmark recorded,
    or ``None`` when its timing is disabled (under xdist, ``--benchmark-disable``):
    then the work runs once, untimed, as a smoke test.
    """
    if runner.queued:
        raise ValueError("pytest-benchmark's timer reads each call at once: give run_pedantic a runner that is not queued")
    if not benchmark.enabled:
        benchmark.pedantic(runner.target, setup=runner.setup)
        return None
    planned = plan_rounds(runner, rounds=rounds, warmup=warmup, budget_s=budget_s)
    TIMER.reset(runner.device)
    # plan_rounds has warmed the runner up: every pedantic round is a timed one.
    benchmark.pedantic(runner.target, setup=runner.setup, rounds=planned, warmup_rounds=0, iterations=1)
    return Samples(tuple(TIMER.durations), runner.method)
