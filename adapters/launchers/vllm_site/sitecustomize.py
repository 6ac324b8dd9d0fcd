"""Run at the start of every Python process of a local vLLM server (this folder is on its
PYTHONPATH): asks Linux for permission to use Intel AMX tiles.

vLLM's CPU build picks its AMX attention kernel for bfloat16 with a block size that is a multiple
of 32 wherever the CPU reports AMX, but its model worker never asks the kernel for the AMX state
(`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, required per process since Linux 5.16),
so the first decode step on such a CPU (Sapphire Rapids and later) kills the worker with SIGILL.
Asking is harmless elsewhere: the call fails on a kernel or CPU without AMX. Where the CPU reports
AMX and Linux still refuses (a hypervisor that hides the tile state), the server's log says so,
since the worker's death will not.
"""

import ctypes
import platform
import sys

SYS_ARCH_PRCTL = 158  # x86_64's system call number for arch_prctl
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18


def request_amx() -> bool:
    """Ask for the AMX tile state; whether the kernel granted it."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)) == 0
    except (OSError, AttributeError):
        return False


def cpu_reports_amx() -> bool:
    """Whether /proc/cpuinfo lists AMX tiles among this CPU's flags."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return "amx_tile" in f.read().split()
    except OSError:
        return False


if not request_amx() and cpu_reports_amx():
    sys.stderr.write("harness: this CPU reports AMX tiles but Linux refused them to this process; "
                     "vLLM's bfloat16 attention with a block size that is a multiple of 32 uses "
                     "them and its worker will die of SIGILL (exit code -4)\n")
