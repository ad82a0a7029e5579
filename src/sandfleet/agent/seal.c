/* sandfleet's seal of the verifier's tests (docs/security.md, "Reward integrity", the seal).
 *
 * Preloaded into every dynamically linked program the tests start (the test command's
 * LD_PRELOAD, and /etc/ld.so.preload where the sandbox's root may write it), its constructor
 * puts the new program in a Landlock domain of its own, nested in its parent's. Landlock lets a
 * process ptrace (and so open /proc/PID/mem, process_vm_readv/writev) and, from ABI 6, signal
 * only processes of its own domain or of domains nested in it: a program can reach what it
 * started, never the programs that started it or their other children. Code under test, which
 * runs inside a test runner the test script started, can't stop, kill, trace or rewrite the
 * memory of the test script or of a grader beside or above it, however it finds them.
 *
 * Starting in its parent's domain instead is never more reach than the parent has, so the
 * seal can skip programs at no risk to it: the process-control tools of the system's own
 * folders (kill, pkill and pgrep, its link target, killall, timeout, xargs, fuser) stay in their parent's domain, so that
 * `pkill server` in a test script still reaches the server the script started.
 *
 * The domain handles one access right nobody uses (making block devices) and nothing else of
 * the filesystem. Landlock needs no_new_privs or CAP_SYS_ADMIN: no_new_privs is set only
 * when restricting without it is refused (tests run as a non-root user). Freestanding: no libc,
 * so it loads into any image's programs (glibc or musl). */
#include <asm/unistd.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>

#define LANDLOCK_CREATE_RULESET_VERSION 1

#define PR_SET_NO_NEW_PRIVS 38
#define AT_FDCWD (-100)
#define EPERM 1
#define SCOPE_SIGNAL (1ULL << 1)
#define MAKE_BLOCK (1ULL << 11)

struct ruleset_attr { /* landlock_ruleset_attr as of ABI 6 (older headers lack its fields) */
    unsigned long long handled_access_fs, handled_access_net, scoped;
};

static long sys5(long n, long a, long b, long c, long d, long e) {
#if defined(__x86_64__)
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8) : "rcx", "r11", "memory");
    return r;
#elif defined(__aarch64__)
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    register long x4 __asm__("x4") = e;
    __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4) : "memory");
    return x0;
#else
#error "the seal knows x86_64 and aarch64"
#endif
}

static int same(const char *a, const char *b) {
    while (*a && *a == *b) a++, b++;
    return *a == *b;
}

/* a process-control tool of the system's own folders (root's: the tests can't put one there) */
static int exempt(void) {
    static const char *dirs[] = {"/usr/bin/", "/bin/", "/usr/sbin/", "/sbin/", 0};
    static const char *tools[] = {"kill", "pkill", "pgrep", "killall", "timeout", "xargs", "fuser", 0};
    char exe[256];
    long n = sys5(__NR_readlinkat, AT_FDCWD, (long)"/proc/self/exe", (long)exe, sizeof exe - 1, 0);
    if (n <= 0 || n >= (long)sizeof exe - 1) return 0;
    exe[n] = 0;
    for (int i = 0; dirs[i]; i++) {
        const char *d = dirs[i], *p = exe;
        while (*d && *d == *p) d++, p++;
        if (*d) continue;
        for (int j = 0; tools[j]; j++)
            if (same(p, tools[j])) return 1;
    }
    return 0;
}

#if defined(__x86_64__)
#define SEAL_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define SEAL_ARCH AUDIT_ARCH_AARCH64
#endif
#define OFF(field) ((unsigned)__builtin_offsetof(struct seccomp_data, field))

/* Signals only forward in pid order, where Landlock can't scope them (no Landlock, as in gVisor,
 * or one older than ABI 6, as the microvm guest's 6.1): a program may signal itself and
 * processes with a larger pid (what it started, and what started after it), a process group
 * only when led by such a process, never its own group (pid 0) or its parent's. Pids grow
 * within the tests' own pid namespace, so whatever started this program -- test.sh, a grader --
 * has a smaller pid. A pidfd can't be asked what it names: pidfd_open follows the same rule,
 * pidfd_send_signal is refused (a /proc/PID folder opened as one would pass otherwise). */
static void seal_signals(long me, int *nnp) {
    struct sock_filter f[] = {
        /*  0 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, OFF(arch)),
        /*  1 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SEAL_ARCH, 1, 0),
        /*  2 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | 38 /* ENOSYS */),
        /*  3 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, OFF(nr)),
        /*  4 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_pidfd_send_signal, 14, 0),
        /*  5 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_kill, 6, 0),
        /*  6 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_tkill, 5, 0),
        /*  7 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_tgkill, 4, 0),
        /*  8 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_rt_sigqueueinfo, 3, 0),
        /*  9 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_rt_tgsigqueueinfo, 2, 0),
        /* 10 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_pidfd_open, 1, 0),
        /* 11 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        /* 12 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, OFF(args[0])), /* the pid, its low 32 bits */
        /* 13 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 5, 0),             /* the caller's group */
        /* 14 */ BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x80000000u, 0, 2),   /* a group: -pgid */
        /* 15 */ BPF_STMT(BPF_ALU | BPF_NEG, 0),
        /* 16 */ BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, (unsigned)me, 1, 2),
        /* 17 */ BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, (unsigned)me, 0, 1),
        /* 18 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        /* 19 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
    };
    struct sock_fprog prog = {(unsigned short)(sizeof f / sizeof *f), f};
    if (sys5(__NR_seccomp, SECCOMP_SET_MODE_FILTER, 0, (long)&prog, 0, 0) == 0) return;
    if (!*nnp && sys5(__NR_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0) { /* a non-root user */
        *nnp = 1;
        sys5(__NR_seccomp, SECCOMP_SET_MODE_FILTER, 0, (long)&prog, 0, 0);
    }
}

__attribute__((constructor)) static void sandfleet_seal(void) {
    if (exempt()) return;
    int nnp = 0;
    long abi = sys5(__NR_landlock_create_ruleset, 0, 0, LANDLOCK_CREATE_RULESET_VERSION, 0, 0);
    if (abi < 6) seal_signals(sys5(__NR_getpid, 0, 0, 0, 0, 0), &nnp);
    if (abi < 1) return;
    volatile struct ruleset_attr attr;
    attr.handled_access_fs = MAKE_BLOCK;
    attr.handled_access_net = 0;
    attr.scoped = abi >= 6 ? SCOPE_SIGNAL : 0;
    long size = abi >= 6 ? 24 : abi >= 4 ? 16 : 8;
    long fd = sys5(__NR_landlock_create_ruleset, (long)&attr, size, 0, 0, 0);
    if (fd < 0) return;
    long rc = sys5(__NR_landlock_restrict_self, fd, 0, 0, 0, 0);
    if (rc == -EPERM && !nnp && sys5(__NR_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0)
        sys5(__NR_landlock_restrict_self, fd, 0, 0, 0, 0); /* a non-root user: no_new_privs first */
    sys5(__NR_close, fd, 0, 0, 0, 0);
}
