"""Thread choice on a shared machine (sparsekv.suite.threads): the idle cores, never fewer than one, and
OMP_NUM_THREADS when the user set it. /proc/stat is replaced by fixed counters, so nothing here depends on the
machine's load."""
import itertools

import pytest

from sparsekv.suite import threads


@pytest.fixture
def counters(monkeypatch):
    """Feed busy_cores two /proc/stat readings: (busy, total) jiffies summed over all CPUs."""
    def feed(first, second, cores):
        readings = itertools.cycle([first, second])
        monkeypatch.setattr(threads, "_cpu_times", lambda: next(readings))
        monkeypatch.setattr(threads.os, "cpu_count", lambda: cores)
        monkeypatch.setattr(threads.time, "sleep", lambda s: None)
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    return feed


def test_an_idle_machine_gets_every_core(counters):
    counters((1000, 10_000), (1010, 10_200), cores=2)          # 10 of 200 jiffies busy: 0.1 cores
    assert threads.choose() == 2


def test_one_busy_neighbour_costs_its_core(counters):
    counters((0, 0), (100, 200), cores=2)                      # half of all CPU time busy: one core of two
    assert threads.choose() == 1


def test_a_saturated_machine_still_gets_one_thread(counters):
    counters((0, 0), (800, 800), cores=8)
    assert threads.choose() == 1


def test_unreadable_counters_mean_every_core(counters):
    counters(None, None, cores=4)
    assert threads.busy_cores() == 0.0 and threads.choose() == 4


def test_the_user_s_setting_wins(counters, monkeypatch):
    counters((0, 0), (100, 200), cores=2)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert threads.choose() == 2
