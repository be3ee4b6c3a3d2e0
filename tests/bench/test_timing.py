"""nsa.bench.timing on the CPU: samples, warm-up exclusion, rotation, round planning."""

from __future__ import annotations

import statistics
import time

import pytest
import torch

from nsa.bench.timing import (HOST_SLACK_S, TIMER, PairTimer, Runner, Samples, measure, measure_within, plan_rounds,
                              run_pedantic, spin_cycles_per_s)

CPU = torch.device("cpu")


def test_samples_statistics_match_the_statistics_module():
    times = (0.5, 0.1, 0.3, 0.2, 0.4, 0.9)
    s = Samples(times, "test")
    q = statistics.quantiles(times, n=4)
    assert s.median == statistics.median(times)
    assert s.quartiles == (q[0], q[2]) and s.iqr == pytest.approx(q[2] - q[0])
    summary = s.summary()
    assert summary["rounds"] == 6 and summary["min"] == 0.1 and summary["max"] == 0.9
    assert summary["stddev"] == pytest.approx(statistics.stdev(times))


def test_samples_need_a_duration():
    with pytest.raises(ValueError, match="at least one"):
        Samples((), "test")
    one = Samples((0.25,), "test")
    assert one.iqr == 0 and one.summary()["stddev"] == 0


def test_pair_timer_on_cpu_gives_what_pytest_benchmark_subtracts():
    timer = PairTimer()
    timer.reset(CPU)
    start = timer()
    time.sleep(0.01)
    end = timer()
    assert end - start == pytest.approx(timer.durations[0]) and timer.durations[0] >= 0.009
    timer.reset(CPU)
    assert timer.durations == []


def test_measure_excludes_warmup_and_rotates_input_sets():
    calls = []
    runner = Runner(lambda tag: calls.append(tag), [("a",), ("b",), ("c",)], CPU)
    samples = measure(runner, rounds=4, warmup=3)
    assert len(samples.times) == 4 and all(t >= 0 for t in samples.times)
    assert calls == ["a", "b", "c", "a", "b", "c", "a"]  # 3 warm-up calls, then 4 timed, round-robin
    assert samples.method == "cpu perf_counter, 3 input set(s)"


def test_measured_time_is_the_call():
    runner = Runner(lambda: time.sleep(0.02), [()], CPU)
    samples = measure(runner, rounds=3, warmup=0)
    assert min(samples.times) >= 0.019


@pytest.mark.parametrize("rounds, warmup", [(0, 1), (3, -1)])
def test_measure_rejects_bad_counts(rounds, warmup):
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        measure(Runner(lambda: None, [()], CPU), rounds=rounds, warmup=warmup)


def test_runner_arguments_are_checked():
    with pytest.raises(ValueError, match="at least one input set"):
        Runner(lambda: None, [], CPU)
    with pytest.raises(ValueError, match="graph replay needs a CUDA device"):
        Runner(lambda: None, [()], CPU, graph=True)


def test_plan_rounds_fits_the_budget_but_keeps_three():
    slow = Runner(lambda: time.sleep(0.03), [()], CPU)
    assert plan_rounds(slow, rounds=50, warmup=1, budget_s=0.05) == 3
    fast = Runner(lambda: None, [()], CPU)
    assert plan_rounds(fast, rounds=7, warmup=1, budget_s=10.0) == 7


@pytest.mark.parametrize("warmup, budget_s, calls", [(1, 10.0, 1), (10, 10.0, 10), (10, 0.04, 2)])
def test_warmup_stays_within_a_fifth_of_the_budget(warmup, budget_s, calls):
    count = []
    runner = Runner(lambda: (count.append(1), time.sleep(0.01)), [()], CPU)
    plan_rounds(runner, rounds=5, warmup=warmup, budget_s=budget_s)
    assert len(count) == calls


def test_measure_within_times_the_planned_rounds():
    samples = measure_within(Runner(lambda: time.sleep(0.02), [()], CPU), rounds=40, warmup=2, budget_s=0.1)
    assert 3 <= len(samples.times) <= 5 and min(samples.times) >= 0.019


@pytest.mark.gpu
@pytest.mark.parametrize("graph, queued, syncs", [(False, False, 1), (True, False, 0), (False, True, 0)])
def test_graph_replay_is_submitted_behind_the_flush_and_a_device_wait(graph, queued, syncs, nsa_device, monkeypatch):
    """An eager call starts on a synchronised device (it pays its launches); a graph
    replay is enqueued behind the flush and a spin of HOST_SLACK_S, and any call of a
    queued runner behind the flush, so the host's submission is not timed."""
    cycles_per_s = spin_cycles_per_s(nsa_device)  # calibrated (once per device) before _sleep is replaced
    assert 1e8 < cycles_per_s < 1e10  # a GPU clock between 0.1 and 10 GHz
    x = torch.randn(1024, device=nsa_device)
    runner = Runner(lambda t: t * 2, [(x,)], nsa_device, graph=graph, queued=queued)
    calls, spins = [], []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(torch.cuda, "_sleep", spins.append)
    runner.setup()
    assert len(calls) == syncs
    assert ("submitted behind the flush and a 0.5 ms device wait" in runner.method) == graph
    assert ("queued back to back" in runner.method) == queued
    assert spins == ([int(HOST_SLACK_S * cycles_per_s)] if graph else [])


def test_runner_keeps_the_host_part_of_each_call_but_shares_it_on_a_gpu_only():
    """Every eager call's host part is kept (perf_counter around it); on the CPU a sample is all
    host time, so there is no host share to judge a benchmark by."""
    runner = Runner(lambda: time.sleep(0.002), [()], CPU)
    samples = measure(runner, rounds=3, warmup=1)
    assert len(runner.host_times) == 4 and min(runner.host_times) >= 0.002
    assert runner.host_share(samples) is None


@pytest.mark.gpu
@pytest.mark.exclusive  # another worker's kernels would lengthen the device's part of the samples
def test_host_share_tells_a_host_bound_call_from_a_device_bound_one(nsa_device):
    """A call of a few tiny kernels is host-bound (its launches take most of its sample); a
    large matrix product is not (HOST_BOUND_SHARE splits them); a replay has no host share."""
    from nsa.bench.baselines import HOST_BOUND_SHARE

    tiny = torch.randn(256, device=nsa_device)
    small = Runner(lambda t: ((t * 2 + 1) * 3 - 1).sum(), [(tiny,)], nsa_device)
    big = torch.randn(8192, 8192, device=nsa_device)
    large = Runner(lambda a: a @ a @ a, [(big,)], nsa_device)
    replay = Runner(lambda t: t * 2, [(tiny,)], nsa_device, graph=True)
    shares = [r.host_share(measure(r, rounds=5, warmup=2)) for r in (small, large, replay)]
    assert shares[0] >= HOST_BOUND_SHARE and shares[1] < HOST_BOUND_SHARE and shares[2] is None, shares


@pytest.mark.gpu
@pytest.mark.exclusive  # another worker's kernels on the same GPU would lengthen the replay's samples
def test_graph_replay_sample_leaves_out_a_stalled_host(nsa_device):
    """The host stalls for 0.4 HOST_SLACK_S between the start event and the replay's submission
    (as a garbage collection might): the sample is still the replay's device time alone. Behind the
    flush only (tens of microseconds), it held most of the stall."""
    x = torch.randn(1024, device=nsa_device)
    runner = Runner(lambda t: t * 2, [(x,)], nsa_device, graph=True)
    timer = PairTimer()
    timer.reset(nsa_device)
    for _ in range(5):
        (index,), _ = runner.setup()
        timer()
        time.sleep(0.4 * HOST_SLACK_S)
        runner.target(index)
        timer()
    assert max(timer.durations[1:]) < 0.2 * HOST_SLACK_S, timer.durations


@pytest.mark.gpu
@pytest.mark.exclusive  # another worker's kernels on the same GPU would lengthen the small calls' samples
def test_queued_calls_wait_for_the_device_once(nsa_device, monkeypatch):
    """Every round is enqueued before any is read: one synchronisation for all of them, and
    each sample is its own call's device time (a longer call, a longer sample)."""
    # the large call moves 1.5 GiB (about 0.5 ms on an H100): a small call's sample once took 0.15 ms
    # in a whole-suite GPU run (session 32), more than the large calls of 64 MiB then took (0.08-0.11 ms)
    small, large = torch.randn(1 << 10, device=nsa_device), torch.randn(1 << 27, device=nsa_device)
    runner = Runner(lambda t: (t * 2).sum(), [(small,), (large,)], nsa_device, queued=True)
    syncs = []
    real = torch.cuda.synchronize
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: (syncs.append(a), real(*a, **k)))
    samples = measure(runner, rounds=6, warmup=2)
    assert len(syncs) == 1 and len(samples.times) == 6 and all(t > 0 for t in samples.times)
    # rounds alternate small, large: the large calls (rounds 1, 3, 5) take longer
    assert min(samples.times[1::2]) > max(samples.times[0::2])


def test_queued_needs_a_device_queue_and_stays_out_of_pytest_benchmark():
    cpu = Runner(lambda: None, [()], CPU, queued=True)
    assert not cpu.queued and cpu.method == "cpu perf_counter, 1 input set(s)"  # no device queue on a CPU
    cpu.queued = True  # as a CUDA runner would be
    with pytest.raises(ValueError, match="not queued"):
        run_pedantic(_DisabledBenchmark(), cpu, rounds=3, warmup=1)


class _DisabledBenchmark:
    """pytest-benchmark's fixture with timing off (xdist): pedantic runs the target once."""

    enabled = False

    def __init__(self):
        self.calls = 0

    def pedantic(self, target, setup):
        self.calls += 1
        args, kwargs = setup()
        return target(*args, **kwargs)


def test_run_pedantic_without_timing_runs_once_and_records_nothing():
    calls = []
    bench = _DisabledBenchmark()
    assert run_pedantic(bench, Runner(lambda: calls.append(1), [()], CPU), rounds=5, warmup=2) is None
    assert bench.calls == 1 and calls == [1]


def test_timer_names_itself_for_pytest_benchmark():
    assert TIMER.__name__ == "nsa_pair_timer"
