"""The SM clock, and what holds it down, while kdt bench times a shape.

A board at its power or thermal limit runs its SMs slower, and the same kernels then read slower: on the H200, one
graph replayed back to back ran G4 N8 P32768 at 50.6 us a launch at 1,980 MHz, 52.5 once the power controller held
the SMs at 1,875, and 58-66 at 1,545 as the board neared 700 W (plans/perf-notes.md, "Thirty-sixth session").
`ClockMonitor` reads the clock and NVML's clock-event reasons from a thread while the timed runs go, and
`ClockReport.note` says so in the bench's notes where a limiter held the clock below the board's maximum. NVML's
figures trail the board by ~0.1 s, so the reads go on for TRAIL_SECONDS after the runs, and reads of an idle GPU are
left out. NVML comes through nvidia-ml-py (the `gpu` extra), imported only here and only when a GPU is timed; without
it, or where NVML does not answer, nothing is read and the bench says nothing about clocks.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass

SAMPLE_SECONDS = 0.005   # between two reads (NVML reads take tens of microseconds)
TRAIL_SECONDS = 0.15     # reads after the timed runs: NVML's clock and reasons trail the board by ~0.1 s
IDLE = 0x1               # nvmlClocksEventReasonGpuIdle: such a read is not of the timed state

# NVML's clock-event reasons that hold the SMs below the clock the load asks for (nvmlClocksEventReason*), by name;
# the others (idle, application clocks, sync boost, display) are not limits of the board
LIMITERS = {0x4: "power cap", 0x8: "hardware slowdown", 0x20: "thermal slowdown", 0x40: "hardware thermal slowdown",
            0x80: "power brake"}
LIMITER_BITS = sum(LIMITERS)


@dataclass(frozen=True)
class ClockReport:
    """The SM clock over the reads taken while a shape was timed."""

    samples: int
    sm_mhz_min: int
    sm_mhz_median: int
    sm_mhz_max: int
    sm_mhz_limit: int              # the board's highest SM clock
    limited_share: float           # of the reads, those with a limiter active
    limiters: tuple[str, ...]      # the limiters seen, by name

    def note(self) -> str | None:
        """A line for the bench's notes where a limiter held the clock below the board's maximum in some reads; None
        otherwise (README: such a row's figures depend on the board's state)."""
        if not self.limiters or self.sm_mhz_min >= self.sm_mhz_limit:
            return None
        return (f"SM clock {self.sm_mhz_min:,}-{self.sm_mhz_max:,} MHz (median {self.sm_mhz_median:,}, board maximum "
                f"{self.sm_mhz_limit:,}) while timed, held down by {' / '.join(self.limiters)} in "
                f"{100 * self.limited_share:.0f}% of {self.samples} reads")


def summarise(samples: list[tuple[int, int]], limit_mhz: int) -> ClockReport | None:
    """The report of `samples`, (SM MHz, clock-event reason bits) per read, those of an idle GPU left out; None for
    no reads."""
    samples = [(clock, bits) for clock, bits in samples if not bits & IDLE]
    if not samples:
        return None
    mhz = [clock for clock, _ in samples]
    seen = 0
    for _, bits in samples:
        seen |= bits
    limited = sum(1 for _, bits in samples if bits & LIMITER_BITS)
    return ClockReport(len(samples), min(mhz), round(statistics.median(mhz)), max(mhz), limit_mhz,
                       limited / len(samples), tuple(name for bit, name in LIMITERS.items() if seen & bit))


class ClockMonitor:
    """`with ClockMonitor(pci_bus_id) as clocks: <timed runs>`, then `clocks.report`: a ClockReport of the reads
    taken meanwhile, or None (no nvidia-ml-py, NVML unavailable, no read in time)."""

    def __init__(self, pci_bus_id: str):
        self.pci_bus_id = pci_bus_id
        self.report: ClockReport | None = None
        self._samples: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "ClockMonitor":
        try:
            import pynvml  # nvidia-ml-py
        except ImportError:
            return self
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError:
            return self
        try:
            handle = pynvml.nvmlDeviceGetHandleByPciBusId(self.pci_bus_id.encode())
            limit = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)
            reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
            try:
                reasons(handle)
            except (TypeError, pynvml.NVMLError):  # an older driver: the same bits under their former name
                reasons = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
                reasons(handle)
        except pynvml.NVMLError:
            pynvml.nvmlShutdown()
            return self
        self._nvml, self._limit = pynvml, limit
        self._thread = threading.Thread(target=self._read, args=(handle, reasons), daemon=True)
        self._thread.start()
        return self

    def _read(self, handle, reasons) -> None:
        nvml = self._nvml
        while not self._stop.wait(SAMPLE_SECONDS):
            try:
                self._samples.append((nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM), reasons(handle)))
            except nvml.NVMLError:
                return

    def __exit__(self, *exc) -> None:
        if self._thread is None:
            return
        time.sleep(TRAIL_SECONDS)
        self._stop.set()
        self._thread.join()
        self._nvml.nvmlShutdown()
        self.report = summarise(self._samples, self._limit)
