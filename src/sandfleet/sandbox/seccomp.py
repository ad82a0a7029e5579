"""The default seccomp filter of every command run in a sandbox (docs/security.md, "Syscall filter").

The profile is the OCI runtimes' default (moby's ``profiles/seccomp/default.json``): an
allowlist, every other syscall failing with EPERM, with its capability-gated parts resolved
for a container with Docker's default capabilities (no CAP_SYS_ADMIN, CAP_SYS_PTRACE,
CAP_SYS_MODULE, ...). Two changes: io_uring is blocked (as containerd's and podman's
profiles do since 2023: it bypasses the filter for the I/O it performs and has been the
most exploited kernel surface of recent years), and only the sandbox's own arch is allowed
(no i386 or x32 entry points: they fail with ENOSYS).

Each blocked group is a named **rule** that a caller can opt out of (:data:`RULES`), through
``SandboxSpec.seccomp_allow``, ``--seccomp-allow`` and the task.toml key
``[environment] seccomp_allow``; ``unconfined`` turns the filter off.

libseccomp compiles it, on the host: :func:`filter_program` builds a small helper against it
once (``seccomp_gen.c``, cached by source hash like the guest agent), runs it once per
(profile, arch) and caches the program, which the host hands to the guest agent in HELLO.
The agent installs it in each command's process after its own namespace steps (the user
namespace, the verifier's network namespace), so those keep working.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import subprocess
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sandfleet.errors import HostUnsupportedError
from sandfleet.settings import current as current_settings

UNCONFINED = "unconfined"
"""The ``seccomp_allow`` value that turns the filter off."""
EPERM, ENOSYS = 1, 38


@dataclass(frozen=True)
class Rule:
    """A group of syscalls the default filter blocks, and what opting out allows."""

    syscalls: tuple[str, ...]
    why: str


RULES: dict[str, Rule] = {
    "namespaces": Rule(("unshare", "setns", "clone", "clone3"),
                       "new user, mount, network, pid, ipc, uts and cgroup namespaces (clone with a namespace "
                       "flag, unshare, setns): the way to most user-namespace kernel exploits; clone3 fails "
                       "with ENOSYS so libc falls back to clone, whose flags the filter can read"),
    "mount": Rule(("mount", "umount", "umount2", "pivot_root", "fsopen", "fsconfig", "fsmount", "fspick",
                   "move_mount", "open_tree", "mount_setattr", "457", "458", "467"),
                  "mounting filesystems (incl. the new mount API, statmount and listmount): filesystem "
                  "drivers parsing attacker data"),
    "keyring": Rule(("add_key", "keyctl", "request_key"),
                    "the kernel keyring: not namespaced, shared by every sandbox of a host uid"),
    "bpf": Rule(("bpf",), "eBPF programs and maps: the verifier is a large attack surface"),
    "perf_event_open": Rule(("perf_event_open",), "performance counters: kernel address and timing leaks"),
    "userfaultfd": Rule(("userfaultfd",), "a staple of kernel race exploits (stalls kernel copies at will)"),
    "io_uring": Rule(("io_uring_setup", "io_uring_enter", "io_uring_register"),
                     "its operations run without passing the filter; blocked by containerd, podman, "
                     "ChromeOS and Android for its exploit record"),
    "process_access": Rule(("kcmp", "pidfd_getfd", "process_madvise"),
                           "reach into another process (CAP_SYS_PTRACE-gated in the OCI profile)"),
    "personality": Rule(("personality",), "execution domains other than Linux and its 32-bit and "
                        "UNAME26 variants (e.g. turning off address randomisation)"),
    "vsock": Rule(("socket",), "AF_VSOCK sockets: host-guest channels of virtual machines"),
    "open_by_handle_at": Rule(("open_by_handle_at",), "opens files by handle, past mount boundaries "
                              "(the 'Shocker' container escape)"),
    "fanotify": Rule(("fanotify_init",), "filesystem-wide event monitoring"),
    "clock": Rule(("settimeofday", "stime", "clock_settime", "clock_settime64"), "setting the system clock"),
    "mempolicy": Rule(("get_mempolicy", "mbind", "set_mempolicy", "set_mempolicy_home_node", "migrate_pages",
                       "move_pages"), "NUMA memory policy (CAP_SYS_NICE-gated in the OCI profile)"),
    "hostname": Rule(("sethostname", "setdomainname"), "renaming the host"),
    "syslog": Rule(("syslog",), "the kernel log: kernel addresses"),
    "quotactl": Rule(("quotactl", "quotactl_fd"), "filesystem quotas"),
    "acct": Rule(("acct",), "process accounting"),
    "modules": Rule(("init_module", "finit_module", "delete_module"), "loading kernel modules"),
    "kexec": Rule(("kexec_load", "kexec_file_load"), "booting another kernel"),
    "reboot": Rule(("reboot",), "rebooting"),
    "swap": Rule(("swapon", "swapoff"), "swap devices"),
    "iopl": Rule(("iopl", "ioperm"), "raw I/O port access"),
    "obsolete": Rule(("lookup_dcookie", "nfsservctl", "uselib", "_sysctl", "sysfs", "ustat", "create_module",
                      "get_kernel_syms", "query_module", "vhangup"),
                     "obsolete or host-administration calls no program in a sandbox needs"),
}

# moby's default allowlist (less io_uring, which is a rule above), with the arch-specific
# entries of x86_64 and arm64; a name this arch lacks is skipped by the compiler.
ALLOWED = """
accept accept4 access adjtimex alarm bind brk capget capset chdir chmod chown chown32 clock_adjtime
clock_adjtime64 clock_getres clock_getres_time64 clock_gettime clock_gettime64 clock_nanosleep
clock_nanosleep_time64 close close_range connect copy_file_range creat dup dup2 dup3 epoll_create
epoll_create1 epoll_ctl epoll_ctl_old epoll_pwait epoll_pwait2 epoll_wait epoll_wait_old eventfd eventfd2
execve execveat exit exit_group faccessat faccessat2 fadvise64 fadvise64_64 fallocate fanotify_mark fchdir
fchmod fchmodat fchown fchown32 fchownat fcntl fcntl64 fdatasync fgetxattr flistxattr flock fork
fremovexattr fsetxattr fstat fstat64 fstatat64 fstatfs fstatfs64 fsync ftruncate ftruncate64 futex
futex_time64 futex_waitv futimesat getcpu getcwd getdents getdents64 getegid getegid32 geteuid geteuid32
getgid getgid32 getgroups getgroups32 getitimer getpeername getpgid getpgrp getpid getppid getpriority
getrandom getresgid getresgid32 getresuid getresuid32 getrlimit get_robust_list getrusage getsid
getsockname getsockopt get_thread_area gettid gettimeofday getuid getuid32 getxattr inotify_add_watch
inotify_init inotify_init1 inotify_rm_watch io_cancel ioctl io_destroy io_getevents io_pgetevents
io_pgetevents_time64 ioprio_get ioprio_set io_setup io_submit ipc kill landlock_add_rule
landlock_create_ruleset landlock_restrict_self lchown lchown32 lgetxattr link linkat listen listxattr
llistxattr _llseek lremovexattr lseek lsetxattr lstat lstat64 madvise membarrier memfd_create memfd_secret
mincore mkdir mkdirat mknod mknodat mlock mlock2 mlockall mmap mmap2 mprotect mq_getsetattr mq_notify
mq_open mq_timedreceive mq_timedreceive_time64 mq_timedsend mq_timedsend_time64 mq_unlink mremap msgctl
msgget msgrcv msgsnd msync munlock munlockall munmap name_to_handle_at nanosleep newfstatat _newselect open
openat openat2 pause pidfd_open pidfd_send_signal pipe pipe2 pkey_alloc pkey_free pkey_mprotect poll ppoll
ppoll_time64 prctl pread64 preadv preadv2 process_mrelease pselect6 pselect6_time64 pwrite64
pwritev pwritev2 read readahead readlink readlinkat readv recv recvfrom recvmmsg recvmmsg_time64 recvmsg
remap_file_pages removexattr rename renameat renameat2 restart_syscall rmdir rseq rt_sigaction
rt_sigpending rt_sigprocmask rt_sigqueueinfo rt_sigreturn rt_sigsuspend rt_sigtimedwait
rt_sigtimedwait_time64 rt_tgsigqueueinfo sched_getaffinity sched_getattr sched_getparam
sched_get_priority_max sched_get_priority_min sched_getscheduler sched_rr_get_interval
sched_rr_get_interval_time64 sched_setaffinity sched_setattr sched_setparam sched_setscheduler sched_yield
seccomp select semctl semget semop semtimedop semtimedop_time64 send sendfile sendfile64 sendmmsg sendmsg
sendto setfsgid setfsgid32 setfsuid setfsuid32 setgid setgid32 setgroups setgroups32 setitimer setpgid
setpriority setregid setregid32 setresgid setresgid32 setresuid setresuid32 setreuid setreuid32 setrlimit
set_robust_list setsid setsockopt set_thread_area set_tid_address setuid setuid32 setxattr shmat shmctl
shmdt shmget shutdown sigaltstack signalfd signalfd4 sigprocmask sigreturn socketcall socketpair splice
stat stat64 statfs statfs64 statx symlink symlinkat sync sync_file_range syncfs sysinfo tee tgkill time
timer_create timer_delete timer_getoverrun timer_gettime timer_gettime64 timer_settime timer_settime64
timerfd_create timerfd_gettime timerfd_gettime64 timerfd_settime timerfd_settime64 times tkill truncate
truncate64 ugetrlimit umask uname unlink unlinkat utime utimensat utimensat_time64 utimes vfork vmsplice
wait4 waitid waitpid write writev
ptrace process_vm_readv process_vm_writev chroot
arch_prctl modify_ldt arm_fadvise64_64 arm_sync_file_range sync_file_range2 breakpoint cacheflush set_tls
""".split()
# Newer than libseccomp 2.5 knows by name; one number on every arch since Linux 5.1:
# cachestat, fchmodat2, map_shadow_stack, futex_wake/wait/requeue, lsm_get_self_attr,
# lsm_list_modules, mseal, setxattrat, getxattrat, listxattrat, removexattrat.
ALLOWED_NUMBERS = (451, 452, 453, 454, 455, 456, 459, 461, 462, 463, 464, 465, 466)
FUTURE = range(468, 512)
"""Syscalls newer than this profile fail with ENOSYS (libc then falls back), not EPERM."""
PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)
"""PER_LINUX, PER_LINUX32, UNAME26 and both, and the query: as the OCI profile."""
PRLIMIT_SELF = "allow_arg prlimit64 0 eq 0"
"""prlimit64 only on the caller itself (pid 0, which getrlimit, setrlimit and ``ulimit`` use):
no command changes another process's limits (the guest agent's, pid 1, or the tests')."""
CLONE_NS_FLAGS = 0x7E020000
"""CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET: clone is allowed without them."""
AF_VSOCK = 40


def check_allow(values: Iterable[str]) -> tuple[str, ...]:
    """Rule names to opt out of, sorted and checked; ValueError names an unknown one."""
    out = set()
    for v in values:
        v = str(v).strip()
        if v != UNCONFINED and v not in RULES:
            raise ValueError(f"unknown seccomp rule {v!r}; known: {UNCONFINED}, {', '.join(sorted(RULES))}")
        out.add(v)
    return tuple(sorted(out))


SIGNALLERS = ("kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")
"""Syscalls whose first argument names the process (or thread group) that gets a signal."""
INIT_REACHERS = ("pidfd_open", "process_vm_readv", "process_vm_writev")
"""Syscalls whose first argument names a process to reach into (or to signal later, through a
pidfd): refused for pid 1 where the guest agent is pid 1 to the commands."""
F_SETOWN = 8
FIOSETOWN, SIOCSPGRP = 0x8901, 0x8902
U32 = 0xFFFFFFFF


def _not_in(name: str, arg: int, excluded: Iterable[int]) -> list[str]:
    """Allow ``name`` unless argument ``arg``, as the kernel reads it (its low 32 bits), is one
    of ``excluded`` (libseccomp has no masked "not equal"): one rule per prefix that no
    excluded value has, the shortest such (for any other value, take the excluded one it
    shares most leading bits with: flipping the first bit where they differ gives one)."""
    values = {v & U32 for v in excluded}
    rules = set()
    for v in values:
        for bit in range(32):
            mask = U32 & ~((1 << bit) - 1)
            prefix = (v & mask) ^ (1 << bit)
            if not any(w & mask == prefix for w in values):
                rules.add((mask, prefix))
    return [f"allow_arg {name} {arg} masked_eq {p:#x} {m:#x}" for m, p in sorted(rules)]  # VALUE MASK


def profile(allow: Iterable[str], arch: str, *, protect_init: bool = False) -> str:
    """The profile in the helper's language (see seccomp_gen.c) for ``arch``. ``protect_init``:
    no signal to pid 1 (kill, tkill, tgkill, rt_(tg)sigqueueinfo, a pidfd of it; fcntl F_SETOWN
    to it or its process group and the owner-setting socket ioctls, then SIGIO), no ptrace or
    process_vm_* of it: the guest agent where it is pid 1 to the commands and root may reach it
    (gvisor, which lets the sandbox's root signal it; microvm, where commands are root of the VM).
    Every profile lets prlimit64 change only the caller's own limits (:data:`PRLIMIT_SELF`)."""
    allowed = set(check_allow(allow))
    lines = [f"arch {arch}", f"default {EPERM}", f"badarch {ENOSYS}"]
    guarded = {*SIGNALLERS, *INIT_REACHERS, "ptrace", "fcntl", "ioctl"} if protect_init else set()
    lines += [f"allow {n}" for n in ALLOWED if n not in guarded]
    if protect_init:
        for name in (*SIGNALLERS, *INIT_REACHERS):
            lines += _not_in(name, 0, [1])
        lines += _not_in("ptrace", 1, [1])  # ptrace(request, pid, ...)
        # F_SETOWN to pid 1 or to its process group (-1), then SIGIO; the ioctls that set a
        # socket's owner through a pointer are refused (F_SETOWN_EX's struct can't be read)
        lines.append(f"allow_arg fcntl 1 ne {F_SETOWN}")
        lines += _not_in("fcntl", 2, [1, -1])
        lines += _not_in("ioctl", 1, [FIOSETOWN, SIOCSPGRP])
    lines.append(PRLIMIT_SELF)
    lines += [f"allow {n}" for n in ALLOWED_NUMBERS]
    lines += [f"errno {n} {ENOSYS}" for n in FUTURE]
    for name, rule in RULES.items():
        if name in allowed:
            lines += [f"allow {s}" for s in rule.syscalls]
    if "namespaces" not in allowed:
        lines += [f"allow_arg clone 0 masked_eq 0 {CLONE_NS_FLAGS:#x}", f"errno clone3 {ENOSYS}"]
    if "personality" not in allowed:
        lines += [f"allow_arg personality 0 eq {p:#x}" for p in PERSONALITIES]
    if "vsock" not in allowed:
        lines.append(f"allow_arg socket 0 ne {AF_VSOCK}")
    return "\n".join(lines) + "\n"


GEN_SOURCE = Path(__file__).parent.parent / "agent" / "seccomp_gen.c"
ARCHES = {"x86_64": "x86_64", "aarch64": "aarch64"}
_lock = threading.Lock()
_memo: dict[tuple[tuple[str, ...], str, bool], bytes] = {}


def _compile_gen(out: Path) -> None:
    cc = current_settings().cc or shutil.which("cc") or shutil.which("gcc")
    cmd = [cc or "cc", "-O2", "-o", str(out), str(GEN_SOURCE), "-lseccomp"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise HostUnsupportedError(f"building the seccomp compiler needs a C compiler: {e}") from None
    if proc.returncode != 0:
        raise HostUnsupportedError(f"building the seccomp compiler failed ({' '.join(cmd)}):\n"
                                   f"{proc.stderr[-2000:]}\nit needs libseccomp: apt-get install libseccomp-dev")


def generator() -> Path:
    """The host's seccomp compiler (built once, cached by source hash)."""
    from sandfleet.agent.build import cache_dir, install

    digest = hashlib.sha256(GEN_SOURCE.read_bytes()).hexdigest()[:16]
    binary = cache_dir() / "agent" / f"seccomp-gen-{os.uname().machine}-{digest}" / "sandfleet-seccomp-gen"
    if not binary.is_file():
        install(binary, _compile_gen)
    return binary


def filter_program(allow: Iterable[str] = (), *, protect_init: bool = False) -> bytes | None:
    """The BPF program (``struct sock_filter[]``) of the default filter less the ``allow``
    rules, for this host's arch (the guest agent's: see seccomp_gen.c); None when ``allow``
    holds ``unconfined``. Compiled once per rule set and cached on disk and in memory."""
    rules = check_allow(allow)
    if UNCONFINED in rules:
        return None
    machine = os.uname().machine
    target = ARCHES.get(machine)
    if target is None:
        raise HostUnsupportedError(f"no seccomp profile for this host's arch {machine!r}; known: "
                                   f"{', '.join(sorted(set(ARCHES.values())))}")
    key = (rules, target, protect_init)
    with _lock:
        known = _memo.get(key)
    if known is not None:
        return known
    text = profile(rules, target, protect_init=protect_init)
    gen = generator()
    digest = hashlib.sha256(gen.read_bytes() + text.encode()).hexdigest()[:20]
    from sandfleet.agent.build import cache_dir, install

    cached = cache_dir() / "seccomp" / f"{target}-{digest}.bpf"

    def compile_(out: Path) -> None:
        proc = subprocess.run([str(gen)], input=text.encode(), capture_output=True)
        if proc.returncode != 0 or not proc.stdout or len(proc.stdout) % 8:
            raise HostUnsupportedError(f"compiling the seccomp profile failed: "
                                       f"{proc.stderr.decode(errors='replace')[-1000:]}")
        out.write_bytes(proc.stdout)

    if not cached.is_file():
        install(cached, compile_, mode=0o644)
    program = cached.read_bytes()
    with _lock:
        _memo[key] = program
    return program


async def program_for(allow: Iterable[str], *, protect_init: bool = False) -> bytes | None:
    """:func:`filter_program`, off the event loop the first time a rule set is compiled."""
    rules = check_allow(allow)
    if UNCONFINED in rules:
        return None
    with _lock:
        known = _memo.get((rules, ARCHES.get(os.uname().machine, ""), protect_init))
    if known is not None:
        return known
    return await asyncio.to_thread(lambda: filter_program(rules, protect_init=protect_init))
