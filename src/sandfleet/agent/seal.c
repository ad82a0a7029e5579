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

__attribute__((constructor)) static void sandfleet_seal(void) {
    long abi = sys5(__NR_landlock_create_ruleset, 0, 0, LANDLOCK_CREATE_RULESET_VERSION, 0, 0);
    if (abi < 1 || exempt()) return;
    volatile struct ruleset_attr attr;
    attr.handled_access_fs = MAKE_BLOCK;
    attr.handled_access_net = 0;
    attr.scoped = abi >= 6 ? SCOPE_SIGNAL : 0;
    long size = abi >= 6 ? 24 : abi >= 4 ? 16 : 8;
    long fd = sys5(__NR_landlock_create_ruleset, (long)&attr, size, 0, 0, 0);
    if (fd < 0) return;
    long rc = sys5(__NR_landlock_restrict_self, fd, 0, 0, 0, 0);
    if (rc == -EPERM && sys5(__NR_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0)
        sys5(__NR_landlock_restrict_self, fd, 0, 0, 0, 0); /* a non-root user: no_new_privs first */
    sys5(__NR_close, fd, 0, 0, 0, 0);
}
