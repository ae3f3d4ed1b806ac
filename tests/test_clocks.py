"""kdt.clocks without a GPU: the report of a set of clock reads and its note, and the monitor's reads through a
stand-in for nvidia-ml-py (and its silence without one)."""

from __future__ import annotations

import sys
import time
from types import SimpleNamespace

from kdt import clocks

POWER_CAP, THERMAL, IDLE = 0x4, 0x20, 0x1


def test_reads_at_full_clock_give_no_note():
    report = clocks.summarise([(1980, 0), (1975, 0), (1965, 0)], 1980)
    assert (report.samples, report.sm_mhz_min, report.sm_mhz_median, report.sm_mhz_max) == (3, 1965, 1975, 1980)
    assert report.limiters == () and report.limited_share == 0
    assert report.note() is None


def test_a_power_cap_is_named_with_the_clocks_it_left():
    reads = [(1980, 0)] * 2 + [(1500, POWER_CAP)] * 5 + [(1815, POWER_CAP | THERMAL)] * 3
    report = clocks.summarise(reads, 1980)
    assert report.limiters == ("power cap", "thermal slowdown")
    assert report.limited_share == 0.8
    assert (report.sm_mhz_min, report.sm_mhz_median, report.sm_mhz_max) == (1500, 1658, 1980)
    assert report.note() == ("SM clock 1,500-1,980 MHz (median 1,658, board maximum 1,980) while timed, held down by "
                             "power cap / thermal slowdown in 80% of 10 reads")


def test_a_limiter_that_left_the_clock_at_its_maximum_gives_no_note():
    report = clocks.summarise([(1980, POWER_CAP)] * 4, 1980)
    assert report.limiters == ("power cap",) and report.note() is None


def test_no_reads_no_report():
    assert clocks.summarise([], 1980) is None


def test_reads_of_an_idle_gpu_are_left_out():
    report = clocks.summarise([(1500, POWER_CAP), (210, IDLE), (210, IDLE | POWER_CAP)], 1980)
    assert (report.samples, report.sm_mhz_min, report.limited_share) == (1, 1500, 1.0)
    assert clocks.summarise([(210, IDLE)], 1980) is None


class _Nvml(SimpleNamespace):
    """nvidia-ml-py as kdt.clocks uses it: a board whose clock drops to 1,500 MHz under a power cap after 3 reads."""

    class NVMLError(Exception):
        pass

    NVML_CLOCK_SM = 1

    def __init__(self, event_reasons=True):
        super().__init__(reads=0, shut=0, bus_ids=[])
        if event_reasons:
            self.nvmlDeviceGetCurrentClocksEventReasons = self._reasons
        else:  # an older nvidia-ml-py: the same bits under their former name only
            self.nvmlDeviceGetCurrentClocksThrottleReasons = self._reasons

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut += 1

    def nvmlDeviceGetHandleByPciBusId(self, bus_id):
        self.bus_ids.append(bus_id)
        return "handle"

    def nvmlDeviceGetMaxClockInfo(self, handle, kind):
        assert (handle, kind) == ("handle", 1)
        return 1980

    def nvmlDeviceGetClockInfo(self, handle, kind):
        self.reads += 1
        return 1980 if self.reads <= 3 else 1500

    def _reasons(self, handle):
        return 0 if self.reads <= 3 else POWER_CAP


def _monitor(monkeypatch, nvml, seconds=0.1):
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(clocks, "SAMPLE_SECONDS", 0.001)
    monkeypatch.setattr(clocks, "TRAIL_SECONDS", 0.001)
    with clocks.ClockMonitor("0000:19:00.0") as monitor:
        time.sleep(seconds)
    return monitor


def test_the_monitor_reads_the_board_while_the_runs_go(monkeypatch):
    for event_reasons in (True, False):
        nvml = _Nvml(event_reasons)
        report = _monitor(monkeypatch, nvml).report
        assert nvml.bus_ids == [b"0000:19:00.0"] and nvml.shut == 1
        assert report.samples == nvml.reads > 3
        assert (report.sm_mhz_min, report.sm_mhz_max, report.sm_mhz_limit) == (1500, 1980, 1980)
        assert report.limiters == ("power cap",) and report.limited_share == (nvml.reads - 3) / nvml.reads


def test_without_nvml_the_monitor_reads_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    monkeypatch.setattr(clocks, "SAMPLE_SECONDS", 0.001)
    with clocks.ClockMonitor("0000:19:00.0") as monitor:
        time.sleep(0.01)
    assert monitor.report is None


def test_an_nvml_that_fails_leaves_no_report(monkeypatch):
    nvml = _Nvml()

    def no_board(bus_id):
        raise nvml.NVMLError("not found")

    nvml.nvmlDeviceGetHandleByPciBusId = no_board
    monitor = _monitor(monkeypatch, nvml, 0.01)
    assert monitor.report is None and nvml.shut == 1 and nvml.reads == 0
