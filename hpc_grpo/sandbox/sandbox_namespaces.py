"""How the code sandbox is isolated (the half of hpc_grpo/sandbox/code_sandbox.py that is not the test harness).

Loaded by code_sandbox.py from its own folder, by path: the runner starts as `python -I -S`, so it must not
import hpc_grpo or anything the code under test could tamper with. Stdlib only, like the runner.
The job's "isolation" (the recipe's grpo.code.isolation: "auto" or "limits-only") picks the mode:

- namespaces+uid (root: containers, CI) and userns (a normal user, through unprivileged user namespaces:
  CLONE_NEWUSER with the user's own uid mapped onto itself) give the code the same view of the node:
  * its own network namespace: no interface is up, not even loopback, so no socket reaches anything
    (services on 127.0.0.1 and the host's abstract unix sockets belong to the host's namespace);
  * its own minimal root (a tmpfs, pivot_root, the old root detached): the system's /usr, /bin, /lib*,
    a few files of /etc (the dynamic linker's cache, the time zone) and the Python installation's prefix
    (its package folders covered: sandbox_kernel.hide_packages), all read-only; a tiny /dev (null, zero, urandom); private size-capped tmpfs on /tmp, /var/tmp and
    /dev/shm that vanish with it. Nothing else exists there: not the home folder (~/.netrc, caches),
    not the run directory or the data files that hold the expected answers, not /work, /root, /run (munge,
    Ray's sockets), Slurm's spool;
  * its own PID namespace, the code its PID 1 with a fresh /proc: it sees only its own processes (no
    /proc/<scorer>/environ), and killing it makes the kernel kill every process it started, double-forked
    setsid daemons included;
  * no privilege: root's path switches to a uid of its own from a locked pool (root ignores RLIMIT_NPROC, a
    pool uid does not, and owns no file); userns's drops every capability it held in its namespace and caps
    that namespace's nested user namespaces at 0; both set no_new_privs and empty the capability bounding set.
  * its own IPC namespace and session keyring (sandbox_kernel.py): no SysV or POSIX IPC object, no key of
    the scorer's, and nothing of one sample's left for the next;
- limits-only (grpo.code.isolation=limits-only: the recipe's explicit consent): the runner's limits and the kill
  of every process the code started (the runner is their child subreaper, so setsid daemons die too), but
  the code runs with the user's own rights: it reads what the user reads and reaches the network.
  With "auto" the runner never falls back to it: where the namespaces cannot be made it reports a
  sandbox_error (the scorer refuses earlier, from `--probe`: hpc_grpo/cluster/isolation.py).

The runner calls, in order: prepare (before the fork: mode, pool uid, work folder, the namespaces the child
is born into), enter (in the child: its root, network, privileges), await_ready (the runner waits for the
child's verdict), then kill and sweep at the end. probe does the same once for `--probe`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import os
import re
import secrets
import select
import signal
import stat
import sys
import time


CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000  # its own SysV and POSIX IPC (sandbox_kernel.py caps it)
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_MOVE, MS_REC = 1024, 2048, 4096, 8192, 16384
MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 1 << 18, 1 << 21, 1 << 24
MNT_DETACH = 2
PR_SET_DUMPABLE, PR_SET_KEEPCAPS, PR_CAPBSET_DROP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 4, 8, 24, 36, 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}

MODES = ("namespaces+uid", "userns", "limits-only")
UID_BASE = int(os.environ.get("HPC_GRPO_SANDBOX_UID_BASE", "61000"))
UID_SLOTS = 256
LOCK_DIR = "/run/hpc-grpo-sandbox" if os.path.isdir("/run") else "/var/tmp/hpc-grpo-sandbox"
WORKDIR = "/tmp/work"
STAGE = "/tmp"  # where the child assembles its root, in its own mount namespace (the host's /tmp is never touched)
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "alternatives")
DEVICES = ("null", "zero", "urandom")
SCRATCH = (("/tmp", "64m"), ("/var/tmp", "8m"), ("/dev/shm", "8m"))


def libc_handle() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _errno(what: str) -> str:
    return f"{what}: {os.strerror(ctypes.get_errno())}"


def _mount(libc: ctypes.CDLL, src: str | None, dst: str, fstype: str | None, flags: int, data: str | None = None) -> str:
    """mount(2); '' when done, else why not."""
    def enc(s: str | None) -> bytes | None:
        return None if s is None else s.encode()

    if libc.mount(enc(src), dst.encode(), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        return _errno(f"mount {src or ''} {dst}")
    return ""


def _unshare(libc: ctypes.CDLL, flags: int) -> str:
    return _errno("unshare") if libc.unshare(flags) != 0 else ""


def _mode(job: dict) -> str:
    """What this job gets: limits-only when the job asks for it, else root's or a normal user's namespaces."""
    if job.get("isolation", "auto") == "limits-only":
        return "limits-only"
    return "namespaces+uid" if os.geteuid() == 0 else "userns"


def _claim_uid() -> tuple[int, int] | None:
    """A uid no other running sandbox uses, held by an flock that dies with this process."""
    os.makedirs(LOCK_DIR, mode=0o700, exist_ok=True)
    start = secrets.randbelow(UID_SLOTS)
    for i in range(UID_SLOTS):
        slot = (start + i) % UID_SLOTS
        fd = os.open(os.path.join(LOCK_DIR, f"slot-{slot}.lock"), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return UID_BASE + slot, fd
        except OSError:
            os.close(fd)
    return None


def _isolate(libc: ctypes.CDLL, mode: str) -> str:
    """This runner's side, before the fork: the namespaces the code is born into ('' when done, else why not).

    A new PID namespace takes effect for the next child only, which becomes its PID 1. A normal user first
    makes a user namespace with its own uid and gid mapped onto themselves, in which it holds the capabilities
    the child's mounts need; the kernel keeps checking every file access against the real uid."""
    if mode == "namespaces+uid":
        return _unshare(libc, CLONE_NEWPID)
    uid, gid = os.getuid(), os.getgid()
    return _unshare(libc, CLONE_NEWUSER | CLONE_NEWPID) or _write_maps(uid, gid)


def _enter_root(libc: ctypes.CDLL, uid: int | None) -> str:
    """The child's side (PID 1 of the new PID namespace): own mount and network namespaces, the minimal root
    built at STAGE, its own /proc, then pivot_root into it with the old root detached. '' or why not."""
    why = _unshare(libc, CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC) or _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)
    if why:
        return why
    shown = [p for p in SYSTEM if os.path.lexists(p)] + [f"/etc/{n}" for n in ETC if os.path.lexists(f"/etc/{n}")]
    shown += [f"/dev/{n}" for n in DEVICES] + _expose_python()
    links: dict[str, str] = {}
    held: dict[str, int] = {}  # opened before STAGE is covered, bound from /proc/self/fd/N after
    try:
        for path in shown:
            if os.path.islink(path):
                links[path] = os.readlink(path)
            else:
                held[path] = os.open(path, os.O_PATH | os.O_CLOEXEC)
        why = _mount(libc, "tmpfs", STAGE, "tmpfs", MS_NOSUID | MS_NODEV, "size=2m,mode=0755")
        for path, target in links.items():
            os.makedirs(os.path.dirname(STAGE + path), mode=0o755, exist_ok=True)
            os.symlink(target, STAGE + path)
        for path, fd in held.items():
            why = why or _bind(libc, fd, STAGE + path, device=path.startswith("/dev/"))
    finally:
        for fd in held.values():
            os.close(fd)
    if why:
        return why
    return _furnish(libc, uid) or _pivot(libc)


def _expose_python() -> list[str]:
    """The interpreter's prefix (the standard library, lib-dynload), when the system folders do not hold it:
    pyenv under /root, conda or a module tree under /opt or the home folder. Only the prefix: not the venv,
    not the rest of the folder it lives in."""
    prefix = os.path.abspath(sys.base_prefix)
    if prefix == "/" or any(prefix == d or prefix.startswith(d + "/") for d in SYSTEM):
        return []
    return [prefix]


def _bind(libc: ctypes.CDLL, fd: int, dst: str, device: bool) -> str:
    """Bind what `fd` holds at `dst` (in STAGE), read-only, with every mount below it read-only too."""
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        os.makedirs(dst, mode=0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), mode=0o755, exist_ok=True)
        os.close(os.open(dst, os.O_CREAT | os.O_WRONLY, 0o644))
    why = _mount(libc, f"/proc/self/fd/{fd}", dst, None, MS_BIND | MS_REC)
    if why:
        return why
    with open("/proc/self/mountinfo") as handle:
        points = [_unescape(line.split()[4]) for line in handle]
    for point in points:
        if point == dst or point.startswith(dst + "/"):
            why = _readonly(libc, point, device)
            if why:
                return why
    return ""


def _unescape(field: str) -> str:
    """A mountinfo path: the kernel writes space, tab, newline and backslash as octal escapes (\\040)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _readonly(libc: ctypes.CDLL, point: str, device: bool = False) -> str:
    """Remount one bind read-only, nosuid (nodev unless it is a device). Flags the host set stay set: in a
    user namespace the kernel refuses a remount that would clear them (noexec, the atime mode)."""
    try:
        have = os.statvfs(point).f_flag
    except OSError as exc:
        return f"statvfs {point}: {exc.strerror}"
    flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | (0 if device else MS_NODEV)
    flags |= MS_NODEV if have & os.ST_NODEV else 0
    flags |= MS_NOEXEC if have & os.ST_NOEXEC else 0
    flags |= MS_NODIRATIME if have & os.ST_NODIRATIME else 0
    if have & os.ST_NOATIME:
        flags |= MS_NOATIME
    elif have & os.ST_RELATIME:
        flags |= MS_RELATIME
    else:
        flags |= MS_STRICTATIME
    return _mount(libc, None, point, None, flags)


def _furnish(libc: ctypes.CDLL, uid: int | None) -> str:
    """The rest of the root: scratch tmpfs, the work folder, /dev's links, a passwd naming only the sandbox user,
    its own /proc; then the root tmpfs itself goes read-only."""
    for sub in ("/proc", "/etc", "/var/tmp", "/dev/shm", "/tmp"):
        os.makedirs(STAGE + sub, mode=0o755, exist_ok=True)
    for target, size in SCRATCH:
        why = _mount(libc, "tmpfs", STAGE + target, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=1777")
        if why:
            return why
    owner = uid if uid is not None else os.getuid()
    group = uid if uid is not None else os.getgid()
    os.makedirs(STAGE + WORKDIR, mode=0o700)
    os.chown(STAGE + WORKDIR, owner, group)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{STAGE}/dev/{name}")
    files = {"passwd": f"root:x:0:0::/:/usr/sbin/nologin\nsandbox:x:{owner}:{group}::{WORKDIR}:/usr/sbin/nologin\n",
             "group": f"root:x:0:\nsandbox:x:{group}:\n", "hosts": "127.0.0.1 localhost\n::1 localhost\n"}
    for name, text in files.items():
        with open(f"{STAGE}/etc/{name}", "w") as handle:
            handle.write(text)
    # Best effort: the kernel refuses a new proc where the host's /proc is partly masked (some container
    # runtimes). Then /proc stays empty: nothing is visible, which is as private, only less convenient.
    _mount(libc, "proc", STAGE + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    return _mount(libc, None, STAGE, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _pivot(libc: ctypes.CDLL) -> str:
    """Make STAGE the root and detach the old one: no path leads back to the host's files. Where the host's
    root is not a mount pivot_root can swap (a node booted from initramfs), move STAGE onto / and chroot:
    the code holds no capability that could climb out of the chroot."""
    os.chdir(STAGE)
    number = SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is not None and libc.syscall(number, b".", b".") == 0:
        if libc.umount2(b".", MNT_DETACH) != 0:
            return _errno("umount the old root")
    else:
        why = _mount(libc, ".", "/", None, MS_MOVE)
        if why:
            return why
        os.chroot(".")
    os.chdir("/")
    return ""


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _caps(libc: ctypes.CDLL, keep: bool) -> str:
    """Set this process's effective capabilities to its permitted ones (keep) or clear all three sets."""
    head, data = _CapHeader(0x20080522, 0), (_CapData * 2)()
    if keep:
        if libc.capget(ctypes.byref(head), data) != 0:
            return _errno("capget")
        for d in data:
            d.effective = d.permitted
    return _errno("capset") if libc.capset(ctypes.byref(head), data) != 0 else ""


def _write_maps(uid: int, gid: int) -> str:
    """Map the (outer) uid and gid onto themselves in this process's new user namespace."""
    try:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as handle:
                handle.write(text)
    except OSError as exc:
        return f"user namespace {exc.filename}: {exc.strerror}"
    return ""


def _pool_userns(libc: ctypes.CDLL, uid: int) -> bool:
    """Root's path, its root built: become the pool uid, keeping the capabilities one step longer to enter a
    user namespace of its own (where the unprivileged may not make one, the capability still may). So both
    modes end alike, the code in a user namespace whose nested namespaces get capped at 0. True when it got
    one; where the kernel has none, the code cannot make one either, and the pool uid alone holds."""
    if libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "keepcaps")
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # a uid change clears it, and /proc/self/uid_map is then root's
    why = _caps(libc, keep=True)
    if why:
        raise OSError(ctypes.get_errno(), why)
    if _unshare(libc, CLONE_NEWUSER):
        return False
    _write_maps(uid, uid)  # without a map the code sees itself as nobody; the kernel still checks the pool uid
    return True


def _drop_privileges(libc: ctypes.CDLL, uid: int | None) -> str:
    """No way back to a privilege: root's path first becomes its pool uid (_pool_userns); then, in the code's
    own user namespace, no nested user namespace (one would give it the capabilities to mount a tmpfs of any
    size, past the caps of /tmp and /dev/shm); no_new_privs (setuid files and file capabilities stop working),
    an empty bounding set and no capability at all."""
    own_userns = _pool_userns(libc, uid) if uid is not None else True
    if own_userns:  # never otherwise: outside its own user namespace this file is the node's own limit
        try:
            with open("/proc/sys/user/max_user_namespaces", "w") as handle:
                handle.write("0")
        except OSError:
            pass  # no /proc of its own (see _furnish): nothing to read or write there either
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return _errno("no_new_privs")
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:  # EINVAL: past the last
            return _errno(f"drop capability {cap}")
    return _caps(libc, keep=False)


def _tasks_of(uid: int) -> int:
    """Tasks (threads included: RLIMIT_NPROC counts them) whose real uid is `uid`, from the host's /proc."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as handle:
                fields = dict(line.split(":", 1) for line in handle if line.startswith(("Uid:", "Threads:")))
        except (OSError, ValueError):
            continue  # gone meanwhile
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            count += int(fields.get("Threads", "1"))
    return count


def _nproc_limit(job: dict, mode: str) -> int | None:
    """RLIMIT_NPROC for the code; None where it is not applied (root's own processes ignore it).

    The rule: the code may always run max_procs tasks at once (its first process included), and a fork bomb
    stops at max_procs more than
    the sandbox had, however many processes the user already runs. The kernel counts a real uid's tasks
    (threads too) against the limit; since Linux 5.14 it counts per user namespace, so in userns mode the
    count holds only the sandbox's own tasks and the limit is max_procs (the enclosing namespace is checked
    against the user's own limit, as for any process). A pool uid (root's path) runs nothing else either.
    Without a user namespace (limits-only), or on an older kernel, the count holds every task of the user,
    the training job's included: there the limit is the user's count now plus max_procs (a plain max_procs
    would make every fork of honest code fail as soon as the job runs more than max_procs threads)."""
    max_procs = int(job.get("max_procs", 32))
    if mode == "namespaces+uid":
        return max_procs
    if os.getuid() == 0:
        return None
    release = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2] if x.isdigit())
    if mode == "userns" and release >= (5, 14):
        return max_procs + 1  # this runner made the namespace and is counted in it: the code still gets max_procs
    return _tasks_of(os.getuid()) + max_procs



def kill(pid: int, mode: str) -> None:
    """SIGKILL the code. In the namespace modes it is PID 1 of its own PID namespace: the kernel then kills
    every process it ever started, and its exit (what waitpid sees) waits for all of them. limits-only:
    its process group now, then sweep for whatever left the group (setsid)."""
    targets = [(os.kill, pid)] if mode != "limits-only" else [(os.killpg, pid), (os.kill, pid)]
    for kill, target in targets:
        try:
            kill(target, signal.SIGKILL)
        except ProcessLookupError:
            pass


def sweep() -> None:
    """limits-only: this runner is a child subreaper, so every process the code started and orphaned (a
    double-forked daemon) is now its child: kill and reap them until none is left (a fork bomb's survivors
    keep forking for a moment; RLIMIT_NPROC bounds how many)."""
    children = f"/proc/self/task/{os.getpid()}/children"
    for _ in range(1000):
        try:
            with open(children) as handle:
                pids = [int(p) for p in handle.read().split()]
        except OSError:
            pids = []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        reaped = 0
        while True:
            try:
                got, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if not got:
                break
            reaped += 1
        if not pids and not reaped:
            time.sleep(0.005)


def prepare(job: dict, libc: ctypes.CDLL, deadline: float) -> tuple[str, int | None, str, str]:
    """Choose and enter the isolation before the fork: (mode, pool uid or None, work folder, why not)."""
    mode = _mode(job)
    job["nproc_limit"] = None
    if mode == "limits-only":
        import tempfile

        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        job["nproc_limit"] = _nproc_limit(job, mode)
        return mode, None, tempfile.mkdtemp(prefix="hpc-grpo-sandbox-"), ""
    uid = None
    if mode == "namespaces+uid":
        claimed = _claim_uid()
        while claimed is None and time.monotonic() < deadline:  # all 256 uids busy: wait, never run unisolated
            time.sleep(0.05)
            claimed = _claim_uid()
        if claimed is None:
            return mode, None, WORKDIR, "no free sandbox uid"
        uid = claimed[0]  # its lock fd stays open (and locked) until this process exits
    job["nproc_limit"] = _nproc_limit(job, mode)  # before _isolate: the count needs the host's /proc
    return mode, uid, WORKDIR, _isolate(libc, mode)


def enter(libc: ctypes.CDLL, mode: str, uid: int | None, ready_fd: int, harden=lambda: "") -> None:  # noqa: ANN001
    """The child's isolation, before _child runs anything of the job: tells the runner '' or why not on
    ready_fd and exits on failure (the code never runs half-isolated). harden(): what must be set while the
    child still holds its capabilities, inside its new namespaces (the IPC caps: sandbox_kernel.py)."""
    why = ""
    if mode != "limits-only":
        try:
            why = _enter_root(libc, uid) or harden() or _drop_privileges(libc, uid)
        except OSError as exc:
            why = f"{exc.filename or ''}: {exc.strerror}"
        except Exception as exc:  # noqa: BLE001 - whatever it is, the code must not run half-isolated
            why = f"{type(exc).__name__}: {exc}"
    os.write(ready_fd, (why.replace("\n", " ") + "\n").encode())
    os.close(ready_fd)
    if why:
        os._exit(4)


def await_ready(fd: int, deadline: float) -> str:
    """The child's isolation report: '' when it is in place, else why not."""
    data = b""
    while not data.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 4096) if ready else b""
        if not chunk:
            return "the sandbox's set-up did not finish" if ready else "the sandbox's set-up timed out"
        data += chunk
    return data.decode("utf-8", "replace").strip()



def probe() -> dict:
    """What grpo.code.isolation=auto gets on this node: the real set-up (namespaces, minimal root, /proc,
    privileges dropped) made once in a child that then exits, and its outcome. Run in a process of its own
    (`--probe`): the namespaces it enters cannot be left."""
    job = {"isolation": "auto", "max_procs": 32}
    libc = libc_handle()
    t0 = time.monotonic()
    mode, uid, _, why = prepare(job, libc, t0 + 10.0)
    if not why:
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(ready_r)
            enter(libc, mode, uid, ready_w)
            os._exit(0)
        os.close(ready_w)
        why = await_ready(ready_r, t0 + 10.0)
        os.waitpid(pid, 0)
    out = {"isolation": "limits-only" if why else mode, "tried": mode, "seconds": round(time.monotonic() - t0, 4)}
    if why:
        out["why"] = why
    return out
