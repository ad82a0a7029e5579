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
/* the filesystem's write rights (Landlock ABI 1; REFER from 2, TRUNCATE from 3) */
#define FS_WRITE_FILE (1ULL << 1)
#define FS_WRITES ((1ULL << 1) | (1ULL << 4) | (1ULL << 5) | (1ULL << 6) | (1ULL << 7) | (1ULL << 8) | \
                   (1ULL << 9) | (1ULL << 10) | (1ULL << 12))
#define FS_REFER (1ULL << 13)
#define FS_TRUNCATE (1ULL << 14)
#define RULE_PATH_BENEATH 1
#define O_RDONLY_DIR 0x10000 /* O_DIRECTORY */
#define O_PATH_NOFOLLOW (010000000 | 0400000 | 02000000) /* O_PATH | O_NOFOLLOW | O_CLOEXEC */
#define DT_DIR 4
#define DT_REG_ 8
#define DT_LNK 10

struct path_beneath {
    unsigned long long allowed_access;
    int parent_fd;
} __attribute__((packed));

/* The tests' folders, the reward folders and the workdir, written into this copy of the library
 * by the verifier before it installs it (agent/seal.py, with_paths): "t:/tests\nr:/logs/verifier\nw:/app\n".
 * Not from the environment: a grader that starts the code under test with an environment of
 * its own choosing must not free it. Empty: no folder is kept from anyone. "u:1001": the tests'
 * user, which the code under test becomes where there is no Landlock and the tests are root.
 * "f:/logs/verifier/reward.txt": a reward file (drop_reward_fds). */
static volatile const char seal_paths[512] = "@@SANDFLEET_SEAL_PATHS@@";

struct dirent64 {
    unsigned long long d_ino;
    long long d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

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

/* /proc/self/exe, read once per program (each check of the constructor asks it); 0 when unreadable */
static char self_exe_buf[512];
static int self_exe_state; /* 0 unread, 1 read, -1 unreadable */
static const char *self_exe(void) {
    if (!self_exe_state) {
        long n = sys5(__NR_readlinkat, AT_FDCWD, (long)"/proc/self/exe", (long)self_exe_buf,
                      sizeof self_exe_buf - 1, 0);
        self_exe_state = n > 0 && n < (long)sizeof self_exe_buf - 1 ? 1 : -1;
        if (self_exe_state > 0) self_exe_buf[n] = 0;
    }
    return self_exe_state > 0 ? self_exe_buf : 0;
}

static int agent_changed(const char *file);
static int agent_touched(const char *file);

/* a process-control tool of the system's own folders (root's: the tests can't put one there; one a
 * root agent changed is judged as any program: agent_changed) */
static int exempt(void) {
    static const char *dirs[] = {"/usr/bin/", "/bin/", "/usr/sbin/", "/sbin/", 0};
    static const char *tools[] = {"kill", "pkill", "pgrep", "killall", "timeout", "xargs", "fuser", 0};
    const char *exe = self_exe();
    if (!exe || agent_changed(exe)) return 0;
    for (int i = 0; dirs[i]; i++) {
        const char *d = dirs[i], *p = exe;
        while (*d && *d == *p) d++, p++;
        if (*d) continue;
        for (int j = 0; tools[j]; j++)
            if (same(p, tools[j])) return 1;
    }
    return 0;
}

/* the next "K:PATH" line of seal_paths from *pos: PATH into out, K returned; 0 at the end */
static char next_entry(int *pos, char *out, int size) {
    while (*pos < (int)sizeof seal_paths && seal_paths[*pos]) {
        int start = *pos, n = 0;
        while (*pos < (int)sizeof seal_paths && seal_paths[*pos] && seal_paths[*pos] != '\n') (*pos)++;
        int len = *pos - start;
        if (*pos < (int)sizeof seal_paths && seal_paths[*pos] == '\n') (*pos)++;
        if (len < 3 || seal_paths[start + 1] != ':' || len - 2 >= size) continue;
        for (int i = start + 2; i < start + len; i++) out[n++] = seal_paths[i];
        out[n] = 0;
        return seal_paths[start];
    }
    return 0;
}

/* the next "KIND:" path of seal_paths from *pos into out; 0 at the end */
static int next_path(int *pos, char kind, char *out, int size) {
    for (char k; (k = next_entry(pos, out, size));)
        if (k == kind) return 1;
    return 0;
}

/* UV in decimal at OUT (no NUL): its length */
static int put_uint(char *out, unsigned long v) {
    char d[24];
    int j = 0, n = 0;
    do d[j++] = (char)('0' + v % 10); while ((v /= 10) && j < 20);
    while (j) out[n++] = d[--j];
    return n;
}

/* What descriptor FD names (its /proc/self/fd link) in OUT, NUL-terminated: the length, or <= 0 */
static long fd_target(long fd, char *out, long size) {
    char link[40] = "/proc/self/fd/";
    link[14 + put_uint(link + 14, (unsigned long)fd)] = 0;
    long n = sys5(__NR_readlinkat, AT_FDCWD, (long)link, (long)out, size - 1, 0);
    out[n > 0 ? n : 0] = 0;
    return n;
}


/* s is dir or inside it */
static int under(const char *s, const char *dir) {
    while (*dir && *dir == *s) dir++, s++;
    return !*dir && (!*s || *s == '/');
}

static char buf[65536];
static char env[32768]; /* /proc/self/environ, read by who needs it */

/* PATH's contents into OUT (SIZE, a NUL after them): their length, -1 when it can't be opened */
static long read_whole(const char *path, char *out, long size) {
    long fd = sys5(__NR_openat, AT_FDCWD, (long)path, 02000000, 0, 0);
    if (fd < 0) return -1;
    long k = 0, r;
    while (k < size - 1 && (r = sys5(__NR_read, fd, (long)(out + k), size - 1 - k, 0, 0)) > 0) k += r;
    sys5(__NR_close, fd, 0, 0, 0, 0);
    out[k] = 0;
    return k;
}

/* ARG names a path in a tests' folder: itself, or after an option's '=' (--rootdir=/tests) */
static int names_tests(const char *arg) {
    char t[256];
    for (int pos = 0; next_path(&pos, 't', t, sizeof t);) {
        if (under(arg, t)) return 1;
        if (arg[0] == '-')
            for (const char *e = arg; *e; e++)
                if (*e == '=') { if (under(e + 1, t)) return 1; break; }
    }
    return 0;
}

/* Is this program one of the tests' own? Its arguments (or argv[0]) name a path in a tests'
 * folder, or it runs from one: a test runner, a grader, the test script. */
static long cmdline_len;
static int module_in_workdir(const char *mod);
static int under_kind(const char *s, char kind);

static int program_in_workdir(long k, const char *cwd);
static int given_a_program(long k, const char *cwd);
static int one_liner_from_workdir(long k);

static int grader(void) {
    char t[256], cwd[4096];
    int cwd_tests = 0;
    long n = sys5(__NR_readlinkat, AT_FDCWD, (long)"/proc/self/cwd", (long)cwd, sizeof cwd - 1, 0);
    cwd[n > 0 ? n : 0] = 0;
    for (int pos = 0; n > 0 && next_path(&pos, 't', t, sizeof t);)
        if (under(cwd, t)) cwd_tests = 1;
    long k = read_whole("/proc/self/cmdline", buf, sizeof buf);
    if (k < 0) return cwd_tests;
    cmdline_len = k;
    if (program_in_workdir(k, cwd)) return 0;
    /* a program that runs another in its own process (valgrind, ld.so) given one of the workdir's or
       /tmp's, or an interpreter whose one-liner is the text of a workdir file (round XXI): not a grader,
       whatever tests' path it names too */
    if (given_a_program(k, cwd) || one_liner_from_workdir(k)) return 0;
    for (long i = 0; i < k; i += 1) {
        if (names_tests(buf + i)) return 1;
        while (i < k && buf[i]) i++;
    }
    if (!cwd_tests) return 0;
    /* run from a tests' folder: the tests' own, unless it names a program of the workdir
       (python3 /app/server.py) or runs a module its search path finds there (cd /tests &&
       PYTHONPATH=/app python3 -m server) */
    for (long i = 0; i < k; i += 1) {
        const char *arg = buf + i;
        while (i < k && buf[i]) i++;
        if (arg[0] == '/' && under_kind(arg, 'w')) return 0;
        if (arg[0] == '-' && arg[1] == 'm' && (arg[2] ? module_in_workdir(arg + 2)
                                                      : i + 1 < k && module_in_workdir(buf + i + 1)))
            return 0;
    }
    return 1;
}

/* what follows the last '/' of s */
static const char *base_name(const char *s) {
    const char *b = s;
    for (const char *p = s; *p; p++) if (*p == '/') b = p + 1;
    return b;
}

/* basename of s starts with one of the names (python3.11, bash, node ...) */
static int named(const char *s, const char *const *names) {
    const char *b = base_name(s);
    for (int i = 0; names[i]; i++) {
        const char *n = names[i], *q = b;
        while (*n && *n == *q) n++, q++;
        if (!*n && (!*q || *q == '.' || (*q >= '0' && *q <= '9'))) return 1;
    }
    return 0;
}

static int under_kind(const char *s, char kind) {
    char w[256];
    for (int pos = 0; next_path(&pos, kind, w, sizeof w);)
        if (under(s, w)) return 1;
    return 0;
}

/* Interpreters run what they are given; build and package tools run the recipes of the folder
 * they are pointed at (make, npm, cargo, go). */
static const char *const interpreters[] = {"python", "pypy", "bash", "sh", "dash", "zsh", "ksh", "mksh", "ash",
                                           "node", "nodejs", "perl", "ruby", "php", "lua", "Rscript", "java",
                                           "deno", "bun", "tclsh", "wish", "expect", "julia", "awk", "gawk",
                                           "mawk", "nawk", "sed", "gdb", 0};
static const char *const build_tools[] = {"make", "gmake", "npm", "npx", "yarn", "pnpm", "cargo", "go", "gradle",
                                          "mvn", "ant", "cmake", "ctest", "ninja", "dotnet", "uv", "pip", 0};
/* The system's programs known to run no code but their own (round XX): what their input can make them
 * do is read, print, compare, copy, compress or fetch -- never start a program or write a
 * file their input names. Every other program of the system's folders is judged like an interpreter
 * (below): given a file or its input from the workdir, it is the code under test. Until round XX
 * the default was the other way round (a program that is not a named interpreter or build tool runs
 * no code), and sqlite3's dot commands (.shell, .system), valgrind's client, dc's ! and m4's esyscmd
 * ran the workdir's code unsealed. A program missing here is only kept from the reward folders and the
 * tests' own, never stopped: a list of the harmless, not of the harmful. */
static const char *const plain_tools[] = {
    /* coreutils */
    "cat", "tac", "tee", "cp", "mv", "rm", "ln", "link", "unlink", "mkdir", "rmdir", "touch", "chmod", "chown",
    "chgrp", "ls", "dir", "vdir", "stat", "head", "tail", "wc", "sort", "uniq", "cut", "tr", "paste", "join",
    "comm", "echo", "printf", "test", "[", "true", "false", "yes", "seq", "date", "sleep", "basename", "dirname",
    "realpath", "readlink", "pwd", "env", "printenv", "nice", "nohup", "stdbuf", "expr", "id", "whoami",
    "hostname", "uname", "nl", "od", "fold", "fmt", "pr", "split", "csplit", "shuf", "base64", "base32",
    "basenc", "md5sum", "sha1sum", "sha224sum", "sha256sum", "sha384sum", "sha512sum", "b2sum", "cksum", "sum",
    "truncate", "mktemp", "install", "du", "df", "dd", "sync", "numfmt", "factor", "tsort", "expand",
    "unexpand", "mkfifo", "shred", "nproc", "arch", "tty", "users", "who", "groups", "logname", "chroot",
    /* findutils, grep, diffutils, the compressors and zip (not tar, unzip, cpio: they write what the
       archive names) */
    "find", "locate", "grep", "egrep", "fgrep", "diff", "cmp", "diff3", "gzip", "gunzip", "zcat", "bzip2",
    "bunzip2", "bzcat", "xz", "unxz", "xzcat", "lzma", "zstd", "unzstd", "zstdcat", "lz4", "zip",
    /* text and files */
    "jq", "column", "rev", "iconv", "look", "hexdump", "xxd", "strings", "file", "tree", "bc",
    /* the network, processes (the starters' targets are judged at their own exec) */
    "curl", "wget", "ps", "free", "uptime", "pidof", "watch", "flock", "setsid", "taskset", "ionice", "time",
    "getent", "tput", "clear", "stty", "sudo", "su", "runuser", "setpriv",
    /* git (its own programs; what it starts is judged by run_by_git). Not the compilers: Debian's are
       x86_64-linux-gnu-gcc-12 and the like, and a compiler given the workdir's sources is kept like the
       code it compiles (it writes its output where the tests ask, outside the kept folders) */
    "git", 0};

/* the image's own programs: root's folders, which the agent (not root) can't write */
static const char *const system_dirs[] = {"/usr/bin/", "/bin/", "/usr/sbin/", "/sbin/", "/usr/local/bin/",
                                          "/usr/local/sbin/", "/usr/lib/", "/usr/libexec/", "/lib/", 0};

static int prefix(const char *s, const char *p) {
    while (*p && *p == *s) p++, s++;
    return !*p;
}

static int under_system_dirs(const char *path) {
    for (int i = 0; system_dirs[i]; i++)
        if (prefix(path, system_dirs[i])) return 1;
    return 0;
}

/* a program of the image's own: in the system's folders, and not one a root agent changed there */
static int in_system_dirs(const char *path) { return under_system_dirs(path) && !agent_changed(path); }

/* The program this process runs is the workdir's, whatever its arguments name: its executable is
 * there, or it is an interpreter whose script (its first argument that is not an option) is, or
 * whose -m module the search path finds there (python3 /app/solve.py /tests/in.txt, cd /app &&
 * bash run.sh /tests/case). An argument that names a tests' path makes a test runner the tests'
 * own, never the code under test that the tests hand a path. */
static int program_in_workdir(long k, const char *cwd) {
    const char *exe = self_exe();
    if (exe && (under_kind(exe, 'w') || agent_changed(exe))) return 1;
    if (k <= 0 || !(named(exe ? exe : buf, interpreters) || named(buf, interpreters))) return 0;
    long i = 0;
    while (i < k && buf[i]) i++; /* past argv[0] */
    for (i++; i < k; i++) {
        const char *arg = buf + i;
        long len = 0;
        while (i + len < k && buf[i + len]) len++;
        if (arg[0] == '-') {
            if (arg[1] == 'c' || arg[1] == 'e' || (arg[1] == '-' && !arg[2])) return 0; /* a one-liner */
            if (arg[1] == 'm') return arg[2] ? module_in_workdir(arg + 2) : i + len + 1 < k &&
                                                                             module_in_workdir(buf + i + len + 1);
            if (len == 2 && (arg[1] == 'W' || arg[1] == 'X' || arg[1] == 'o' || arg[1] == 'O')) /* takes a value */
                for (i += len + 1; i < k && buf[i]; i++) {}
            else
                i += len;
            continue;
        }
        if (arg[0] == '/') return under_kind(arg, 'w') || agent_changed(arg);
        char full[1024];
        int m = 0;
        for (const char *q = cwd; *q && m < 500; q++) full[m++] = *q;
        full[m++] = '/';
        for (const char *q = arg; *q && m < 1000; q++) full[m++] = *q;
        full[m] = 0;
        return cwd[0] == '/' && (under_kind(full, 'w') || agent_changed(full));
    }
    return 0;
}

/* S mentions a path of kind KIND anywhere (a one-liner's code: "import sys; sys.path.insert(0, '/app')") */
static int mentions_kind(const char *s, char kind) {
    char w[256];
    for (int pos = 0; next_path(&pos, kind, w, sizeof w);)
        for (const char *p = s; *p; p++) {
            const char *a = p, *b = w;
            while (*b && *a == *b) a++, b++;
            char c = *a;
            if (!*b && !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                         c == '-' || c == '.'))
                return 1;
        }
    return 0;
}

/* An interpreter's search path from the environment names the workdir (PYTHONPATH=/app) */
static int env_reaches_workdir(void) {
    static const char *const vars[] = {"PYTHONPATH=", "PYTHONSTARTUP=", "NODE_PATH=", "NODE_OPTIONS=", "PERL5LIB=",
                                       "PERLLIB=", "PERL5OPT=", "RUBYLIB=", "RUBYOPT=", "CLASSPATH=", "BASH_ENV=",
                                       "ENV=", "LD_LIBRARY_PATH=", 0};
    long k = read_whole("/proc/self/environ", env, sizeof env);
    for (long i = 0; i < k; i++) {
        const char *e = env + i;
        for (int v = 0; vars[v]; v++)
            if (prefix(e, vars[v]) && mentions_kind(e, 'w')) return 1;
        while (i < k && env[i]) i++;
    }
    return 0;
}

static int venv_module(const char *mod, char *out, int size);

/* MOD (python -m's argument) is found in an entry of PYTHONPATH inside the workdir, or in the site-packages
 * of a venv of the workdir whose interpreter this is (`.tbench-testing/bin/python -m pytest`: as its console
 * script, bin/pytest, is the workdir's program; round XXIV) */
static int module_in_workdir(const char *mod) {
    char found[1024];
    if (venv_module(mod, found, sizeof found) && under_kind(found, 'w')) return 1;
    char top[256], path[1024];
    int tn = 0;
    while (mod[tn] && mod[tn] != '.' && tn < 200) { top[tn] = mod[tn]; tn++; }
    top[tn] = 0;
    if (!tn) return 0;
    long k = read_whole("/proc/self/environ", env, sizeof env);
    for (long i = 0; i < k; i++) {
        const char *e = env + i;
        while (i < k && env[i]) i++;
        if (!prefix(e, "PYTHONPATH=")) continue;
        for (const char *p = e + 11; *p;) {
            int n = 0;
            while (*p && *p != ':' && n < 700) path[n++] = *p++;
            if (*p == ':') p++;
            path[n] = 0;
            if (!n || !under_kind(path, 'w')) continue;
            path[n++] = '/';
            for (int j = 0; top[j]; j++) path[n++] = top[j];
            path[n] = 0;
            if (sys5(__NR_faccessat, AT_FDCWD, (long)path, 0, 0, 0) == 0) return 1; /* a package */
            path[n++] = '.'; path[n++] = 'p'; path[n++] = 'y'; path[n] = 0;
            if (sys5(__NR_faccessat, AT_FDCWD, (long)path, 0, 0, 0) == 0) return 1;
        }
    }
    return 0;
}

/* posix_spawn's way round (below): a start the exec hook must see, through sh; the second is for a
 * start the tests' Python guard named the code under test's (sandfleet_seal_next_start), which the
 * sh it runs can't know of otherwise: a -c code that ends with CODE_MARK is the code under test
 * (started_as_code, asked first). The mark only ever keeps: nothing is freed by writing it. */
#define CODE_MARK "\n# sandfleet: the code under test"
static const char trampoline[] = "exec \"$0\" \"$@\"";
static const char code_trampoline[] = "exec \"$0\" \"$@\"" CODE_MARK;

/* This program is an sh -c CODE whose CODE ends with CODE_MARK (system(), popen() and posix_spawn
 * of a start the guard named the code under test's). Reads the cmdline into buf (cmdline_len). */
static int started_as_code(void) {
    long k = read_whole("/proc/self/cmdline", buf, sizeof buf);
    cmdline_len = k > 0 ? k : 0;
    static const char mark[] = CODE_MARK;
    long m = sizeof mark - 1;
    for (long i = 0; i + 1 < k; i++) {
        long end = i;
        while (end < k && buf[end]) end++;
        if (buf[i] == '-' && buf[i + 1] == 'c' && end == i + 2 && end + 1 < k) { /* -c: the next is the code */
            long c = end + 1, ce = c;
            while (ce < k && buf[ce]) ce++;
            if (ce - c >= m) {
                int same_end = 1;
                for (long j = 0; j < m; j++) same_end &= buf[ce - m + j] == mark[j];
                if (same_end) return 1;
            }
            return 0;
        }
        i = end;
    }
    return 0;
}

/* An argument of this program that looks like an option (-x, --name=value) is the name of an entry of
 * its cwd: the tests' shell expanded a glob of a folder the agent wrote (`tar -cf out.tar *` in the
 * workdir), and the agent's file names became the program's options (tar's --checkpoint-action=exec=,
 * rsync's -e, a --reference=). Whatever runs it, whatever its other arguments name, it is then the code
 * under test (round XX): no test script names its own files like options. Call after started_as_code():
 * buf holds the cmdline (cmdline_len bytes). */
static int option_from_cwd(void) {
    long k = cmdline_len;
    unsigned long long stx[32];
    long i = 0;
    while (i < k && buf[i]) i++; /* past argv[0] */
    for (i++; i < k; i++) {
        const char *arg = buf + i;
        while (i < k && buf[i]) i++;
        if (arg[0] != '-' || !arg[1]) continue;
        if (sys5(__NR_statx, AT_FDCWD, (long)arg, 0x100 /* AT_SYMLINK_NOFOLLOW */, 0, (long)stx) == 0) return 1;
    }
    return 0;
}

/* ---- text of the agent's files (round XXI) ----
 * A tests' one-liner whose code is not the tests' text but a workdir file's: `bash -c "$(cat
 * /app/cmd.txt)"`, `python3 -c "$(< /app/answer.py)"`. It names no workdir path, so by the one-liner
 * rule it was the tests' own; its text says otherwise. Looked for where it costs least first: the
 * tests' own files (a one-liner written in test.sh is there as written), then the workdir's. */
static char scan_buf[1 << 18];
static long scan_left, scan_entries; /* the walk's bounds: bytes to read, entries to visit */

static int blank(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }

static int chunk_has(const char *h, long hn, const char *n, long nn) {
    for (long i = 0; i + nn <= hn; i++)
        if (h[i] == n[0]) {
            long j = 1;
            while (j < nn && h[i + j] == n[j]) j++;
            if (j == nn) return 1;
        }
    return 0;
}

/* The open file FD holds N (NN bytes): as a part (PART: in its first MiB), or as its whole text, blanks
 * at its ends aside */
static int file_holds(long fd, const char *n, long nn, int part) {
    long have = 0, r, read_here = 0;
    if (!part) {
        while (have < (long)sizeof scan_buf && (r = sys5(__NR_read, fd, (long)(scan_buf + have),
                                                         sizeof scan_buf - have, 0, 0)) > 0)
            have += r;
        scan_left -= have;
        long a = 0, b = have;
        while (a < b && blank(scan_buf[a])) a++;
        while (b > a && blank(scan_buf[b - 1])) b--;
        if (b - a != nn) return 0;
        for (long i = 0; i < nn; i++)
            if (scan_buf[a + i] != n[i]) return 0;
        return 1;
    }
    while (scan_left > 0 && read_here < (1L << 20)) {
        r = sys5(__NR_read, fd, (long)(scan_buf + have), sizeof scan_buf - have, 0, 0);
        if (r <= 0) return 0;
        scan_left -= r;
        read_here += r;
        have += r;
        if (chunk_has(scan_buf, have, n, nn)) return 1;
        long keep = nn - 1 < have ? nn - 1 : have; /* a match across two reads */
        for (long i = 0; i < keep; i++) scan_buf[i] = scan_buf[have - keep + i];
        have = keep;
    }
    return 0;
}

/* N's text in a regular file of the folder DIRFD (a link to a file followed, to a folder not; `.git`
 * folders skipped: compressed objects): its own files (FILES) and, SUBDIRS, everything under its
 * folders. 1 found; 0 not; -1 the walk's bounds ran out. */
static int tree_holds(long dirfd, const char *n, long nn, int part, int depth, int files, int subdirs) {
    char ents[4096] __attribute__((aligned(8))); /* this level's own */
    unsigned long long stx[32];                  /* struct statx: stx_mode u16 at 28, stx_size u64 at 40 */
    if (depth > 16) return -1;
    sys5(__NR_lseek, dirfd, 0, 0 /* SEEK_SET */, 0, 0);
    for (;;) {
        long got = sys5(__NR_getdents64, dirfd, (long)ents, sizeof ents, 0, 0);
        if (got <= 0) return 0;
        for (long off = 0; off < got;) {
            struct dirent64 *d = (struct dirent64 *)(ents + off);
            off += d->d_reclen;
            const char *nm = d->d_name;
            if (nm[0] == '.' && (!nm[1] || (nm[1] == '.' && !nm[2]) || same(nm, ".git"))) continue;
            int dir = d->d_type == DT_DIR;
            if ((dir && !subdirs) || (d->d_type == DT_REG_ && !files)) continue;
            if (--scan_entries < 0 || scan_left <= 0) return -1;
            if (!dir) {
                if (sys5(__NR_statx, dirfd, (long)nm, 0, 0x201 /* STATX_TYPE | STATX_SIZE */, (long)stx) < 0)
                    continue;
                unsigned short mode = ((unsigned short *)stx)[14];
                if ((mode & 0170000) == 0040000) {
                    dir = d->d_type != DT_LNK && subdirs; /* DT_UNKNOWN: a folder after all; a link to one: not followed */
                    if (!dir) continue;
                } else {
                    if ((mode & 0170000) != 0100000 || !files) continue;
                    if (!part && stx[5] > (unsigned long long)nn + 4096) continue; /* no whole text of N */
                    if (stx[5] < (unsigned long long)nn) continue;                 /* too short to hold it */
                    long fd = sys5(__NR_openat, dirfd, (long)nm, 04000 | 02000000 /* O_NONBLOCK|O_CLOEXEC */, 0, 0);
                    if (fd < 0) continue;
                    int r = file_holds(fd, n, nn, part);
                    sys5(__NR_close, fd, 0, 0, 0, 0);
                    if (r) return 1;
                    continue;
                }
            }
            long fd = sys5(__NR_openat, dirfd, (long)nm, O_RDONLY_DIR | 0400000 | 02000000, 0, 0); /* O_NOFOLLOW */
            if (fd < 0) continue;
            int r = tree_holds(fd, n, nn, part, depth + 1, 1, 1);
            sys5(__NR_close, fd, 0, 0, 0, 0);
            if (r) return r;
        }
    }
}

/* N's text under a KIND folder of seal_paths: the folders' own files first, then what lies deeper
 * (a test reads the agent's answer at the workdir's top, mostly). 1 found; 0 not; -1 the bounds ran
 * out among the folders' own files (BYTES read, ENTRIES visited: more than any honest workdir has
 * at its top, so the agent's flood), where the text may be behind them. Deeper, a walk that runs out
 * answers 0: a large repository is no proof of an attack, and its one-liners stay the tests'. */
static int kind_holds(char kind, const char *n, long nn, int part, long bytes, long entries) {
    char p[256];
    scan_left = bytes;
    scan_entries = entries;
    for (int deep = 0; deep < 2; deep++)
        for (int pos = 0; next_path(&pos, kind, p, sizeof p);) {
            long fd = sys5(__NR_openat, AT_FDCWD, (long)p, O_RDONLY_DIR | 02000000, 0, 0);
            if (fd < 0) continue;
            int r = tree_holds(fd, n, nn, part, 0, !deep, deep);
            sys5(__NR_close, fd, 0, 0, 0, 0);
            if (r == 1) return 1;
            if (r < 0) return deep ? 0 : -1;
        }
    return 0;
}

static const char *const busybox[] = {"busybox", 0};

/* ARG (LEN bytes) is -c, -e or a cluster of short flags ending in one (bash -ec): the next argument
 * is an interpreter's code */
static int code_flag(const char *arg, long len) {
    int cluster = arg[0] == '-' && len >= 2 && len <= 4;
    for (long j = 1; cluster && j < len; j++) cluster = arg[j] >= 'a' && arg[j] <= 'z';
    return cluster && (arg[len - 1] == 'c' || arg[len - 1] == 'e');
}

/* A program of the system's folders that may run code from what it is given (an interpreter, or
 * not one of the plain tools): argv[0]'s name for busybox */
static int judged_by_input(long k) {
    const char *exe = self_exe();
    if (!exe || !in_system_dirs(exe) || under_kind(exe, 'w')) return 0;
    const char *name = named(exe, busybox) && k > 0 ? buf : exe;
    return named(name, interpreters) || !named(name, plain_tools);
}

/* This program is an interpreter's one-liner (-c CODE, -e CODE, -ec CODE, before any script) whose
 * CODE is not in a tests' file but is a workdir file's text: the whole of one (any length), or 16
 * characters at least of one in its first MiB (an interpreter's code, never a path or an option, so
 * no blank is asked of it: `exec(bytes.fromhex(...))` has none). Where the workdir's top alone is larger than the walk's bounds (20000 entries, 64 MiB
 * read), it counts as found: the agent could hide the text behind the bound (kind_holds). Asked by
 * grader() and code_under_test(): once. The seal's own trampolines are not looked for. */
static int one_liner_state = -1;
static int one_liner_from_workdir(long k) {
    if (one_liner_state >= 0) return one_liner_state;
    one_liner_state = 0;
    if (k <= 0 || !judged_by_input(k)) return 0;
    long i = 0;
    while (i < k && buf[i]) i++; /* past argv[0] */
    for (i++; i < k && buf[i] == '-'; i++) {
        const char *arg = buf + i;
        long len = 0;
        while (i + len < k && buf[i + len]) len++;
        if (code_flag(arg, len)) {
            i += len + 1;
            if (i >= k) return 0;
            const char *code = buf + i;
            long nn = 0;
            while (i + nn < k && buf[i + nn]) nn++;
            while (nn > 0 && blank(*code)) code++, nn--;
            while (nn > 0 && blank(code[nn - 1])) nn--;
            if (nn <= 0 || same(code, trampoline) || same(code, code_trampoline)) return 0; /* the seal's own */
            int part = nn >= 16; /* code, never a path or an option: no blank asked of it (shlex-argv-nospace) */
            if (kind_holds('t', code, nn, part, 16L << 20, 4000) == 1) return 0; /* the tests' own text */
            one_liner_state = kind_holds('w', code, nn, part, 64L << 20, 20000) != 0;
            return one_liner_state;
        }
        i += len;
    }
    return 0;
}

/* A program that runs another in its own process -- valgrind's tool, ld.so run by hand, an emulator:
 * the client never execs, so the seal's constructor meets it only under the host's rules (valgrind
 * 3.19 does not know Landlock's system calls, and the constructor fails open) -- given, as an
 * argument that is not an option, an executable of the workdir's or of anywhere but the system's and
 * the tests' folders (an ELF or a #! script; not a library or an object, which a compiler is given):
 * the code under test, whatever tests' path (a suppressions file) it is given too. Interpreters are
 * judged by their script (program_in_workdir), the plain tools and the build tools by their name. */
static int given_a_program(long k, const char *cwd) {
    if (k <= 0 || !judged_by_input(k)) return 0;
    const char *exe = self_exe();
    const char *name = named(exe, busybox) ? buf : exe;
    if (named(name, interpreters) || named(name, build_tools)) return 0;
    long i = 0;
    while (i < k && buf[i]) i++;
    for (i++; i < k; i++) {
        const char *arg = buf + i;
        long len = 0;
        while (i + len < k && buf[i + len]) len++;
        i += len;
        if (arg[0] == '-' || !arg[0] || len > 500) continue;
        char full[1024];
        int m = 0;
        if (arg[0] != '/') {
            for (const char *q = cwd; *q && m < 500; q++) full[m++] = *q;
            if (!m || full[0] != '/') continue;
            full[m++] = '/';
        }
        for (const char *q = arg; *q && m < 1022; q++) full[m++] = *q;
        full[m] = 0;
        if (under_kind(full, 't') || (in_system_dirs(full) && !under_kind(full, 'w'))) continue;
        const char *b = base_name(full);
        int lib = 0;
        for (const char *q = b; *q && !lib; q++)
            lib = q[0] == '.' && ((q[1] == 's' && q[2] == 'o' && (!q[3] || q[3] == '.')) ||
                                  ((q[1] == 'o' || q[1] == 'a') && !q[2]));
        if (lib) continue;
        unsigned long long stx[32];
        if (sys5(__NR_statx, AT_FDCWD, (long)full, 0, 1 /* STATX_TYPE */, (long)stx) < 0) continue;
        if ((((unsigned short *)stx)[14] & 0170000) != 0100000) continue;
        long fd = sys5(__NR_openat, AT_FDCWD, (long)full, 04000 | 02000000, 0, 0);
        if (fd < 0) continue;
        char head[4] = {0};
        long r = sys5(__NR_read, fd, (long)head, 4, 0, 0);
        sys5(__NR_close, fd, 0, 0, 0, 0);
        if ((r == 4 && head[0] == 0x7f && head[1] == 'E' && head[2] == 'L' && head[3] == 'F') ||
            (r >= 2 && head[0] == '#' && head[1] == '!'))
            return 1;
    }
    return 0;
}

/* Is this program the code under test? The default: yes. The reward folders stay open only to
 * the tests' own programs (grader(), asked first: a program that names a tests' path or runs
 * from a tests' folder) and to the image's own tools that run no code but their own (cat, tee,
 * cp, rm, jq ...: plain_tools, a program of the system's folders known to run none; any other is
 * judged as an interpreter),
 * or an interpreter's one-liner of the tests' own (python3 -c CODE, bash -c CODE: code that names
 * no workdir path, with no search path of the environment in it; in the workdir too, where test
 * scripts cd before they write). Not a
 * list of what the code under test may look like: whatever is not known to be the tests' is it.
 * Call after grader(): buf holds the cmdline (K bytes), cwd is read again. */
static int code_under_test(long k) {
    char cwd[512];
    const char *exe = self_exe();
    if (!exe) return 1;
    if (!in_system_dirs(exe) || under_kind(exe, 'w')) return 1; /* the workdir's, /tmp's, a venv's */
    const char *name = exe;
    if (named(exe, busybox) && k > 0) name = buf; /* busybox: by argv[0] */
    if (named(name, build_tools)) return 1;
    if (!named(name, interpreters) && named(name, plain_tools)) return 0; /* a tool that runs no code but its own */
    /* an interpreter, or a program not known to run no code (sqlite3, valgrind, dc, m4 ...): judged by
       what it is given */
    long n = sys5(__NR_readlinkat, AT_FDCWD, (long)"/proc/self/cwd", (long)cwd, sizeof cwd - 1, 0);
    cwd[n > 0 ? n : 0] = 0;
    if (n <= 0 || env_reaches_workdir()) return 1;
    long i = 0;
    while (i < k && buf[i]) i++; /* past argv[0] */
    int one_liner = 0;
    for (i++; i < k; i++) {
        const char *arg = buf + i;
        long len = 0;
        while (i + len < k && buf[i + len]) len++;
        if (code_flag(arg, len)) {
            /* -c CODE, -e CODE, bash -ec CODE: the next argument is code */
            i += len + 1;
            if (i >= k || mentions_kind(buf + i, 'w') || one_liner_from_workdir(k)) return 1;
            one_liner = 1;
            break;
        }
        if (arg[0] != '-') return 1; /* a script (not a tests' one: grader() said so) */
        if (mentions_kind(arg, 'w')) return 1;                              /* -I/app, --path=/app */
        if (arg[1] == 'm' || arg[1] == 'r' || arg[1] == 'f') return 1;      /* -m MOD, -r LIB, -f FILE */
        i += len;
    }
    if (one_liner) return 0;
    /* no script and no code: what it reads from its input, a heredoc of the tests' (a pipe or a
       temporary file) or a file of the workdir (python3 - < /app/solution.py) */
    n = sys5(__NR_readlinkat, AT_FDCWD, (long)"/proc/self/fd/0", (long)cwd, sizeof cwd - 1, 0);
    if (n <= 0) return 0;
    cwd[n] = 0;
    return under_kind(cwd, 'w');
}

/* Started by git: a filter, a diff or textconv driver, an external diff, an alias, an editor -- what
 * the repository's configuration, or the tests' HOME's, names. The code under test can write both
 * while the tests run (after the verifier sanitized the repository), so a program git starts is the
 * code under test, unless it is git's own (a git program of the system's folders, or one of git's
 * shell scripts there). By the parent's name (/proc/PPID/comm: readable whatever the parent's
 * domain): a tests' program that calls itself git only gets its children restricted. */
static int run_by_git(long k) {
    char stat[512], path[40], comm[64];
    long n = read_whole("/proc/self/stat", stat, sizeof stat);
    if (n <= 0) return 0;
    long close = -1;
    for (long i = 0; i < n; i++) if (stat[i] == ')') close = i;
    if (close < 0 || close + 4 >= n) return 0;
    const char *p = stat + close + 2; /* "S PPID ..." */
    while (*p && *p != ' ') p++;
    while (*p == ' ') p++;
    long ppid = 0;
    while (*p >= '0' && *p <= '9') ppid = ppid * 10 + (*p++ - '0');
    if (ppid <= 0) return 0;
    int m = 0;
    for (const char *q = "/proc/"; *q; q++) path[m++] = *q;
    m += put_uint(path + m, (unsigned long)ppid);
    for (const char *q = "/comm"; *q; q++) path[m++] = *q;
    path[m] = 0;
    if (read_whole(path, comm, sizeof comm) <= 0) return 0;
    if (!(comm[0] == 'g' && comm[1] == 'i' && comm[2] == 't' && (comm[3] == '\n' || comm[3] == '-' || !comm[3])))
        return 0;
    const char *exe = self_exe();
    if (!exe) return 1;
    if (in_system_dirs(exe) && (prefix(exe, "/usr/lib/git-core/") || named(exe, (const char *const[]){"git", 0}) ||
                                prefix(exe, "/usr/bin/git-") || prefix(exe, "/bin/git-")))
        return 0; /* git's own programs */
    long i = 0;
    while (i < k && buf[i]) i++; /* argv[1]: one of git's shell scripts */
    if (i + 1 < k && prefix(buf + i + 1, "/usr/lib/git-core/")) return 0;
    return 1;
}

/* The next kept folder from *pos: a reward folder ("r:"), or a tests' folder ("k:", the verifier
 * asks on every backend). The tests' folders are root's and the tests a user of their own on bwrap
 * and gvisor, but on microvm (and for tests that run as root) every command is root: there only
 * this keeps the running test.sh and the graders from the code under test (round VII's
 * posix-spawn-static appended a line to /tests/test.sh). */
static int next_kept(int *pos, char *out, int size) {
    for (char k; (k = next_entry(pos, out, size));)
        if (k == 'r' || ((k == 'k' || k == 'g') && !under_kind(out, 'w'))) return 1;
    return 0;
}

/* next_kept's, and the image's code the code under test may not change where it runs as root ("x:": /usr, the
 * loader's /etc/ld.so.preload; stop 75): a root program of the workdir's that the tests ran wrote a .pth into
 * site-packages, a python3 into /usr/local/bin, and the tests' later programs -- the grader's Python -- ran it
 * as their own, changed after the preparation as it was. Kept from the code under test's writes (Landlock, the
 * Python guard's refusal inside a grader), not from the tests' own, which may install what they need. */
static int next_walled(int *pos, char *out, int size) {
    for (char k; (k = next_entry(pos, out, size));)
        if (k == 'x' || k == 'r' || ((k == 'k' || k == 'g') && !under_kind(out, 'w'))) return 1;
    return 0;
}

/* DIR/NAME is a kept folder (next_walled) or on the way to one */
static int on_kept_way(const char *dir, const char *name) {
    char p[512], r[256];
    int n = 0;
    for (const char *q = dir; *q && n < 250; q++) p[n++] = *q;
    if (n > 1) p[n++] = '/';
    for (const char *q = name; *q && n < 510; q++) p[n++] = *q;
    p[n] = 0;
    for (int pos = 0; next_walled(&pos, r, sizeof r);)
        if (under(r, p)) return 1;
    return 0;
}

/* Grant the write rights on every entry of the folder DIRFD (the path DIR) but SKIP (one path
 * component) and any other on the way to a kept folder (a rule granted beside one kept folder must
 * not cover another): the rules that keep the reward folders' chains out of a program's reach. */
static int grant_beside(long ruleset, long dirfd, const char *dir, const char *skip, unsigned long long rights) {
    static char ents[32768];
    for (;;) {
        long n = sys5(__NR_getdents64, dirfd, (long)ents, sizeof ents, 0, 0);
        if (n < 0) return -1;
        if (n == 0) return 0;
        for (long off = 0; off < n;) {
            struct dirent64 *d = (struct dirent64 *)(ents + off);
            off += d->d_reclen;
            const char *nm = d->d_name;
            if ((nm[0] == '.' && (!nm[1] || (nm[1] == '.' && !nm[2]))) || same(nm, skip) || d->d_type == DT_LNK ||
                on_kept_way(dir, nm))
                continue; /* a link leads to what another rule covers */
            long fd = sys5(__NR_openat, dirfd, (long)nm, O_PATH_NOFOLLOW, 0, 0);
            if (fd < 0) continue;
            struct path_beneath pb = {d->d_type == DT_DIR ? rights : rights & (FS_WRITE_FILE | FS_TRUNCATE), (int)fd};
            long rc = sys5(__NR_landlock_add_rule, ruleset, RULE_PATH_BENEATH, (long)&pb, 0, 0);
            if (rc < 0 && d->d_type != DT_DIR) { /* DT_UNKNOWN: a folder after all? */
                pb.allowed_access = rights;
                sys5(__NR_landlock_add_rule, ruleset, RULE_PATH_BENEATH, (long)&pb, 0, 0);
            }
            sys5(__NR_close, fd, 0, 0, 0, 0);
        }
    }
}

/* Everything writable as before but each reward folder (and the folders on its way, whose
 * entries other than the way are granted). 0 when the rules are in place. */
static int keep_rewards(long ruleset, unsigned long long rights) {
    char r[256];
    int any = 0;
    for (int pos = 0; next_walled(&pos, r, sizeof r);) {
        if (r[0] != '/' || !r[1]) return -1;
        any = 1;
        /* walk r's components: at each folder, grant all entries but the next component */
        char dir[256];
        int dn = 1;
        dir[0] = '/';
        dir[1] = 0;
        const char *p = r + 1;
        while (*p) {
            char comp[256];
            int cn = 0;
            while (*p && *p != '/' && cn < 255) comp[cn++] = *p++;
            comp[cn] = 0;
            while (*p == '/') p++;
            long dfd = sys5(__NR_openat, AT_FDCWD, (long)dir, O_RDONLY_DIR | 02000000, 0, 0);
            if (dfd < 0) return -1;
            int rc = grant_beside(ruleset, dfd, dir, comp, rights);
            sys5(__NR_close, dfd, 0, 0, 0, 0);
            if (rc < 0) return -1;
            if (dn > 1) dir[dn++] = '/';
            for (int i = 0; comp[i] && dn < 254; i++) dir[dn++] = comp[i];
            dir[dn] = 0;
        }
    }
    return any ? 0 : -1;
}

/* ---- exec: a program of the workdir that the library won't load into (static) ----
 * The tests' dynamically linked programs call exec through these (bash, Python's subprocess,
 * timeout, xargs, env): a program about to exec one of the workdir's executables takes the
 * reward rules first, so that a static one (which the constructor never runs in) has them too. */
/* weak: a dynamically linked program without a libc still loads the library */
extern int *__errno_location(void) __attribute__((weak));
extern char **environ __attribute__((weak));
static int dummy_errno;
static int *errno_at(void) { return __errno_location ? __errno_location() : &dummy_errno; }
static char **env_now(void) { return &environ ? environ : 0; }

static int restrict_rewards(int abi);

/* ---- without Landlock (gVisor): the code under test as a user of its own ----
 * Where the kernel has no Landlock and the verifier runs the tests as root with "u:UID" in
 * seal_paths (rollout/verifier.py: a backend whose commands run as the user they ask for), the
 * reward folders are root's and no other user may write them; a program that is the code under
 * test takes the tests' user (UID, its group UID, no supplementary groups) before it runs, and so
 * does everything it starts, whatever it execs (a uid is the kernel's, not this library's). Root
 * may give up its uid; a user can't take it back. It also can't signal, trace or read the memory
 * of the tests' programs (root's). A program that should drop and can't is not run. */
static long demote_uid(void) {
    char u[32];
    int pos = 0;
    if (!next_path(&pos, 'u', u, sizeof u)) return -1;
    long v = 0;
    for (int i = 0; u[i]; i++) {
        if (u[i] < '0' || u[i] > '9' || v > 100000000) return -1;
        v = v * 10 + (u[i] - '0');
    }
    return v > 0 && u[0] ? v : -1;
}

/* an "s:" line: the split beside Landlock too (SANDFLEET_SEAL_SPLIT=1) */
static int split_beside(void) {
    char s[8];
    int pos = 0;
    return next_path(&pos, 's', s, sizeof s);
}

/* 1 when the seal drops the code under test to a user here (no Landlock or an "s:" line, root, a
 * "u:" line). Beside Landlock the program enters its domain first, then becomes the user; where
 * the domain fails it still becomes the user (not root code with no rule). */
static int demotes(long abi) {
    return (abi < 1 || split_beside()) && demote_uid() > 0 && sys5(__NR_geteuid, 0, 0, 0, 0, 0) == 0;
}

/* What the root tests made in a shared temporary folder and hand the code under test -- its cwd, a
 * path its arguments or environment name (/tmp/tmpXXXX/proj, /tmp/tmpXXXX/app.db) -- is the code's
 * user's before it drops to that user, as on bwrap, where the tests and the code are one user (a
 * project copied in for `make`, an SQLite file the tests made: 3 of the 28 bundled tasks). Given:
 * the top folder under /tmp, /var/tmp or /dev/shm that the path is in, walked without following a
 * link, or a file right in one (a compiler's temporary); changed: only root's folders and root's
 * files with one link (a hard link the code planted to a root file elsewhere stays root's), never a
 * kept folder, at most 20000 entries. */
static const char *const shared_tmp[] = {"/tmp/", "/var/tmp/", "/dev/shm/", 0};
static int handed;

static void hand_tree(long dirfd, long uid, int depth) {
    char ents[4096] __attribute__((aligned(8))); /* this level's own: the walk below reads the next */
    unsigned long long stx[32];
    if (depth > 12) return;
    for (;;) {
        long n = sys5(__NR_getdents64, dirfd, (long)ents, sizeof ents, 0, 0);
        if (n <= 0) return;
        for (long off = 0; off < n && handed < 20000;) {
            struct dirent64 *d = (struct dirent64 *)(ents + off);
            off += d->d_reclen;
            const char *nm = d->d_name;
            if (nm[0] == '.' && (!nm[1] || (nm[1] == '.' && !nm[2]))) continue;
            if (d->d_type != DT_REG_ && d->d_type != DT_DIR && d->d_type != 0 /* DT_UNKNOWN */) continue;
            /* by a descriptor of the entry itself (opened without following a link; read-only and
               without blocking): what is looked at is what is changed, whatever the code under test
               swaps in under its name meanwhile (gVisor has no fchown of an O_PATH descriptor) */
            long fd = sys5(__NR_openat, dirfd, (long)nm, 0400000 /* O_NOFOLLOW */ | 04000 /* O_NONBLOCK */ |
                           02000000 /* O_CLOEXEC */ | 0400 /* O_NOCTTY */, 0, 0);
            if (fd < 0) continue;
            /* stx_nlink: u32 at byte 16, stx_uid at 20, stx_mode u16 at 28 */
            if (sys5(__NR_statx, fd, (long)"", 0x1000 /* AT_EMPTY_PATH */, 0x7ff, (long)stx) == 0) {
                unsigned nlink = ((unsigned *)stx)[4], owner = ((unsigned *)stx)[5];
                unsigned short mode = ((unsigned short *)stx)[14];
                int dir = (mode & 0170000) == 0040000, reg = (mode & 0170000) == 0100000;
                if (owner == 0 && (dir || (reg && nlink == 1))) {
                    handed++;
                    sys5(__NR_fchown, fd, uid, uid, 0, 0);
                    if (dir) hand_tree(fd, uid, depth + 1);
                }
            }
            sys5(__NR_close, fd, 0, 0, 0, 0);
        }
        if (handed >= 20000) return;
    }
}

static void hand_path(const char *p, long uid) {
    char top[512];
    for (int i = 0; p && shared_tmp[i]; i++) {
        if (!prefix(p, shared_tmp[i])) continue;
        int n = 0;
        for (const char *q = shared_tmp[i]; *q; q++) top[n++] = *q;
        const char *rest = p + n;
        while (*rest && *rest != '/' && n < (int)sizeof top - 1) top[n++] = *rest++;
        top[n] = 0;
        if (n == (int)(rest - p) && top[n - 1] == '/') return; /* the shared folder itself */
        char r[256];
        for (int pos = 0; next_kept(&pos, r, sizeof r);)
            if (under(top, r) || under(r, top)) return;
        unsigned long long stx[32];
        if (sys5(__NR_statx, AT_FDCWD, (long)top, 0x100, 0x7ff, (long)stx) < 0) return;
        unsigned owner = ((unsigned *)stx)[5];
        unsigned short mode = ((unsigned short *)stx)[14];
        if ((mode & 0170000) == 0100000 && owner == 0 && ((unsigned *)stx)[4] == 1) {
            /* a root file right in the shared folder, one link: a tests' compiler's temporary (gcc's
               driver makes /tmp/ccXXXX.o 0600 and hands it to as, which the seal judges the code under
               test: on gVisor the tests' own C harness did not build) */
            sys5(__NR_fchownat, AT_FDCWD, (long)top, uid, uid, 0x100 /* AT_SYMLINK_NOFOLLOW */);
            return;
        }
        if ((mode & 0170000) != 0040000 || (owner != 0 && owner != (unsigned)uid)) return;
        long fd = sys5(__NR_openat, AT_FDCWD, (long)top, O_RDONLY_DIR | 0400000 | 02000000, 0, 0);
        if (fd < 0) return;
        if (owner == 0) sys5(__NR_fchown, fd, uid, uid, 0, 0);
        hand_tree(fd, uid, 0);
        sys5(__NR_close, fd, 0, 0, 0, 0);
        return;
    }
}

/* the cwd, and the arguments and environment values that are paths (argv/envp, or this program's
   own from /proc when both are 0) */
static void hand_over(char *const argv[], char *const envp[]) {
    long uid = demote_uid();
    char cwd[512];
    long n = sys5(__NR_readlinkat, AT_FDCWD, (long)"/proc/self/cwd", (long)cwd, sizeof cwd - 1, 0);
    cwd[n > 0 ? n : 0] = 0;
    if (uid <= 0) return;
    if (n > 0) hand_path(cwd, uid);
    if (argv || envp) {
        for (int i = 0; argv && argv[i]; i++) hand_path(argv[i], uid);
        for (int i = 0; envp && envp[i]; i++) {
            const char *v = envp[i];
            while (*v && *v != '=') v++;
            if (*v) hand_path(v + 1, uid);
        }
        return;
    }
    for (int pass = 0; pass < 2; pass++) {
        long k = read_whole(pass ? "/proc/self/environ" : "/proc/self/cmdline", buf, sizeof buf);
        for (long i = 0; i < k; i++) {
            const char *a = buf + i;
            while (i < k && buf[i]) i++;
            if (pass) {
                while (*a && *a != '=') a++;
                if (*a) a++;
            }
            hand_path(a, uid);
        }
    }
}

static void drop_reward_fds(void);

static void demote(void) {
    long uid = demote_uid();
    drop_reward_fds();
    if (sys5(__NR_setgroups, 0, 0, 0, 0, 0) < 0 || sys5(__NR_setresgid, uid, uid, uid, 0, 0) < 0 ||
        sys5(__NR_setresuid, uid, uid, uid, 0, 0) < 0) {
        static const char m[] = "sandfleet seal: could not run the code under test as the tests' user; not run\n";
        sys5(__NR_write, 2, (long)m, sizeof m - 1, 0, 0);
        sys5(__NR_exit_group, 126, 0, 0, 0, 0);
    }
    sys5(__NR_prctl, 4 /* PR_SET_DUMPABLE */, 1, 0, 0, 0);
}

/* The code under test's own HOME ("h:"), in its environment in place of the tests' HOME: what the
 * tests' own tools read from there (git's and curl's configuration) is kept from it (the tests'
 * HOME is a kept folder, or root's), and it writes its caches and configuration in a HOME of its
 * own. */
static char home_env[300];
static int code_home(void) {
    char h[256];
    int pos = 0, n = 0;
    if (!next_path(&pos, 'h', h, sizeof h)) return 0;
    for (const char *q = "HOME="; *q; q++) home_env[n++] = *q;
    for (int i = 0; h[i] && n < (int)sizeof home_env - 1; i++) home_env[n++] = h[i];
    home_env[n] = 0;
    return 1;
}

/* the process's own environment, before its program reads it (a constructor) */
static void give_home(char **envp) {
    if (!envp || !code_home()) return;
    for (int i = 0; envp[i]; i++)
        if (prefix(envp[i], "HOME=")) envp[i] = home_env;
}

/* a copy of ENVP with the code under test's HOME (the caller's array is left alone: in a vfork
 * child it is the parent's) */
static char *envcopy[4096];
static char *const *with_code_home(char *const envp[]) {
    if (!envp || !code_home()) return envp;
    int i = 0;
    for (; envp[i] && i < 4095; i++) envcopy[i] = prefix(envp[i], "HOME=") ? home_env : envp[i];
    if (envp[i]) return envp; /* more than fit: as it was */
    envcopy[i] = 0;
    return envcopy;
}

/* The tests' Python guard's word on the next program this process starts: 1 when the Python stack
 * that starts it holds code of the workdir's (or runs inside an unpickling), in a tests' program
 * that loaded such code (sandfleet_seal_next_start). Set before every start Python makes. */
static int start_is_code;
static int program_code; /* the constructor judged this program the code under test */

/* ---- native code of the agent's inside a tests' program (round XXI) ----
 * A tests' program that loads a library the agent built (ctypes.CDLL('/tmp/libsol.so') in a grader, a
 * test harness linked against /app/libsol.so) runs that library's constructor and functions as its
 * own: a start or a write they make through libc was the tests'. The caller of the function asked
 * (its return address) says whose code asks: one in a library mapped from the workdir, a shared
 * temporary folder or a memfd -- not the program itself, not this library -- is the code under test.
 * Native code that calls the kernel itself is not seen here (docs/security.md, "In the tests' process"). */
static char maps_buf[1 << 18];

/* A line of a /proc/PID/maps read into maps_buf: its address range, whether it maps code, and its
 * file (a path, NUL-ended in place) or 0 (anonymous, [heap], [vdso]) */
struct map_line {
    unsigned long lo, hi;
    int exec;
    const char *file;
};

/* The line at *I of maps_buf (K bytes) into M, and *I past it; 0 at the end. A line ends at its '\n' or
 * at the NUL an earlier walk wrote there, so the buffer can be walked again. */
static int next_map(long *i, long k, struct map_line *m) {
    if (*i >= k) return 0;
    long j = *i, e = j;
    while (e < k && maps_buf[e] && maps_buf[e] != '\n') e++;
    maps_buf[e] = 0; /* (read_whole left a NUL at k) */
    m->lo = m->hi = 0;
    for (; j < e && maps_buf[j] != '-'; j++)
        m->lo = m->lo * 16 + (unsigned long)(maps_buf[j] <= '9' ? maps_buf[j] - '0' : (maps_buf[j] | 32) - 'a' + 10);
    for (j++; j < e && maps_buf[j] != ' '; j++)
        m->hi = m->hi * 16 + (unsigned long)(maps_buf[j] <= '9' ? maps_buf[j] - '0' : (maps_buf[j] | 32) - 'a' + 10);
    while (j < e && maps_buf[j] == ' ') j++;
    m->exec = j + 2 < e && maps_buf[j + 2] == 'x'; /* perms: rwxp */
    for (int field = 0; field < 4 && j < e; field++) { /* perms offset dev inode: to the path */
        while (j < e && maps_buf[j] != ' ') j++;
        while (j < e && maps_buf[j] == ' ') j++;
    }
    m->file = j < e && maps_buf[j] == '/' ? maps_buf + j : 0;
    *i = e + 1;
    return 1;
}

/* FILE is one the agent could have written: the workdir's, a shared temporary folder's, a memfd */
static int agents_file(const char *file) {
    if (prefix(file, "/memfd:") || under_kind(file, 'w')) return 1;
    for (int t = 0; shared_tmp[t]; t++)
        if (prefix(file, shared_tmp[t])) return 1;
    return 0;
}

static int asked_by_code(unsigned long addr) {
    char t[256];
    int pos = 0;
    if (!addr || !next_path(&pos, 't', t, sizeof t)) return 0;
    long k = read_whole("/proc/self/maps", maps_buf, sizeof maps_buf);
    unsigned long self = (unsigned long)&asked_by_code;
    const char *caller = 0, *own = 0;
    struct map_line m;
    for (long i = 0; next_map(&i, k, &m);) {
        if (addr >= m.lo && addr < m.hi) caller = m.file;
        if (self >= m.lo && self < m.hi) own = m.file;
    }
    if (!caller) return 0;
    const char *exe = self_exe();
    if ((own && same(caller, own)) || (exe && same(caller, exe))) return 0; /* this library, the program */
    return agents_file(caller) || agent_touched(caller);
}

/* start_is_code for this start too where native code of the agent's asks for it (asked_by_code): the
 * value it had, to put back after */
static int code_asks(void *ret) {
    int was = start_is_code;
    if (!start_is_code && asked_by_code((unsigned long)ret)) start_is_code = 1;
    return was;
}
#define CODE_ASKS() int was_code_ = code_asks(__builtin_return_address(0))
#define AS_BEFORE(r) (start_is_code = was_code_, (r))

static int exec_target_is_code(const char *path, char *const argv[]) {
    char t[256], cwd[512];
    int pos = 0;
    if (!next_path(&pos, 't', t, sizeof t) || !path) return 0;
    if (start_is_code) return 1;
    if (path[0] == '/' && under_kind(path, 'w')) return 1; /* the workdir's, whatever its arguments name */
    if (argv)
        for (int i = 0; argv[i]; i++)
            if (names_tests(argv[i])) return 0;
    long n = sys5(__NR_readlinkat, AT_FDCWD, (long)"/proc/self/cwd", (long)cwd, sizeof cwd - 1, 0);
    if (n <= 0) return 1;
    cwd[n] = 0;
    if (under_kind(cwd, 't')) return 0; /* run from a tests' folder: the tests' own */
    /* a program of the system's folders decides in its own constructor (a static one runs no code
       of the workdir's); any other -- the workdir's, /tmp's, relative to a cwd -- is code under test */
    return path[0] != '/' || !in_system_dirs(path) || under_kind(path, 'w');
}

/* PATH would not start (missing, a folder, not executable: a PATH search's candidate that is
 * not there): the errno execve would answer, 0 when it can start. Asked before the exec hook keeps
 * a process, which no failed exec undoes: dash's own PATH walk tried /app/.venv/bin/tar before
 * /usr/bin/tar, and the guest's root tar that uploads the tests was kept from /tests. Nothing runs
 * when this answers an error (the exec is not made), so a file that appears after it was looked at
 * never runs unkept. */
static int cannot_exec(const char *path) {
    unsigned long long stx[32]; /* struct statx: stx_mode, a u16 at byte 28 */
    long r = sys5(__NR_statx, AT_FDCWD, (long)path, 0, 1 /* STATX_TYPE */, (long)stx);
    if (r < 0) return (int)-r;
    unsigned short mode = ((unsigned short *)stx)[14];
    if ((mode & 0170000) != 0100000) return 13; /* EACCES: not a regular file */
    r = sys5(__NR_faccessat, AT_FDCWD, (long)path, 1 /* X_OK */, 0, 0);
    return r < 0 ? (int)-r : 0;
}

static long armed_pid;
static int exec_ok;

static int seal_exec(const char *path, char *const argv[], char *const envp[]) {
    if (armed_pid && !exec_ok && sys5(__NR_getpid, 0, 0, 0, 0, 0) == armed_pid) {
        /* the tests' process that loaded the workdir's code (sandfleet_seal_arm_exit): the code
           under test can't replace it with a program whose status the tests then read */
        static const char m[] = "sandfleet: the code under test can't replace the tests' process (exec); refused\n";
        sys5(__NR_write, 2, (long)m, sizeof m - 1, 0, 0);
        *errno_at() = EPERM;
        return -1;
    }
    exec_ok = 0;
    if (exec_target_is_code(path, argv)) {
        int err = cannot_exec(path);
        if (err) {
            *errno_at() = err;
            return -1;
        }
        long abi = sys5(__NR_landlock_create_ruleset, 0, 0, LANDLOCK_CREATE_RULESET_VERSION, 0, 0);
        int kept = 0;
        if (abi >= 1) kept = restrict_rewards((int)abi) == 0;
        if (demotes(abi)) { hand_over(argv, envp); demote(); kept = 1; } /* a child about to exec: its own creds */
        if (kept) envp = with_code_home(envp);
    }
    long r = sys5(__NR_execve, (long)path, (long)argv, (long)envp, 0, 0);
    *errno_at() = (int)-r;
    return -1;
}

__attribute__((visibility("default"))) int execve(const char *path, char *const argv[], char *const envp[]) {
    CODE_ASKS();
    return AS_BEFORE(seal_exec(path, argv, envp));
}

__attribute__((visibility("default"))) int execv(const char *path, char *const argv[]) {
    CODE_ASKS();
    return AS_BEFORE(seal_exec(path, argv, env_now()));
}

/* execvp: a name without a slash is looked for on PATH (where the verifier left no workdir
 * folder); a file that is not an executable format runs with /bin/sh, as glibc's does */
static int seal_execvp(const char *file, char *const argv[]);
__attribute__((visibility("default"))) int execvp(const char *file, char *const argv[]) {
    CODE_ASKS();
    return AS_BEFORE(seal_execvp(file, argv));
}

static int seal_execvp(const char *file, char *const argv[]) {
    const char *p = file;
    int slash = 0;
    if (!file || !*file) { *errno_at() = 2; return -1; } /* ENOENT */
    for (; *p; p++) if (*p == '/') slash = 1;
    if (slash) {
        seal_exec(file, argv, env_now());
        if (*errno_at() != 8) return -1; /* ENOEXEC */
    }
    const char *path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    for (char **e = env_now(); e && *e; e++)
        if ((*e)[0] == 'P' && (*e)[1] == 'A' && (*e)[2] == 'T' && (*e)[3] == 'H' && (*e)[4] == '=') { path = *e + 5; break; }
    int eacces = 0;
    for (const char *d = slash ? "" : path;;) {
        char full[4096];
        int n = 0;
        if (!slash) {
            while (*d && *d != ':' && n < 4000) full[n++] = *d++;
            if (n == 0) full[n++] = '.';
            full[n++] = '/';
        }
        for (const char *f = file; *f && n < 4094; f++) full[n++] = *f;
        full[n] = 0;
        if (slash) *errno_at() = 8;
        else seal_exec(full, argv, env_now());
        int err = *errno_at();
        if (err == 8) { /* ENOEXEC: a script without #!, run by the shell */
            char *sh[1024];
            int k = 0;
            sh[k++] = (char *)"/bin/sh";
            sh[k++] = full;
            for (int i = 1; argv && argv[i] && k < 1023; i++) sh[k++] = argv[i];
            sh[k] = 0;
            seal_exec("/bin/sh", sh, env_now());
            return -1;
        }
        if (err == 13) eacces = 1; /* EACCES */
        else if (err != 2 && err != 20) return -1; /* not ENOENT, ENOTDIR: that's the answer */
        if (slash || !*d) break;
        d++;
    }
    *errno_at() = eacces ? 13 : 2;
    return -1;
}

/* posix_spawn and posix_spawnp: libc's own exec inside them is not the one above (CPython's
 * subprocess with close_fds=False, os.posix_spawn, Rust's Command), so a static program of the
 * workdir started so would run with its starter's reach. A target that is the code under test (or,
 * for posix_spawnp, any name without a slash, found on PATH only by the exec) is started through
 * /bin/sh -c 'exec "$0" "$@"', a dynamically linked program whose exec of it this library sees.
 * The real functions are libc's, by dlsym(RTLD_NEXT); without dlsym they answer ENOSYS. */
extern void *dlsym(void *handle, const char *name) __attribute__((weak));
typedef int (*spawn_fn)(int *, const char *, const void *, const void *, char *const[], char *const[]);
static int spawn_through(const char *name, int search, int *pid, const char *path, const void *actions,
                         const void *attr, char *const argv[], char *const envp[]) {
    spawn_fn real = dlsym ? (spawn_fn)dlsym((void *)-1L /* RTLD_NEXT */, name) : 0;
    if (!real) return 38; /* ENOSYS */
    int slash = 0;
    for (const char *p = path; p && *p; p++) if (*p == '/') slash = 1;
    char t[256];
    int pos = 0;
    if (!path || !next_path(&pos, 't', t, sizeof t) || !(exec_target_is_code(path, argv) || (search && !slash)))
        return real(pid, path, actions, attr, argv, envp);
    static char *sh[1024]; /* a vfork child may run this: a static array, not the stack's */
    int k = 0;
    sh[k++] = (char *)"sh";
    sh[k++] = (char *)"-c";
    sh[k++] = (char *)(start_is_code ? code_trampoline : trampoline);
    sh[k++] = (char *)path;
    for (int i = 1; argv && argv[0] && argv[i] && k < 1023; i++) sh[k++] = argv[i];
    sh[k] = 0;
    spawn_fn direct = search ? (spawn_fn)dlsym((void *)-1L, "posix_spawn") : real;
    return (direct ? direct : real)(pid, "/bin/sh", actions, attr, sh, envp);
}

__attribute__((visibility("default"))) int posix_spawn(int *pid, const char *path, const void *actions,
                                                       const void *attr, char *const argv[], char *const envp[]) {
    CODE_ASKS();
    return AS_BEFORE(spawn_through("posix_spawn", 0, pid, path, actions, attr, argv, envp));
}

__attribute__((visibility("default"))) int posix_spawnp(int *pid, const char *file, const void *actions,
                                                        const void *attr, char *const argv[], char *const envp[]) {
    CODE_ASKS();
    return AS_BEFORE(spawn_through("posix_spawnp", 1, pid, file, actions, attr, argv, envp));
}

/* system() and popen(): libc starts their sh with its own spawn, not the exec above. A command the
 * guard named the code under test's (os.system in an unpickling, in a grader from the workdir's code)
 * goes with CODE_MARK after it, so that its sh is kept (started_as_code). 0 when it can't be marked. */
static char marked_cmd[65536];
static const char *mark_command(const char *cmd) {
    static const char mark[] = CODE_MARK;
    long n = 0;
    while (cmd[n]) n++;
    if (n + (long)sizeof mark > (long)sizeof marked_cmd) return 0;
    for (long i = 0; i < n; i++) marked_cmd[i] = cmd[i];
    for (long i = 0; i < (long)sizeof mark; i++) marked_cmd[n + i] = mark[i]; /* with its NUL */
    return marked_cmd;
}

__attribute__((visibility("default"))) int system(const char *cmd) {
    int (*real)(const char *) = dlsym ? (int (*)(const char *))dlsym((void *)-1L, "system") : 0;
    if (!real) { *errno_at() = 38; return -1; } /* ENOSYS */
    if (!cmd || !(start_is_code || asked_by_code((unsigned long)__builtin_return_address(0)))) return real(cmd);
    const char *marked = mark_command(cmd);
    if (!marked) { *errno_at() = 7; return -1; } /* E2BIG */
    return real(marked);
}

__attribute__((visibility("default"))) void *popen(const char *cmd, const char *type) {
    void *(*real)(const char *, const char *) =
        dlsym ? (void *(*)(const char *, const char *))dlsym((void *)-1L, "popen") : 0;
    if (!real) { *errno_at() = 38; return 0; }
    if (!cmd || !(start_is_code || asked_by_code((unsigned long)__builtin_return_address(0)))) return real(cmd, type);
    const char *marked = mark_command(cmd);
    if (!marked) { *errno_at() = 7; return 0; }
    return real(marked, type);
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

/* A descriptor open for writing on a reward file ("f:", the task's reward.txt and reward.json),
 * which this process (kept from now on) inherited, writes to /dev/null from here on: the kept rule
 * (Landlock, the tests' user) is checked as a file is opened, and the tests' own open, handed down
 * (test.sh's `exec 3>reward.txt` before it runs the code under test, a grader's file open as the
 * code it imported forks), let the code under test write the reward the tests then added to
 * (round IX's inherited-reward-fd). Says so on stderr. Read-only descriptors, pipes and other
 * files (the code's output that the tests send into a reward folder) are left as they are. */
static void drop_reward_fds(void) {
    char r[256];
    int pos = 0, found = 0;
    for (char k; (k = next_entry(&pos, r, sizeof r));) found |= k == 'f';
    if (!found) return;
    long dfd = sys5(__NR_openat, AT_FDCWD, (long)"/proc/self/fd", O_RDONLY_DIR | 02000000, 0, 0);
    if (dfd < 0) return;
    int drop[64], n = 0;
    char ents[2048];
    for (long got; n < 64 && (got = sys5(__NR_getdents64, dfd, (long)ents, sizeof ents, 0, 0)) > 0;) {
        for (long off = 0; off < got && n < 64;) {
            struct dirent64 *d = (struct dirent64 *)(ents + off);
            off += d->d_reclen;
            long fd = 0;
            const char *c = d->d_name;
            if (*c < '0' || *c > '9') continue;
            for (; *c >= '0' && *c <= '9'; c++) fd = fd * 10 + (*c - '0');
            if (fd == dfd) continue;
            long fl = sys5(__NR_fcntl, fd, 3 /* F_GETFL */, 0, 0, 0);
            if (fl < 0 || (fl & 3) == 0) continue; /* O_RDONLY */
            char target[512];
            if (fd_target(fd, target, sizeof target) > 0 && target[0] == '/' && under_kind(target, 'f'))
                drop[n++] = (int)fd;
        }
    }
    sys5(__NR_close, dfd, 0, 0, 0, 0);
    for (int i = 0; i < n; i++) {
        static const char m[] = "sandfleet: a descriptor open for writing on the reward file, inherited by the code "
                                "under test, writes to /dev/null\n";
        long nul = sys5(__NR_openat, AT_FDCWD, (long)"/dev/null", 1 /* O_WRONLY */, 0, 0);
        long fdfl = sys5(__NR_fcntl, drop[i], 1 /* F_GETFD */, 0, 0, 0);
        if (nul < 0) { sys5(__NR_close, drop[i], 0, 0, 0, 0); continue; }
        sys5(__NR_dup3, nul, drop[i], fdfl > 0 && (fdfl & 1) ? 02000000 : 0, 0, 0);
        sys5(__NR_close, nul, 0, 0, 0, 0);
        sys5(__NR_write, 2, (long)m, sizeof m - 1, 0, 0);
    }
}

/* A domain of its own that keeps the reward folders from this process and what it starts. */
static int restrict_rewards(int abi) {
    drop_reward_fds();
    unsigned long long rights = FS_WRITES | (abi >= 2 ? FS_REFER : 0) | (abi >= 3 ? FS_TRUNCATE : 0);
    volatile struct ruleset_attr attr;
    attr.handled_access_fs = rights;
    attr.handled_access_net = 0;
    attr.scoped = 0;
    long fd = sys5(__NR_landlock_create_ruleset, (long)&attr, 8, 0, 0, 0);
    if (fd < 0) return -1;
    long rc = keep_rewards(fd, rights);
    if (rc == 0) {
        rc = sys5(__NR_landlock_restrict_self, fd, 0, 0, 0, 0);
        if (rc == -EPERM && sys5(__NR_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0)
            rc = sys5(__NR_landlock_restrict_self, fd, 0, 0, 0, 0);
    }
    sys5(__NR_close, fd, 0, 0, 0, 0);
    return rc == 0 ? 0 : -1;
}

/* Called by the tests' Python guard (rollout/testguard.py) when a program that started as one of
 * the tests' own one-liners loads code of the workdir (an import found there, a compile of a
 * workdir file): from then on it is code under test, unless it is a grader (which names the
 * tests: code the tests' runner imports is the runner's). 0 when the rule is in place or not
 * needed. */
__attribute__((visibility("default"))) int sandfleet_seal_rewards(void) {
    char t[256];
    int pos = 0;
    if (!next_path(&pos, 't', t, sizeof t) || grader()) return 0;
    long abi = sys5(__NR_landlock_create_ruleset, 0, 0, LANDLOCK_CREATE_RULESET_VERSION, 0, 0);
    int restricted = abi >= 1 && restrict_rewards((int)abi) == 0;
    if (demotes(abi)) return 2; /* the caller drops to sandfleet_seal_uid() in every thread */
    return restricted ? 1 : -1; /* 1: kept; the caller takes the code's HOME */
}

/* ---- writes into a kept folder by its own name only ----
 * A program of the tests may write a reward folder, the tests' HOME or a tests' folder; the code
 * under test can't (Landlock, above). What it can do is plant a link where a tests' program writes
 * later: /tmp/summary.txt -> /logs/verifier/reward.txt, and test.sh's own `> /tmp/summary.txt`
 * wrote the reward (round VII's tmp-symlink-redirect). So an open for writing that lands in a kept
 * folder must name that folder: the path as given (made absolute from the cwd or the dirfd, and its
 * "." and ".." taken by name) is in it. One that got there through a link is refused (EACCES), in
 * every program, with nothing truncated (O_TRUNC is done after the check) and nothing left made. */
#define O_ACCMODE_ 3
#define O_CREAT_ 0100
#define O_TRUNC_ 01000

/* PATH made absolute against BASE and normalized by name into OUT; 0 when it does not fit */
static int lexical(const char *base, const char *path, char *out, int size) {
    char tmp[2048];
    int n = 0;
    if (path[0] != '/') {
        for (const char *q = base; *q && n < (int)sizeof tmp - 2; q++) tmp[n++] = *q;
        tmp[n++] = '/';
    }
    for (const char *q = path; *q && n < (int)sizeof tmp - 1; q++) tmp[n++] = *q;
    if (n >= (int)sizeof tmp - 1) return 0;
    tmp[n] = 0;
    int o = 0;
    for (int i = 0; i < n;) {
        while (i < n && tmp[i] == '/') i++;
        int start = i;
        while (i < n && tmp[i] != '/') i++;
        int len = i - start;
        if (len == 0 || (len == 1 && tmp[start] == '.')) continue;
        if (len == 2 && tmp[start] == '.' && tmp[start + 1] == '.') {
            while (o > 0 && out[o - 1] != '/') o--;
            if (o > 0) o--;
            continue;
        }
        if (o + len + 2 >= size) return 0;
        out[o++] = '/';
        for (int j = 0; j < len; j++) out[o++] = tmp[start + j];
    }
    if (o == 0) out[o++] = '/';
    out[o] = 0;
    return 1;
}

/* A write into a kept folder refused: WHY (WL bytes) and PATH on stderr, the descriptor FD closed and
 * the file it made (REAL, where it did not exist before) removed. -EACCES. */
static long refuse_kept(const char *why, long wl, const char *path, long fd, int existed, const char *real) {
    sys5(__NR_write, 2, (long)why, wl, 0, 0);
    long pl = 0;
    while (path[pl]) pl++;
    sys5(__NR_write, 2, (long)path, pl, 0, 0);
    sys5(__NR_write, 2, (long)"\n", 1, 0, 0);
    sys5(__NR_close, fd, 0, 0, 0, 0);
    if (!existed) sys5(__NR_unlinkat, AT_FDCWD, (long)real, 0, 0, 0);
    return -13; /* EACCES */
}

/* ---- the agent's start-up code, run after the Python guard (round XXVI, written against round XXIII) ----
 * A .pth file's `import` lines run as Python starts (site's addpackage), before the Python guard (a
 * sitecustomize, imported after them) and before any rule of its: such code can speak to this library as the
 * guard does (sandfleet_seal_guard_loaded ended round XXIII's pre-arm: the venv-pth-guard-loaded row), and
 * nothing in the process can judge what ran before its judge. So in a Python that loads the guard (the guard's
 * folder first on its PYTHONPATH, no -S, -I or -E), a .pth file of the agent's (the workdir's, a shared
 * /tmp's: a venv there, the image's own too, whose imports reach its files) is read without its import lines
 * (each a comment now: its path lines are site's as before), and the lines are kept here until the guard,
 * loaded and armed, takes them (sandfleet_seal_startup) and runs them as the code under test's. */
static int python3_guarded(void);
static int python_loads_guard(long k);
static int defer_state; /* 1: this Python defers */
static int startup_taken;
static char startup_text[1 << 16]; /* "FILE\0LINE\n"... */
static long startup_len;
static char pth_in[1 << 16], pth_out[1 << 16];

static void decide_defer(void) {
    char g[256];
    int pos = 0;
    if (!python3_guarded() || !next_path(&pos, 'g', g, sizeof g)) return;
    char **ep = env_now();
    const char *pp = 0;
    for (int n = 0; ep && ep[n]; n++)
        if (prefix(ep[n], "PYTHONPATH=")) pp = ep[n] + 11;
    const char *q = g;
    while (pp && *q && *q == *pp) q++, pp++;
    if (!pp || *q || (*pp && *pp != ':')) return;
    long k = read_whole("/proc/self/cmdline", buf, sizeof buf);
    defer_state = k > 0 && python_loads_guard(k);
}

static int ends_with(const char *s, const char *end) {
    int n = 0, m = 0;
    while (s[n]) n++;
    while (end[m]) m++;
    return n >= m && same(s + n - m, end);
}

/* FD, open on REAL (a .pth of the agent's): a memfd of its text without the import lines, which are kept */
static long defer_pth(long fd, const char *real, long flags) {
    long k = 0, r;
    while (k < (long)sizeof pth_in && (r = sys5(__NR_read, fd, (long)(pth_in + k), sizeof pth_in - k, 0, 0)) > 0)
        k += r;
    long o = 0;
    int rl = 0;
    while (real[rl]) rl++;
    for (long i = 0; i < k;) {
        long e = i;
        while (e < k && pth_in[e] != '\n') e++;
        int imports = prefix(pth_in + i, "import ") || prefix(pth_in + i, "import\t");
        if (!imports) {
            for (long j = i; j < e; j++) pth_out[o++] = pth_in[j];
        } else { /* kept, and a comment here (a line past 8 KiB, or past the room kept, is not run at all) */
            if (e - i < 8192 && startup_len + rl + 1 + (e - i) + 1 <= (long)sizeof startup_text) {
                for (int j = 0; j < rl; j++) startup_text[startup_len++] = real[j];
                startup_text[startup_len++] = 0;
                for (long j = i; j < e; j++) startup_text[startup_len++] = pth_in[j] ? pth_in[j] : ' ';
                startup_text[startup_len++] = '\n';
            }
            pth_out[o++] = '#';
        }
        if (e < k) pth_out[o++] = '\n';
        i = e + 1;
    }
    long mfd = sys5(__NR_memfd_create, (long)"sandfleet-pth", (flags & 02000000) ? 1 /* MFD_CLOEXEC */ : 0, 0, 0, 0);
    if (mfd < 0) { /* no memfd: nothing of the file is read (its paths lost with its imports) */
        sys5(__NR_close, fd, 0, 0, 0, 0);
        return sys5(__NR_openat, AT_FDCWD, (long)"/dev/null", flags & 02000000, 0, 0);
    }
    for (long w = 0; w < o;) {
        long n = sys5(__NR_write, mfd, (long)(pth_out + w), o - w, 0, 0);
        if (n <= 0) break;
        w += n;
    }
    sys5(__NR_lseek, mfd, 0, 0, 0, 0);
    sys5(__NR_close, fd, 0, 0, 0, 0);
    return mfd;
}

/* The import lines kept as this Python started (LEN their bytes): the guard takes them once */
__attribute__((visibility("default"))) const char *sandfleet_seal_startup(long *len) {
    startup_taken = 1;
    if (len) *len = startup_len;
    return startup_text;
}

static long seal_open(long dirfd, const char *path, long flags, long mode, void *ret) {
    char r[256];
    int pos = 0, writes = (flags & O_ACCMODE_) != 0 || (flags & (O_CREAT_ | O_TRUNC_));
    if (!writes && path && defer_state && !startup_taken && ends_with(path, ".pth")) {
        long fd = sys5(__NR_openat, dirfd, (long)path, flags, mode, 0);
        char real[1024];
        if (fd < 0 || fd_target(fd, real, sizeof real) <= 0 || !(agents_file(real) || agent_touched(real))) return fd;
        return defer_pth(fd, real, flags);
    }
    if (!writes || !path || !next_kept(&pos, r, sizeof r)) return sys5(__NR_openat, dirfd, (long)path, flags, mode, 0);
    int existed = sys5(__NR_faccessat, dirfd, (long)path, 0, 0, 0) == 0;
    long trunc = (flags & O_TRUNC_) && (flags & O_ACCMODE_);
    long fd = sys5(__NR_openat, dirfd, (long)path, trunc ? flags & ~O_TRUNC_ : flags, mode, 0);
    if (fd < 0) return fd;
    char real[1024], base[1024], named[2048];
    long n = fd_target(fd, real, sizeof real);
    for (pos = 0; n > 0 && next_kept(&pos, r, sizeof r);) {
        if (!under(real, r)) continue;
        if (asked_by_code((unsigned long)ret)) { /* a library of the agent's in a tests' program */
            static const char m[] = "sandfleet: a library of the code under test can't write a kept folder: ";
            return refuse_kept(m, sizeof m - 1, path, fd, existed, real);
        }
        long b = 0;
        if (path[0] != '/' && dirfd != AT_FDCWD) b = fd_target(dirfd, base, sizeof base);
        else if (path[0] != '/') b = sys5(__NR_readlinkat, AT_FDCWD, (long)"/proc/self/cwd", (long)base,
                                          sizeof base - 1, 0);
        base[b > 0 ? b : 0] = 0;
        if (lexical(base, path, named, sizeof named) && under(named, r)) break; /* named: the tests' write */
        /* a descriptor the program already holds, by the system's own names for it (`> /dev/stdout`
           with stdout on the reward file): no link anyone could plant is on that way */
        if (under(named, "/proc") || under(named, "/dev/fd") || same(named, "/dev/stdout") ||
            same(named, "/dev/stderr") || same(named, "/dev/stdin"))
            break;
        static const char msg[] = "sandfleet: a write into a kept folder through a link refused: ";
        return refuse_kept(msg, sizeof msg - 1, path, fd, existed, real);
    }
    if (trunc) sys5(__NR_ftruncate, fd, 0, 0, 0, 0);
    return fd;
}

static int opened(long r) {
    if (r < 0) {
        *errno_at() = (int)-r;
        return -1;
    }
    return (int)r;
}
/* the mode is read where the caller passed one (O_CREAT, O_TMPFILE); varargs come in the same
 * registers as fixed arguments on x86_64 and aarch64 Linux */
__attribute__((visibility("default"))) int open(const char *path, int flags, int mode) {
    return opened(seal_open(AT_FDCWD, path, flags, mode, __builtin_return_address(0)));
}
__attribute__((visibility("default"))) int open64(const char *path, int flags, int mode) {
    return opened(seal_open(AT_FDCWD, path, flags, mode, __builtin_return_address(0)));
}
__attribute__((visibility("default"))) int openat(int dirfd, const char *path, int flags, int mode) {
    return opened(seal_open(dirfd, path, flags, mode, __builtin_return_address(0)));
}
__attribute__((visibility("default"))) int openat64(int dirfd, const char *path, int flags, int mode) {
    return opened(seal_open(dirfd, path, flags, mode, __builtin_return_address(0)));
}
__attribute__((visibility("default"))) int creat(const char *path, int mode) {
    return opened(seal_open(AT_FDCWD, path, 01 | O_CREAT_ | O_TRUNC_, mode, __builtin_return_address(0)));
}
__attribute__((visibility("default"))) int creat64(const char *path, int mode) {
    return opened(seal_open(AT_FDCWD, path, 01 | O_CREAT_ | O_TRUNC_, mode, __builtin_return_address(0)));
}

/* fopen opens with libc's own open, not the one above (GNU tee: `tee /tmp/linkdir/reward.txt`): a
 * mode that writes opens here and is handed to libc's fdopen, as glibc's own fopen does */
static void *seal_fopen(const char *name, const char *path, const char *mode, void *ret) {
    void *(*real)(const char *, const char *) = dlsym ? (void *(*)(const char *, const char *))dlsym((void *)-1L, name) : 0;
    void *(*fdopen_)(int, const char *) = dlsym ? (void *(*)(int, const char *))dlsym((void *)-1L, "fdopen") : 0;
    if (!real || !fdopen_) { *errno_at() = 38; return 0; } /* ENOSYS */
    if (!mode || !path || (mode[0] != 'w' && mode[0] != 'a' && !(mode[0] == 'r' && mode[1] == '+')))
        return real(path, mode);
    long flags = mode[0] == 'r' ? 0 : mode[0] == 'w' ? O_CREAT_ | O_TRUNC_ : O_CREAT_ | 02000 /* O_APPEND */;
    int plus = 0;
    for (const char *m = mode + 1; *m && *m != ','; m++) {
        if (*m == '+') plus = 1;
        else if (*m == 'x') flags |= 0200;        /* O_EXCL */
        else if (*m == 'e') flags |= 02000000;    /* O_CLOEXEC */
    }
    flags |= plus ? 2 : (mode[0] == 'r' ? 0 : 1); /* O_RDWR, O_WRONLY */
    int fd = opened(seal_open(AT_FDCWD, path, flags, 0666, ret));
    if (fd < 0) return 0;
    void *f = fdopen_(fd, mode);
    if (!f) {
        int e = *errno_at();
        sys5(__NR_close, fd, 0, 0, 0, 0);
        *errno_at() = e;
    }
    return f;
}
__attribute__((visibility("default"))) void *fopen(const char *path, const char *mode) {
    return seal_fopen("fopen", path, mode, __builtin_return_address(0));
}
__attribute__((visibility("default"))) void *fopen64(const char *path, const char *mode) {
    return seal_fopen("fopen64", path, mode, __builtin_return_address(0));
}

/* ---- the code under test inside a tests' own process (docs/security.md, "In the tests' process") ----
 * A grader that imports the workdir's code runs it in its own process: Landlock can't tell them
 * apart there. The tests' Python guard can, by the Python stack: what runs while a frame of the
 * workdir's (or an unpickling) is on it is the code under test's. It tells this library, which
 * holds what the guard can't: the exec hook above (start_is_code) and the exit below. */

/* PATH is in a kept folder (a reward folder, the tests' HOME, a tests' folder): 1, else 0. */
__attribute__((visibility("default"))) int sandfleet_seal_kept(const char *path) {
    char r[256];
    if (!path) return 0;
    for (int pos = 0; next_walled(&pos, r, sizeof r);)
        if (under(path, r)) return 1;
    return 0;
}

/* The next program this process starts is the code under test's (1) or decided as before (0). */
__attribute__((visibility("default"))) void sandfleet_seal_next_start(int code) { start_is_code = code != 0; }

/* The process whose exit status the tests read, once it has loaded the workdir's code: an _exit it
 * makes reports no success unless the guard sanctioned it (its caller was the tests' own code), and
 * an exec of it is refused unless the guard said the tests' own code asks for it (exec_ok, once). */
static int sanctioned;
__attribute__((visibility("default"))) void sandfleet_seal_exec_ok(void) { exec_ok = 1; }

/* A child the code under test forked inside a grader: kept from the reward folders at once, in
 * the kernel (Landlock), before any more of its code runs. 0 when kept; 2 where the seal demotes
 * instead (no Landlock, the tests root: the caller drops to sandfleet_seal_uid() in every thread). */
__attribute__((visibility("default"))) int sandfleet_seal_keep_self(void) {
    long abi = sys5(__NR_landlock_create_ruleset, 0, 0, LANDLOCK_CREATE_RULESET_VERSION, 0, 0);
    int restricted = abi >= 1 && restrict_rewards((int)abi) == 0;
    if (demotes(abi)) return 2;
    return restricted ? 0 : -1;
}
static int guard_armed;
__attribute__((visibility("default"))) void sandfleet_seal_arm_exit(void) {
    armed_pid = sys5(__NR_getpid, 0, 0, 0, 0, 0);
    guard_armed = 1;
}
__attribute__((visibility("default"))) void sandfleet_seal_sanction_exit(void) { sanctioned = 1; }

/* _exit and _Exit (os._exit, ctypes' _exit): libc's own exit() ends through its internal _exit,
 * not this one, so a normal end is untouched. An armed process's unsanctioned _exit(0) -- the code
 * under test ending the tests' runner before it decided (round V's in-process-exit0, round VI's
 * pickle-exit0) -- exits 1, and says so. A forked child (another pid) is left alone. */
/* An exit with 0 that a library of the agent's asks of a tests' program (asked_by_code: a ctypes-loaded
 * build's function or destructor, round XXI) reports no success either, armed or not. */
static int code_exits_tests(int status, void *ret) {
    if (status != 0 || program_code || !asked_by_code((unsigned long)ret)) return status;
    static const char m[] = "sandfleet: a library of the code under test ended a tests' program with exit 0; "
                            "it exits 1\n";
    sys5(__NR_write, 2, (long)m, sizeof m - 1, 0, 0);
    return 1;
}

/* A tests' Perl ends by libc's exit, as its script asked (exit, die, the end of the file: the Perl guard,
 * langguard.py, judges those); an _exit(0) of its main process -- POSIX::_exit(0) in a sub of the agent's --
 * reports no success (a forked child's, another pid, is left alone) */
static long perl_pid;
static void __attribute__((noreturn)) seal_exit(int status) {
    if (status == 0 && perl_pid && sys5(__NR_getpid, 0, 0, 0, 0, 0) == perl_pid) {
        static const char m[] = "sandfleet: the tests' perl program was ended with _exit(0) (POSIX::_exit); it exits 1 "
                                "(docs/security.md, \"Graders in other languages\")\n";
        sys5(__NR_write, 2, (long)m, sizeof m - 1, 0, 0);
        status = 1;
    }
    if (status == 0 && armed_pid && !sanctioned && sys5(__NR_getpid, 0, 0, 0, 0, 0) == armed_pid) {
        static const char m[] = "sandfleet: the code under test ended the tests' process with _exit(0); "
                                "it exits 1 (docs/security.md, \"In the tests' process\")\n";
        sys5(__NR_write, 2, (long)m, sizeof m - 1, 0, 0);
        status = 1;
    }
    for (;;) sys5(__NR_exit_group, status, 0, 0, 0, 0);
}
__attribute__((visibility("default"))) void _exit(int status) {
    seal_exit(code_exits_tests(status, __builtin_return_address(0)));
}
__attribute__((visibility("default"))) void _Exit(int status) {
    seal_exit(code_exits_tests(status, __builtin_return_address(0)));
}

/* An armed tests' Python ends through libc's exit only after its own finalization, which reports here
 * (the guard's last atexit handler: sandfleet_seal_finalized). An exit that comes before it -- native
 * code of the agent's (a ctypes-loaded build, a C extension of the workdir) calling libc's exit(0) in
 * the middle of the run, round XXI -- reports no success: this library's destructor, run by that exit
 * after the others (it was loaded first), ends the process with 1. (libc's exit is not interposed
 * here: without dlsym, in a glibc before 2.34, the real one could not be found.) */
static int finalized;
__attribute__((visibility("default"))) void sandfleet_seal_finalized(void) { finalized = 1; }
__attribute__((destructor)) static void seal_fini(void) {
    if (!armed_pid || finalized || sys5(__NR_getpid, 0, 0, 0, 0, 0) != armed_pid) return;
    static const char m[] = "sandfleet: the tests' process was ended by exit() before its own finalization (the "
                            "code under test's native code); it exits 1\n";
    sys5(__NR_write, 2, (long)m, sizeof m - 1, 0, 0);
    for (;;) sys5(__NR_exit_group, 1, 0, 0, 0, 0);
}

/* The code under test's HOME (the caller, Python's guard, puts it in os.environ), or 0. */
__attribute__((visibility("default"))) const char *sandfleet_seal_code_home(void) {
    return code_home() ? home_env + 5 : 0;
}

/* The tests' user that the code under test runs as where the seal demotes (2 above), or -1. */
__attribute__((visibility("default"))) long sandfleet_seal_uid(void) { return demote_uid(); }

/* The verifier's probe (its PREPARE runs `true --sandfleet-seal-probe` with this library
 * preloaded): "landlock=ABI\n" on stdout, the Landlock ABI this kernel gives the tests (below 1:
 * none, as in gVisor: the reward folders are not kept from the code under test, a risk the row
 * carries). It only prints; the program goes on as any other. */
static void probe(long abi) {
    static const char arg[] = "--sandfleet-seal-probe";
    long k = read_whole("/proc/self/cmdline", buf, sizeof buf);
    long a0 = 0;
    while (a0 < k && buf[a0]) a0++;
    if (a0 + 1 >= k || !same(buf + a0 + 1, arg)) return;
    char m[32] = "landlock=";
    int n = 9 + put_uint(m + 9, abi < 0 ? 0 : (unsigned long)abi);
    m[n++] = '\n';
    sys5(__NR_write, 1, (long)m, n, 0, 0);
}

/* The constructor's judgement of this program: the code under test (kept from the reward folders, or
 * demoted where there is no Landlock), in this order, each reading what the one before it read. */
/* The program that started this one runs native code of the agent's: an executable mapping, other than
 * its own program's, of a file of the workdir, a shared temporary folder or a memfd (a library the tests
 * loaded: ctypes.CDLL('/tmp/libsol.so'), a harness linked against /tmp/libsol.so). What it starts may be
 * that code's start made through libc's own functions behind the seal's interposed ones (a dlopen
 * handle of its own, round XXI's ctypes-lib-libc-handle), so it is the code under test; the tests'
 * own starts after they loaded the agent's library are kept too (a grader rarely starts a writer of
 * the reward folder after that). A parent whose maps this program may not read is not known to run
 * any: the tests' own shells are such parents (tried: failing closed there kept test.sh's own tee from
 * the reward folder), and so is one the agent's library made non-dumpable first
 * (prctl(PR_SET_DUMPABLE, 0): ctypes-lib-undumpable, the residual). */
static int parent_runs_agent_code(void) {
    char path[48], pexe[512];
    long ppid = sys5(__NR_getppid, 0, 0, 0, 0, 0);
    if (ppid <= 1) return 0;
    int m = 0;
    for (const char *q = "/proc/"; *q; q++) path[m++] = *q;
    m += put_uint(path + m, (unsigned long)ppid);
    int base = m;
    for (const char *q = "/exe"; *q; q++) path[m++] = *q;
    path[m] = 0;
    long n = sys5(__NR_readlinkat, AT_FDCWD, (long)path, (long)pexe, sizeof pexe - 1, 0);
    pexe[n > 0 ? n : 0] = 0;
    m = base;
    for (const char *q = "/maps"; *q; q++) path[m++] = *q;
    path[m] = 0;
    long k = read_whole(path, maps_buf, sizeof maps_buf);
    struct map_line line;
    for (long i = 0; next_map(&i, k, &line);)
        if (line.exec && line.file && agents_file(line.file) && !same(line.file, pexe)) return 1;
    return 0;
}

/* The environment says a tests' Python loaded a library of the agent's before it started this program
 * (SANDFLEET_SEAL_NATIVE=1, testguard.py): its maps may have been closed to this look (made non-dumpable),
 * its environment is handed down by libc's own starts all the same. Only ever keeps. */
static int native_marked(void) {
    long k = read_whole("/proc/self/environ", env, sizeof env);
    for (long i = 0; i < k; i++) {
        if (same(env + i, "SANDFLEET_SEAL_NATIVE=1")) return 1;
        while (i < k && env[i]) i++;
    }
    return 0;
}

static int program_is_code(void) {
    return started_as_code() || option_from_cwd() || (grader() ? 0 : code_under_test(cmdline_len)) ||
           run_by_git(cmdline_len) || native_marked() || parent_runs_agent_code();
}

/* The Python guard's folder ("g:", kept like a "k:" one) first on the PYTHONPATH of a program of the tests'
 * own (the code under test's keep what they were given: the guard's rules are about a tests' process, and
 * in the code's own Python its exit by SystemExit(0) is its answer, not a forgery), whatever the tests set:
 * a test script's own `export PYTHONPATH=/app` took it off, and with it every rule of the guard in the
 * Pythons it started (round XXII's tests-pythonpath: the solution's import ended the grader with
 * status 0). The entry changed in place, or the environment one entry longer; left as it is where it
 * does not fit. Python reads it with getenv, after this constructor. */
static char guard_env[4096];
static char *guard_envp[2048];
static int guard_first(void) { /* 0: no "g:" line (no guards written) */
    char g[256];
    int pos = 0;
    if (!next_path(&pos, 'g', g, sizeof g)) return 0;
    char **ep = env_now();
    if (!ep) return 1;
    int n = 0, at = -1;
    for (; ep[n]; n++)
        if (at < 0 && prefix(ep[n], "PYTHONPATH=")) at = n;
    const char *old = at >= 0 ? ep[at] + 11 : "";
    const char *o = old, *q = g;
    while (*q && *q == *o) q++, o++;
    if (!*q && (!*o || *o == ':')) return 1; /* first already */
    int m = 0;
    for (const char *c = "PYTHONPATH="; *c; c++) guard_env[m++] = *c;
    for (q = g; *q; q++) guard_env[m++] = *q;
    if (*old) guard_env[m++] = ':';
    for (o = old; *o; o++) {
        if (m >= (int)sizeof guard_env - 1) return 1;
        guard_env[m++] = *o;
    }
    guard_env[m] = 0;
    if (at >= 0) {
        ep[at] = guard_env;
        return 1;
    }
    if (n + 2 > (int)(sizeof guard_envp / sizeof guard_envp[0])) return 1;
    for (int i = 0; i < n; i++) guard_envp[i] = ep[i];
    guard_envp[n] = guard_env;
    guard_envp[n + 1] = 0;
    environ = guard_envp;
    return 1;
}

/* ---- a tests' Python started from a virtual environment of the agent's (round XXIII) ----
 * A venv's site-packages is processed as Python starts, before the Python guard (a sitecustomize) loads:
 * a .pth file there runs its `import` lines in the tests' process (a venv the tests make in the workdir,
 * as Terminal-Bench's `uv venv .tbench-testing` does, keeps the agent's planted files; so does one of the
 * agent's that the tests activate). Such a Python is armed from its first instruction: an _exit(0), an
 * exec or an exit() that comes before the guard says it loaded (sandfleet_seal_guard_loaded) is the
 * agent's and reports no success; the guard then judges the rest (the site folder is the workdir's:
 * testguard.py, as a grader that imported the workdir's code). */
static int prearmed;

/* NAME made absolute against the cwd into OUT: its length, 0 where the cwd is unknown or the result does not
 * fit in SIZE - ROOM */
static int absolute(const char *name, char *out, int size, int room) {
    int m = 0;
    if (name[0] != '/') {
        long n = sys5(__NR_readlinkat, AT_FDCWD, (long)"/proc/self/cwd", (long)out, size - 2, 0);
        if (n <= 0) return 0;
        m = (int)n;
        out[m++] = '/';
    }
    for (; *name; name++) {
        if (m >= size - room) return 0;
        out[m++] = *name;
    }
    out[m] = 0;
    return m;
}

/* The executable's path as exec was given it (AT_EXECFN: a venv's bin/python3, not the link's target)
 * into OUT, made absolute against the cwd of the first call (the constructor's: exec's own); 0 when unknown.
 * Read once: a tests' Python's start asks twice (refuse_planted, prearm) */
static char exec_buf[4096];
static int exec_len = -1; /* -1 unread, 0 unknown */
static int exec_path(char *out, int size) {
    if (exec_len < 0) {
        static unsigned long auxv[128];
        long k = read_whole("/proc/self/auxv", (char *)auxv, sizeof auxv - sizeof auxv[0]);
        const char *fn = 0;
        for (long i = 0; (i + 2) * (long)sizeof auxv[0] <= k && auxv[i]; i += 2)
            if (auxv[i] == 31 /* AT_EXECFN */) fn = (const char *)auxv[i + 1];
        exec_len = fn ? absolute(fn, exec_buf, sizeof exec_buf, 16) : 0;
        exec_buf[exec_len] = 0;
    }
    if (exec_len <= 0 || exec_len >= size - 16) return 0;
    for (int i = 0; i <= exec_len; i++) out[i] = exec_buf[i];
    return exec_len;
}

/* This program is CPython 3.8 or later (the guard's audit hooks), by its executable's real name */
static int python3_guarded(void) {
    const char *exe = self_exe();
    if (!exe) return 0;
    const char *b = base_name(exe);
    if (!prefix(b, "python3.")) return 0;
    int minor = 0;
    for (const char *q = b + 8; *q >= '0' && *q <= '9'; q++) minor = minor * 10 + (*q - '0');
    return minor >= 8;
}

/* Python's options before its script, -c or -m: -E, -I (no PYTHONPATH: the guard never loads), -S (no
 * site: no .pth either), -h, -V */
static int python_loads_guard(long k) {
    long i = 0;
    while (i < k && buf[i]) i++; /* argv[0] */
    for (i++; i < k; i++) {
        const char *a = buf + i;
        while (i < k && buf[i]) i++;
        if (a[0] != '-' || !a[1]) return 1; /* the script, or - */
        if (a[1] == '-') {
            if (!a[2]) return 1;
            if (same(a, "--help") || same(a, "--version")) return 0;
            if (same(a, "--check-hash-based-pycs")) { while (++i < k && buf[i]) {} }
            continue;
        }
        for (const char *c = a + 1; *c; c++) {
            if (*c == 'E' || *c == 'I' || *c == 'S' || *c == 'h' || *c == 'V' || *c == '?') return 0;
            if (*c == 'c' || *c == 'm') return 1;
            if (*c == 'W' || *c == 'X') {
                if (!c[1]) { while (++i < k && buf[i]) {} }
                break;
            }
        }
    }
    return 1;
}

/* EXE's folder, or the one above it, holds a pyvenv.cfg that the agent could have written */
static int venv_of_agents(void) {
    char p[4096];
    int n = exec_path(p, sizeof p);
    for (int up = 0; up < 2 && n > 0; up++) {
        while (n > 0 && p[n - 1] != '/') n--; /* the folder, its '/' kept */
        if (n <= 1) return 0;
        const char *cfg = "pyvenv.cfg";
        int m = n;
        for (const char *q = cfg; *q; q++) p[m++] = *q;
        p[m] = 0;
        if (sys5(__NR_faccessat, AT_FDCWD, (long)p, 0, 0, 0) == 0) {
            char real[4096];
            long fd = sys5(__NR_openat, AT_FDCWD, (long)p, 010000000 /* O_PATH */ | 02000000, 0, 0);
            if (fd < 0) return 1;
            long r = fd_target(fd, real, sizeof real);
            sys5(__NR_close, fd, 0, 0, 0, 0);
            return r <= 0 || agents_file(real);
        }
        n--; /* up: past the '/' */
    }
    return 0;
}

/* A program of the tests' own where the guards are written (guard_first found a "g:" line): a Perl's
 * main process noted (seal_exit), a Python from the agent's venv armed */
static void prearm(void) {
    const char *exe = self_exe();
    if (exe && prefix(base_name(exe), "perl")) perl_pid = sys5(__NR_getpid, 0, 0, 0, 0, 0);
    if (!python3_guarded() || !venv_of_agents()) return; /* a guard to load */
    long k = read_whole("/proc/self/cmdline", buf, sizeof buf);
    if (k <= 0 || !python_loads_guard(k)) return;
    armed_pid = sys5(__NR_getpid, 0, 0, 0, 0, 0);
    prearmed = 1;
}

/* The Python guard loaded (its last statement): a pre-arm ends here (the guard's own arm stays) */
__attribute__((visibility("default"))) void sandfleet_seal_guard_loaded(void) {
    if (prearmed && !guard_armed) armed_pid = 0;
    prearmed = 0;
}

/* ---- the tests' own virtual environment, made over a folder of the agent's (round XXIV) ----
 * A test script that makes its venv in the workdir (Terminal-Bench's `uv venv .tbench-testing`, a
 * `python3 -m venv`) or a shared /tmp and installs its runner there believes what runs from it is its own. But venv keeps
 * what the folder held, and pip keeps a package whose metadata says it is installed ("Requirement already
 * satisfied"): a venv the agent left at that name hands the tests the agent's pytest, its console script or
 * a pip.conf that installs the agent's wheel. What tells them apart needs no name: the preparation wrote the
 * guards (the "g:" folder's sitecustomize.py) after the agent's last write, so a file changed before it
 * (its change time, which no process can set) is the agent's or the image's; a pyvenv.cfg changed after it
 * is a venv the tests made. A program or module of such a venv is the agent's, though the tests take it for
 * theirs, where its own file is older than the preparation, or where the venv's folder was born before it or
 * holds an entry older than it (the folder the agent made: whatever the tests' pip then wrote there, the
 * venv's config was the agent's; gVisor knows no birth times, the entries tell it there). */
struct ts { long long s; unsigned ns; };

/* PATH's (relative to DIRFD) change time (CTIME) or birth time into T: 0 when unknown (gVisor knows no
 * birth times). A link's own, or (FOLLOW) what it leads to. */
static int time_at_as(long dirfd, const char *path, int birth, int follow, struct ts *t) {
    unsigned char stx[256];
    unsigned mask = birth ? 0x800 /* STATX_BTIME */ : 0x80 /* STATX_CTIME */;
    if (sys5(__NR_statx, dirfd, (long)path, follow ? 0 : 0x100 /* AT_SYMLINK_NOFOLLOW */, mask, (long)stx) != 0)
        return 0;
    if (!(*(unsigned *)stx & mask)) return 0;
    int at = birth ? 80 : 96; /* stx_btime, stx_ctime */
    t->s = *(long long *)(stx + at);
    t->ns = *(unsigned *)(stx + at + 8);
    return t->s || t->ns; /* (gVisor's runsc sets STATX_BTIME in the mask with a birth time of 0) */
}

static int time_at(long dirfd, const char *path, int birth, struct ts *t) {
    return time_at_as(dirfd, path, birth, 0, t);
}
static int time_of(const char *path, int birth, struct ts *t) { return time_at(AT_FDCWD, path, birth, t); }

/* The preparation's time: the change time of the "g:" folder's sitecustomize.py, which it writes; 0 where
 * unknown */
static int prep_time(struct ts *t) {
    char g[256], p[300];
    int pos = 0, n = 0;
    if (!next_path(&pos, 'g', g, sizeof g)) return 0;
    for (const char *q = g; *q; q++) p[n++] = *q;
    for (const char *q = "/sitecustomize.py"; *q; q++) p[n++] = *q;
    p[n] = 0;
    return time_of(p, 0, t);
}

static int earlier(struct ts a, struct ts b) { return a.s < b.s || (a.s == b.s && a.ns < b.ns); }

/* The folder ROOT holds an entry changed before PREP (the agent's pip.conf beside the tests' new pyvenv.cfg):
 * where birth times are unknown, what tells a folder the agent made from one the tests' venv made */
static int holds_older(const char *root, struct ts prep) {
    char ents[4096] __attribute__((aligned(8)));
    long dirfd = sys5(__NR_openat, AT_FDCWD, (long)root, O_RDONLY_DIR | 02000000, 0, 0);
    if (dirfd < 0) return 0;
    int old = 0;
    for (int rounds = 0; !old && rounds < 16; rounds++) { /* 16 reads of 4 KiB: a venv's root has a handful */
        long got = sys5(__NR_getdents64, dirfd, (long)ents, sizeof ents, 0, 0);
        if (got <= 0) break;
        for (long off = 0; off < got && !old;) {
            struct dirent64 *d = (struct dirent64 *)(ents + off);
            off += d->d_reclen;
            const char *nm = d->d_name;
            if (nm[0] == '.' && (!nm[1] || (nm[1] == '.' && !nm[2]))) continue;
            struct ts t;
            old = time_at(dirfd, nm, 0, &t) && earlier(t, prep);
        }
    }
    sys5(__NR_close, dirfd, 0, 0, 0, 0);
    return old;
}

/* ---- the image's own venv in the workdir (round XXVI) ----
 * An image that makes the project's venv in the workdir hands the tests a runner the agent may change: every
 * file there is older than the preparation, the image's and the agent's alike, and change times from the
 * sandbox's start are no help (the platform's own steps touch them). What tells them apart was taken before
 * the agent's first command: the venvs of the workdir then, and a time after which a change is the agent's
 * (agent/prepare.c, envs-record); the preparation lists what of those venvs changed since, NUL-terminated
 * records in the "g:" folder's image-envs: "v" a venv's root, "c" an entry of it changed (a file, a link), "a"
 * a root the agent made whole. A file of such a venv is the agent's where it, or a link or file on its way
 * from the root, changed; the rest is the image's, which the tests may take for theirs. */
static char envs_buf[1 << 22];
static long envs_len = -1; /* -1 unread, 0 none */
static int envs_cut;       /* the list did not fit: every file of a listed venv is taken for the agent's */

static void envs_read(void) {
    if (envs_len >= 0) return;
    envs_len = 0;
    char p[300];
    int pos = 0;
    if (!next_path(&pos, 'g', p, sizeof p - 16)) return;
    int n = 0;
    while (p[n]) n++;
    for (const char *q = "/image-envs"; *q; q++) p[n++] = *q;
    p[n] = 0;
    long k = read_whole(p, envs_buf, sizeof envs_buf);
    if (k <= 0) return;
    envs_cut = k >= (long)sizeof envs_buf - 1;
    envs_len = k;
}

/* The list's record at *I (its length into *L), *I moved past it; 0 at the end */
static const char *next_record(long *i, int *l) {
    if (*i >= envs_len) return 0;
    const char *r = envs_buf + *i;
    int n = 0;
    while (*i + n < envs_len && r[n]) n++;
    *i += n + 1;
    *l = n;
    return r;
}

/* FILE (absolute) in a venv the image made in the workdir: -1 none, 0 the image's, 1 the agent's */
static int image_env(const char *file) {
    envs_read();
    char f[2048];
    if (envs_len <= 0 || !lexical("/", file, f, sizeof f)) return -1;
    const char *root = 0, *r;
    int rl = 0, l;
    for (long i = 0; (r = next_record(&i, &l));)
        if (r[0] == 'v' && l - 1 > rl && under(f, r + 1)) root = r + 1, rl = l - 1;
    if (!root) return -1;
    if (envs_cut) return 1;
    for (long i = 0; (r = next_record(&i, &l));)
        if ((r[0] == 'a' && same(r + 1, root)) || (r[0] == 'c' && under(f, r + 1))) return 1;
    return 0;
}

/* FILE (absolute) is in the system's folders and a root agent changed it: its change time (a link's own, where
 * FILE is one) is after the record's ("s", the first of image-envs: taken before the agent's first command, and
 * listed only where the tests run in the agent's own sandbox) and before this preparation's (the "g:" folder's
 * sitecustomize.py, which it writes). The system's folders are root's, and their programs the image's, only
 * where the agent is not root: a root agent's python3 first on PATH, or an image program it rewrote, ran as the
 * tests' own (stop 73's path-eacces-decoy). What the tests install themselves is written after the
 * preparation, and stays theirs; a change time no process can set. No record (a non-root agent, a fresh
 * sandbox of --verify separate), no change. */
/* The record's time and the preparation's, read once: 1 where both are known */
static int agent_window(struct ts *since_out, struct ts *prep_out) {
    static int since_state = -1; /* -1 unread, 0 none, 1 both times read */
    static struct ts since, prep;
    if (since_state < 0) {
        since_state = 0;
        envs_read();
        const char *s = envs_len > 0 && envs_buf[0] == 's' ? envs_buf + 1 : 0;
        long long sec = 0;
        unsigned ns = 0;
        int n = 0, m = 0;
        while (s && *s >= '0' && *s <= '9' && n < 18) sec = sec * 10 + (*s++ - '0'), n++;
        if (s && n && *s == '.')
            for (s++; *s >= '0' && *s <= '9' && m < 9; m++) ns = ns * 10 + (unsigned)(*s++ - '0');
        if (s && n && m == 9 && !*s) {
            since.s = sec;
            since.ns = ns;
            since_state = prep_time(&prep);
        }
    }
    if (since_state != 1) return 0;
    *since_out = since;
    *prep_out = prep;
    return 1;
}

/* FILE (absolute) was changed by a root agent, wherever it is: its change time, or its link target's, falls
 * between the record and the preparation */
static int agent_touched(const char *file) {
    struct ts since, prep, t;
    if (!file || file[0] != '/' || prefix(file, "/proc/") || prefix(file, "/sys/") || prefix(file, "/dev/"))
        return 0;
    if (!agent_window(&since, &prep)) return 0;
    /* its own change time, and what it leads to: a link of the image's whose target the agent rewrote
       (/usr/bin/python3 to python3.11), or whose target is a link the agent turned elsewhere (/etc/alternatives) */
    for (int follow = 0; follow < 2; follow++)
        if (time_at_as(AT_FDCWD, file, 0, follow, &t) && earlier(since, t) && earlier(t, prep)) return 1;
    return 0;
}

static int agent_changed(const char *file) { return file && under_system_dirs(file) && agent_touched(file); }

/* For the Python guard: 1 where a root agent's record is known here (the rule below can say yes), 0 where not */
__attribute__((visibility("default"))) int sandfleet_seal_agent_window(void) {
    struct ts a, b;
    return agent_window(&a, &b);
}

/* For the Python guard: FILE, a module's source, its compiled cache or an extension the tests' Python reads, is
 * one a root agent changed outside the workdir (a standard library's module, a site-packages' one, a .pth) */
__attribute__((visibility("default"))) int sandfleet_seal_agent_touched(const char *file) { return agent_touched(file); }

/* FILE (one the agent could have written: the workdir's, a shared /tmp's) in a venv: -1 none, or no
 * preparation's time to judge by; 0 the agent's venv (its pyvenv.cfg older than the preparation); 1 a venv
 * the tests made over the agent's folder (born before the preparation, or holding an entry older than it, or
 * FILE itself older: its own file the agent's); 2 a venv the tests made; 3 the image's venv, FILE the agent's
 * (changed since the record); 4 the image's venv, FILE the image's (or the tests', written after) */
static int venv_kind(const char *file) {
    char p[4096];
    if (!file || file[0] != '/' || !agents_file(file)) return -1;
    int image = image_env(file);
    if (image >= 0) return image ? 3 : 4;
    struct ts prep, own, cfg, born;
    if (!prep_time(&prep) || !time_of(file, 0, &own)) return -1;
    int n;
    for (n = 0; file[n] && n < (int)sizeof p - 16; n++) p[n] = file[n];
    if (file[n]) return -1;
    for (int up = 0; up < 6; up++) { /* bin/pytest, lib/python3.X/site-packages/pytest/__init__.py */
        while (n > 0 && p[n - 1] != '/') n--;
        if (n <= 1) return -1;
        p[n - 1] = 0; /* the folder */
        if (!agents_file(p)) return -1;
        p[n - 1] = '/';
        int m = n;
        for (const char *q = "pyvenv.cfg"; *q; q++) p[m++] = *q;
        p[m] = 0;
        if (time_of(p, 0, &cfg)) {
            if (earlier(cfg, prep)) return 0; /* a venv of the agent's (or the image's): the workdir's code */
            p[n - 1] = 0;
            if ((time_of(p, 1, &born) && earlier(born, prep)) || holds_older(p, prep)) return 1;
            return earlier(own, prep) ? 1 : 2;
        }
        n--;
    }
    return -1;
}

/* FILE, of a venv the tests take for theirs, is the agent's: the venv was made over the agent's folder */
__attribute__((visibility("default"))) int sandfleet_seal_planted(const char *file) {
    int k = venv_kind(file);
    return k == 1 || k == 3;
}

/* FILE is of a venv the tests made (not over a folder of the agent's) and written after the preparation: their
 * pytest, which the Python guard judges as a grader's runner in a program this library keeps (below) */
__attribute__((visibility("default"))) int sandfleet_seal_tests_venv(const char *file) {
    int k = venv_kind(file);
    return k == 2 || k == 4;
}

/* This program is the code under test's by the constructor's rules: kept from the reward folders whatever it
 * runs where it keeps anything (the Python guard trusts a tests' venv's files only in such a program: round
 * XXIV). Judged here where the constructor did not (no Landlock and no uid to demote to: gVisor with the tests
 * as a user, where no program is kept from the reward folders, a risk the row carries) */
static int judged_code = -1;
__attribute__((visibility("default"))) int sandfleet_seal_program_code(void) {
    if (program_code > 0) return 1;
    if (judged_code < 0) {
        char t[256];
        int pos = 0;
        judged_code = next_path(&pos, 't', t, sizeof t) && program_is_code();
    }
    return judged_code;
}

/* MOD's top-level module in the site-packages of the venv of the workdir whose interpreter this is (by
 * AT_EXECFN: ROOT/bin/python) into OUT: 2 a package (OUT its folder), 1 a file, 0 none */
static int venv_module(const char *mod, char *out, int size) {
    const char *exe = self_exe();
    int n = exec_path(out, size - 300);
    if (!exe || n <= 0 || !agents_file(out) || !prefix(base_name(exe), "python")) return 0;
    for (int up = 0; up < 2; up++) { /* ROOT/bin/python: ROOT */
        while (n > 0 && out[n - 1] != '/') n--;
        if (n > 0) n--;
    }
    if (n <= 0) return 0;
    int m = n;
    for (const char *q = "/pyvenv.cfg"; *q; q++) out[m++] = *q;
    out[m] = 0;
    if (sys5(__NR_faccessat, AT_FDCWD, (long)out, 0, 0, 0) != 0) return 0;
    for (const char *q = "/lib/"; *q; q++) out[n++] = *q;
    for (const char *q = base_name(exe); *q && n < size - 250; q++) out[n++] = *q;
    for (const char *q = "/site-packages/"; *q; q++) out[n++] = *q;
    for (const char *q = mod; *q && *q != '.' && n < size - 16; q++) out[n++] = *q;
    out[n] = 0;
    if (sys5(__NR_faccessat, AT_FDCWD, (long)out, 0, 0, 0) == 0) return 2;
    out[n++] = '.'; out[n++] = 'p'; out[n++] = 'y'; out[n] = 0;
    return sys5(__NR_faccessat, AT_FDCWD, (long)out, 0, 0, 0) == 0;
}

/* What python runs (its options before it, as program_in_workdir reads them) is planted: its -m module in a
 * venv of the workdir (a package's __init__.py or __main__.py, else the module's file), or its script, by
 * path (`.tbench-testing/bin/python .tbench-testing/bin/pytest`: round XXV) */
static int argument_planted(void) {
    long k = read_whole("/proc/self/cmdline", buf, sizeof buf);
    long i = 0;
    while (i < k && buf[i]) i++; /* past argv[0] */
    for (i++; i < k; i++) {
        const char *arg = buf + i;
        long len = 0;
        while (i + len < k && buf[i + len]) len++;
        if (arg[0] != '-' && arg[0]) { /* the script: absolute, or against the cwd (a Python's: its argument) */
            const char *exe = self_exe();
            if (!exe || !prefix(base_name(exe), "python")) return 0;
            char f[4096];
            return absolute(arg, f, sizeof f, 1) && sandfleet_seal_planted(f);
        }
        if (!arg[0] || arg[1] == 'c' || arg[1] == '-' || !arg[1]) return 0; /* an empty argument, -c, --, - */
        if (arg[1] == 'm') {
            const char *mod = arg[2] ? arg + 2 : i + len + 1 < k ? buf + i + len + 1 : 0;
            char f[1024];
            int kind = mod ? venv_module(mod, f, sizeof f - 32) : 0;
            if (kind == 1) return sandfleet_seal_planted(f);
            if (kind != 2) return 0;
            int n = 0;
            while (f[n]) n++;
            const char *const files[] = {"/__init__.py", "/__main__.py", 0};
            for (int j = 0; files[j]; j++) {
                int m = n;
                for (const char *q = files[j]; *q; q++) f[m++] = *q;
                f[m] = 0;
                if (sandfleet_seal_planted(f)) return 1;
            }
            return 0;
        }
        if (len == 2 && (arg[1] == 'W' || arg[1] == 'X')) /* takes a value */
            for (i += len + 1; i < k && buf[i]; i++) {}
        else
            i += len;
    }
    return 0;
}

/* A Python started from the image's venv in the workdir whose own files the agent changed: the interpreter reads
 * pyvenv.cfg as it starts, before anything of the tests' (its `home` names where the standard library is found:
 * image-venv-home's copy of it in the workdir, whose encodings package runs first), and pip the venv's pip.conf
 * (image-venv-pip-conf: the agent's wheels installed by the tests' own pip) */
static int image_cfg_changed(void) {
    if (!python3_guarded()) return 0;
    char p[4096];
    int n = exec_path(p, sizeof p - 16);
    for (int up = 0; up < 2 && n > 0; up++) {
        while (n > 0 && p[n - 1] != '/') n--; /* the folder, its '/' kept */
        if (n <= 1) return 0;
        int m = n;
        for (const char *q = "pyvenv.cfg"; *q; q++) p[m++] = *q;
        p[m] = 0;
        if (sys5(__NR_faccessat, AT_FDCWD, (long)p, 0, 0, 0) == 0) {
            int cfg = image_env(p);
            if (cfg != 0) return cfg == 1; /* not a recorded venv's (-1), or it changed */
            m = n; /* pip.conf beside it (uv's .lock there is no file either reads) */
            for (const char *q = "pip.conf"; *q; q++) p[m++] = *q;
            p[m] = 0;
            return image_env(p) == 1;
        }
        n--; /* up: past the '/' */
    }
    return 0;
}

/* A tests' program that is the agent's in the tests' own venv (its executable or script, or python's -m
 * module): it never runs (status 126, a line on stderr) */
static void refuse_planted(void) {
    char p[4096], g[256];
    int pos = 0;
    if (!next_path(&pos, 'g', g, sizeof g) || exec_path(p, sizeof p) <= 0) return;
    if (image_cfg_changed()) {
        static const char mc[] = "sandfleet: the agent changed a file of the image's virtual environment in the "
                                 "workdir that its Python reads as it starts (pyvenv.cfg, pip.conf); it does not "
                                 "run: ";
        sys5(__NR_write, 2, (long)mc, sizeof mc - 1, 0, 0);
        int l = 0;
        while (p[l]) l++;
        p[l++] = '\n';
        sys5(__NR_write, 2, (long)p, l, 0, 0);
        sys5(__NR_exit_group, 126, 0, 0, 0, 0);
    }
    /* the venv's own interpreter (bin/python3, a link to the system's Python, whoever made the link) runs what it
       is given: a tests' script is theirs (round XXIII's venv of the agent's that the tests remake and run
       their check with); its -m module or script of the venv, a console script or any other program of the
       venv is judged here. An interpreter is a Python: a bin/python that venv kept from the agent's folder (it
       links only the name it was started as) and that is a #! script (its executable /bin/sh) or a link to
       another program of the system's (/bin/true) is judged as any program of the venv (round XXV) */
    const char *exe = self_exe();
    int interpreter = prefix(base_name(p), "python") && exe && !agents_file(exe) && prefix(base_name(exe), "python");
    if ((interpreter || !sandfleet_seal_planted(p)) && !(agents_file(p) && argument_planted())) return;
    static const char m[] = "sandfleet: the tests made a virtual environment over the agent's folder, and this "
                            "program of it is the agent's, not theirs; it does not run: ";
    static const char mi[] = "sandfleet: this program of the image's virtual environment in the workdir (or what it "
                             "is given to run) was changed by the agent; it does not run: ";
    if (image_env(p) >= 0) sys5(__NR_write, 2, (long)mi, sizeof mi - 1, 0, 0);
    else sys5(__NR_write, 2, (long)m, sizeof m - 1, 0, 0);
    int l = 0;
    while (p[l]) l++;
    p[l++] = '\n';
    sys5(__NR_write, 2, (long)p, l, 0, 0);
    sys5(__NR_exit_group, 126, 0, 0, 0, 0);
}

static void seal_start(void);
__attribute__((constructor)) static void sandfleet_seal(void) {
    seal_start();
    if (!exempt()) decide_defer(); /* after guard_first: the guard's folder first on PYTHONPATH */
}

static void seal_start(void) {
    long abi = sys5(__NR_landlock_create_ruleset, 0, 0, LANDLOCK_CREATE_RULESET_VERSION, 0, 0);
    probe(abi);
    if (exempt()) return;
    refuse_planted();
    int nnp = 0;
    if (abi < 6) seal_signals(sys5(__NR_getpid, 0, 0, 0, 0, 0), &nnp);
    if (abi < 1) {
        char t0[256];
        int p0 = 0;
        int tests = next_path(&p0, 't', t0, sizeof t0), code = -1;
        if (tests && demotes(abi)) code = program_code = program_is_code();
        if (code > 0) {
            hand_over(0, 0);
            demote(); /* a new program, before any of its code: one thread */
            give_home(env_now());
        } else if (tests && (code == 0 || !program_is_code())) {
            if (guard_first()) prearm(); /* one of the tests' own: the Python guard first on its PYTHONPATH */
        }
        return;
    }
    /* a program that is not one of the tests' own (the code under test, and whatever it starts)
       can't write in a reward folder: what the tests decide is theirs */
    char t[256];
    int pos = 0;
    int keep = program_code = next_path(&pos, 't', t, sizeof t) && program_is_code();
    if (!keep && guard_first()) prearm(); /* one of the tests' own (or no verifier's paths: no "g:" either) */
    unsigned long long rights = FS_WRITES | (abi >= 2 ? FS_REFER : 0) | (abi >= 3 ? FS_TRUNCATE : 0);
    volatile struct ruleset_attr attr;
    attr.handled_access_fs = MAKE_BLOCK | (keep ? rights : 0);
    attr.handled_access_net = 0;
    attr.scoped = abi >= 6 ? SCOPE_SIGNAL : 0;
    long size = abi >= 6 ? 24 : abi >= 4 ? 16 : 8;
    long fd = sys5(__NR_landlock_create_ruleset, (long)&attr, size, 0, 0, 0);
    if (fd < 0) return;
    if (keep && keep_rewards(fd, rights) < 0) { /* no rules: a domain that handles only MAKE_BLOCK */
        sys5(__NR_close, fd, 0, 0, 0, 0);
        attr.handled_access_fs = MAKE_BLOCK;
        fd = sys5(__NR_landlock_create_ruleset, (long)&attr, size, 0, 0, 0);
        if (fd < 0) return;
    }
    long rc = sys5(__NR_landlock_restrict_self, fd, 0, 0, 0, 0);
    if (rc == -EPERM && !nnp && sys5(__NR_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0)
        rc = sys5(__NR_landlock_restrict_self, fd, 0, 0, 0, 0); /* a non-root user: no_new_privs first */
    sys5(__NR_close, fd, 0, 0, 0, 0);
    int kept = keep && rc == 0 && attr.handled_access_fs != MAKE_BLOCK;
    int split = keep && demotes(abi); /* the split beside Landlock: the tests' user too (in its domain, if
                                         Landlock took: a user where it did not) */
    if (kept || split) drop_reward_fds();
    if (split) {
        hand_over(0, 0);
        demote();
    }
    if (kept || split) give_home(env_now());
}
