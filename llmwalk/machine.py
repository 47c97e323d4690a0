"""What this machine is and what it can do, as the speed and memory tables name it: the CPU, this process's peak
memory, and how fast memory delivers bytes (decoding's roofline)."""
from __future__ import annotations

import os
import platform
import re
import sys
import time
from pathlib import Path

import torch


def cpu_model() -> str:
    """The CPU's name as the OS reports it (Linux /proc/cpuinfo, macOS sysctl), else the machine type."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Model")):            # x86; Raspberry-Pi-style ARM
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        import subprocess
        out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True)
        if out.stdout.strip():
            return out.stdout.strip()
    return platform.processor() or platform.machine()


def cpu_line() -> str:
    """The line printed above every speed table: the numbers hold for this CPU, these kernels and this thread count."""
    return (f"CPU: {cpu_model()} ({os.cpu_count()} logical cores), torch {torch.__version__} CPU capability "
            f"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} torch threads. "
            "Ratios vary by CPU: measure on yours.")


def memory_line() -> str:
    """The line printed above every memory table (Linux: the classroom measurement reads /proc)."""
    total = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1)) / 2**20
    return f"{cpu_model()}, {os.cpu_count()} cores, {total:.0f} GB RAM, {platform.platform()}"


def reset_peak_rss() -> bool:
    """Reset the process's peak resident memory (Linux: /proc/self/clear_refs); False where that is impossible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float:
    """The process's peak resident memory in MB (ru_maxrss: kB on Linux, bytes on macOS); NaN on Windows, which has
    no `resource` module (imported here, not at the top, so that the notebooks' timings import there too)."""
    try:
        import resource
    except ImportError:
        return float("nan")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


def memory_bandwidth(nbytes: int = 2**28, repeats: int = 5) -> float:
    """Bytes per second this process reads from memory: a sum over a float32 tensor of `nbytes` (far larger than
    any CPU cache), the fastest of `repeats` runs. Decoding reads every weight once per token, so weight bytes ÷
    this is the fastest a token can come (the roofline)."""
    x = torch.ones(nbytes // 4)
    x.sum()                                              # first touch: page faults, not reads
    best = float("inf")
    for _ in range(repeats):
        tic = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - tic)
    return nbytes / best
