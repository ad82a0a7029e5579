/*
 * sandfleet-agent: the guest agent that runs inside every sandfleet sandbox.
 *
 * It serves exec, stdin, kill and file operations over one byte stream (stdin/stdout, or a
 * device opened once with --device, e.g. a virtio-serial port) using the framed protocol
 * documented in docs/protocol.md (version 1):
 *
 *   frame := u32 length (big endian, of what follows) | u8 type | u32 request id | fields
 *   field := u8 tag | u32 length | bytes          (integers are decimal ASCII)
 *
 * It needs nothing from the guest: build it static. A second mode, `launch`, runs on the
 * host (as root) to put a sandbox into its cgroups and private mounts, enter its user
 * namespace, and then either enter its other namespaces itself (--sandbox) or exec the
 * isolation tool (bwrap, runsc).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <linux/capability.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#define PROTO_VERSION "1"
#define MAX_FRAME (256u * 1024u * 1024u)
/* Replies must fit a frame: each captured stream and each file read stays well below it. */
#define MAX_CAPTURE (100LL << 20)
#define MAX_READ ((long long)MAX_FRAME - (1 << 20))
/* The uid model (docs/security.md): commands live in user namespace S, which maps uids
 * 0..65535; the agent itself runs as GUEST_UID, which S leaves unmapped. */
#define GUEST_UID 65536
#define SANDBOX_UIDS 65536

enum { T_HELLO = 1, T_EXEC = 2, T_STDIN = 3, T_KILL = 4, T_READ = 5, T_WRITE = 6, T_SHUTDOWN = 7,
       T_RESIZE = 8 };
enum { R_HELLO = 0x81, R_STARTED = 0x82, R_OUTPUT = 0x83, R_EXIT = 0x84, R_DATA = 0x85,
       R_DONE = 0x86, R_ERROR = 0xEE };
enum { F_ARGV = 1, F_ENV = 2, F_CWD = 3, F_TIMEOUT_MS = 4, F_MAX_OUTPUT = 5, F_STREAM = 6,
       F_STDIN_MODE = 7, F_DATA = 8, F_STREAM_NO = 9, F_CODE = 10, F_SIGNAL = 11,
       F_TIMED_OUT = 12, F_STDOUT = 13, F_STDERR = 14, F_DROPPED_OUT = 15, F_DROPPED_ERR = 16,
       F_DURATION_US = 17, F_PATH = 18, F_MODE = 19, F_ETYPE = 20, F_MESSAGE = 21, F_ERRNO = 22,
       F_VERSION = 23, F_PID = 24, F_TARGET = 25, F_MAX = 26, F_MKDIRS = 27, F_TIME = 28,
       F_USER = 29, F_NOFOLLOW = 30, F_PTY = 31, F_SECCOMP = 32, F_NETWORK = 33,
       F_PIDNS = 34, F_DETACHED = 35, F_NOSTART = 36 };

static int in_fd = 0, out_fd = 1;
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
/* A pidfd of bwrap, our parent outside our pid namespace (launch --lifeline), or -1: it
 * polls readable once bwrap has exited (see serve()). */
static int life_fd = -1;
#define LIFELINE_ENV "SANDFLEET_LIFELINE"
static int sig_pipe[2];

/* ---------- checked allocation: out of memory ends the agent (the host sees it die) ---------- */
static void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) { perror("sandfleet-agent: out of memory"); _exit(70); }
    return p;
}
static void *xmalloc(size_t n) { return xrealloc(NULL, n); }
static void *xcalloc(size_t n, size_t m) {
    if (m && n > SIZE_MAX / m) { fputs("sandfleet-agent: allocation overflow\n", stderr); _exit(70); }
    void *p = xmalloc(n * m);
    memset(p, 0, n * m);
    return p;
}

/* ---------- small buffers ---------- */
typedef struct { char *p; size_t n, cap; } buf_t;

static void buf_add(buf_t *b, const void *d, size_t n) {
    if (!n) return;
    if (n > SIZE_MAX / 4 - b->n) { fputs("sandfleet-agent: buffer overflow\n", stderr); _exit(70); }
    if (b->n + n > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n) c *= 2;
        b->p = xrealloc(b->p, c);
        b->cap = c;
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void buf_u32(buf_t *b, uint32_t v) {
    unsigned char x[4] = {v >> 24, v >> 16, v >> 8, v};
    buf_add(b, x, 4);
}
static void buf_free(buf_t *b) { free(b->p); b->p = NULL; b->n = b->cap = 0; }

/* ---------- output frames ---------- */
static buf_t ob;
static void frame_begin(int type, uint32_t id) {
    ob.n = 0;
    buf_u32(&ob, 0);
    unsigned char t = type;
    buf_add(&ob, &t, 1);
    buf_u32(&ob, id);
}
static void field(int tag, const void *d, size_t n) {
    if (n > MAX_FRAME) n = MAX_FRAME; /* unreachable: captures and reads are capped below it */
    unsigned char t = tag;
    buf_add(&ob, &t, 1);
    buf_u32(&ob, n);
    buf_add(&ob, d, n);
}
static void field_s(int tag, const char *s) { field(tag, s, strlen(s)); }
static void field_i(int tag, long long v) {
    char s[32];
    snprintf(s, sizeof s, "%lld", v);
    field_s(tag, s);
}
static void frame_send(void) {
    if (ob.n - 4 > MAX_FRAME) { fputs("sandfleet-agent: reply over the frame limit\n", stderr); _exit(70); }
    uint32_t len = ob.n - 4;
    ob.p[0] = len >> 24; ob.p[1] = len >> 16; ob.p[2] = len >> 8; ob.p[3] = len;
    size_t off = 0;
    while (off < ob.n) {
        ssize_t w = write(out_fd, ob.p + off, ob.n - off);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) { struct pollfd p = {out_fd, POLLOUT, 0}; poll(&p, 1, 1000); continue; }
            _exit(0); /* host gone */
        }
        off += w;
    }
}

static const char *errno_type(int e) {
    switch (e) {
    case ENOENT: case ENOTDIR: return "FileNotFoundError";
    case EACCES: case EPERM: case EROFS: return "PermissionError";
    case EISDIR: return "IsADirectoryError";
    default: return "OSError";
    }
}
static void send_error(uint32_t id, const char *type, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void send_error(uint32_t id, const char *type, int err, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    frame_begin(R_ERROR, id);
    field_s(F_ETYPE, type ? type : errno_type(err));
    field_s(F_MESSAGE, msg);
    if (err) field_i(F_ERRNO, err);
    frame_send();
}

/* ---------- parsed requests ---------- */
typedef struct { int tag; uint32_t len; const char *data; } fld_t;
typedef struct { int type; uint32_t id; fld_t *f; int nf; } req_t;

static const fld_t *get(const req_t *r, int tag) {
    for (int i = 0; i < r->nf; i++) if (r->f[i].tag == tag) return &r->f[i];
    return NULL;
}
static char *get_str(const req_t *r, int tag) { /* malloc'd NUL-terminated copy or NULL */
    const fld_t *f = get(r, tag);
    if (!f) return NULL;
    char *s = xmalloc((size_t)f->len + 1);
    memcpy(s, f->data, f->len);
    s[f->len] = 0;
    return s;
}
static long long get_int(const req_t *r, int tag, long long dflt) {
    char *s = get_str(r, tag);
    if (!s) return dflt;
    long long v = strtoll(s, NULL, 10);
    free(s);
    return v;
}
static char **get_list(const req_t *r, int tag) {
    int n = 0;
    for (int i = 0; i < r->nf; i++) if (r->f[i].tag == tag) n++;
    if (!n) return NULL;
    char **v = xcalloc((size_t)n + 1, sizeof *v);
    n = 0;
    for (int i = 0; i < r->nf; i++)
        if (r->f[i].tag == tag) {
            v[n] = xmalloc((size_t)r->f[i].len + 1);
            memcpy(v[n], r->f[i].data, r->f[i].len);
            v[n][r->f[i].len] = 0;
            n++;
        }
    return v;
}
static void free_list(char **v) {
    if (!v) return;
    for (char **p = v; *p; p++) free(*p);
    free(v);
}

/* ---------- running commands ---------- */
typedef struct {
    uint32_t id;
    pid_t pid;
    int fd[3];        /* stdin (write end), stdout, stderr (read ends); -1 when closed */
    buf_t cap[2];     /* captured stdout / stderr */
    long long dropped[2];
    long long max_output;
    buf_t pending_in; /* stdin bytes not yet written */
    int close_in;     /* close stdin once pending_in is written */
    int stream, exited, status, timed_out;
    int group;        /* index in groups[] of the command's own cgroup, or -1 */
    int pty;          /* the pseudo-terminal's master (EXEC with PTY), or -1 */
    int det_fd;       /* the warden's report (a sealed command in its own pid namespace), or -1 */
    double start, deadline, exit_time;
} job_t;

static job_t *jobs[4096];
static int njobs;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void kill_tree(pid_t root) {
    /* Kill root's process group and every descendant found through /proc (a child that
     * called setsid() leaves the group but not the tree). Two passes catch late forks. */
    for (int pass = 0; pass < 2; pass++) {
        static pid_t pids[65536], ppids[65536];
        int n = 0;
        DIR *d = opendir("/proc");
        if (d) {
            struct dirent *e;
            while ((e = readdir(d)) && n < 65536) {
                if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
                char path[300], st[512];
                snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
                int fd = open(path, O_RDONLY | O_CLOEXEC);
                if (fd < 0) continue;
                ssize_t k = read(fd, st, sizeof st - 1);
                close(fd);
                if (k <= 0) continue;
                st[k] = 0;
                char *rp = strrchr(st, ')');
                if (!rp) continue;
                int ppid = 0;
                char state;
                if (sscanf(rp + 2, "%c %d", &state, &ppid) != 2) continue;
                pids[n] = atoi(e->d_name);
                ppids[n] = ppid;
                n++;
            }
            closedir(d);
        }
        static pid_t kill_list[65536];
        int nk = 0;
        kill_list[nk++] = root;
        for (int i = 0; i < nk; i++)
            for (int j = 0; j < n; j++)
                if (ppids[j] == kill_list[i] && nk < 65536) kill_list[nk++] = pids[j];
        kill(-root, SIGKILL);
        for (int i = 0; i < nk; i++) kill(kill_list[i], SIGKILL);
    }
}


/* ---------- users and isolation (docs/security.md, "The uid model") ---------- */
static int isolated = 0;     /* commands run in user namespace S as the user they ask for */
static int oom_protected = 0; /* the launcher lowered our oom_score_adj: commands go back to 0 */
static const char *g_preload; /* --preload LIB: appended to every command's LD_PRELOAD (gVisor's
                                  stat shim, statcompat.c) */
static int s_userns = -1;    /* S, owned by this agent, which lives in S's parent */

/* Write all n bytes of p (a write that EINTR stops is retried): 0, or -1 with errno set. */
static int write_all(int fd, const void *p, size_t n) {
    for (size_t off = 0; off < n;) {
        ssize_t w = write(fd, (const char *)p + off, n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            if (w == 0) errno = EIO;
            return -1;
        }
        off += (size_t)w;
    }
    return 0;
}

static int write_str(const char *path, const char *v) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = (ssize_t)strlen(v), w = write(fd, v, n);
    int e = errno;
    close(fd);
    errno = e;
    return w == n ? 0 : -1;
}

/* A new user namespace whose uids and gids inner..inner+count-1 map onto base.. of ours,
 * made by a child that unshares (as `owner`, if >= 0: that uid owns it, and the kernel
 * charges the namespace and everything made inside it to that uid, not to us) and waits
 * until we have written its maps; returns an fd to it, or -1 with errno set. The child ends
 * when we close its pipe (after a uid change we may not be allowed to signal it). */
static int new_userns_at(long inner, long base, long count, long owner, int keep_root) {
    int p[2], q[2]; /* p: the child says it unshared; q: closed by us when done with it */
    if (pipe2(p, O_CLOEXEC) < 0) return -1;
    if (pipe2(q, O_CLOEXEC) < 0) { int e = errno; close(p[0]); close(p[1]); errno = e; return -1; }
    pid_t c = fork();
    if (c < 0) return -1;
    if (c == 0) {
        char x = 'x';
        close(q[1]);
        if ((owner >= 0 && (setgroups(0, NULL) < 0 || setresgid(owner, owner, owner) < 0 ||
                            setresuid(owner, owner, owner) < 0)) || unshare(CLONE_NEWUSER) < 0)
            x = 'e';
        if (write(p[1], &x, 1) != 1) _exit(1);
        while (read(q[0], &x, 1) < 0 && errno == EINTR) {}
        _exit(0);
    }
    close(q[0]);
    close(p[1]);
    char x = 0;
    ssize_t k;
    while ((k = read(p[0], &x, 1)) < 0 && errno == EINTR) {}
    close(p[0]);
    int fd = -1, ok = k == 1 && x == 'x';
    if (ok) {
        char path[64], map[96];
        snprintf(map, sizeof map, "%s%ld %ld %ld\n", keep_root ? "0 0 1\n" : "", inner, base, count);
        snprintf(path, sizeof path, "/proc/%d/uid_map", (int)c);
        ok = write_str(path, map) == 0;
        snprintf(path, sizeof path, "/proc/%d/gid_map", (int)c);
        ok = ok && write_str(path, map) == 0;
        snprintf(path, sizeof path, "/proc/%d/ns/user", (int)c);
        if (ok) fd = open(path, O_RDONLY | O_CLOEXEC);
    } else {
        errno = EPERM;
    }
    int e = errno;
    close(q[1]);
    waitpid(c, NULL, 0);
    errno = e;
    return fd;
}

static int new_userns(long base, long count, long owner) { return new_userns_at(0, base, count, owner, 0); }

/* Make S (uids 0..65535 onto ours, owned by GUEST_UID), then become GUEST_UID: no
 * capability anywhere, not dumpable, owner of S (so the children we fork can enter it and
 * take any of its users), and with nothing of the launcher's environment. Runs once, as
 * root of our namespace. */
static int isolate(void) {
    s_userns = new_userns(0, SANDBOX_UIDS, GUEST_UID);
    if (s_userns < 0) {
        perror("sandfleet-agent: make the commands' user namespace");
        return -1;
    }
    if (setgroups(0, NULL) < 0 || setresgid(GUEST_UID, GUEST_UID, GUEST_UID) < 0 ||
        setresuid(GUEST_UID, GUEST_UID, GUEST_UID) < 0) {
        perror("sandfleet-agent: drop to the agent's uid");
        return -1;
    }
    prctl(PR_SET_DUMPABLE, 0);
    clearenv();
    isolated = 1;
    return 0;
}

/* A user name (from the sandbox's /etc/passwd, else root/agent/verifier) or number. The
 * last answers are kept while /etc/passwd is unchanged (same inode, size and mtime): every
 * command names its user, and reading the file each time is a cost on every exec. */
static int lookup_passwd(const char *name, int numeric, long v, uid_t *uid, gid_t *gid) {
    FILE *f = fopen("/etc/passwd", "re");
    if (!f) return -1;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        char *fields[4] = {0};
        char *q = line;
        for (int i = 0; i < 4 && q; i++) {
            fields[i] = q;
            q = strchr(q, ':');
            if (q) *q++ = 0;
        }
        if (!fields[3]) continue;
        long u = strtol(fields[2], NULL, 10), g = strtol(fields[3], NULL, 10);
        if ((numeric && u == v) || (!numeric && !strcmp(fields[0], name))) {
            fclose(f);
            if (u < 0 || u >= SANDBOX_UIDS || g < 0 || g >= SANDBOX_UIDS) return -1;
            *uid = (uid_t)u; *gid = (gid_t)g;
            return 0;
        }
    }
    fclose(f);
    return -1;
}

static struct { char name[40]; uid_t uid; gid_t gid; int ok; } user_cache[16];
static struct stat passwd_seen;

static int resolve_user(const char *name, uid_t *uid, gid_t *gid) {
    char *end;
    if (!name || !*name || strlen(name) >= sizeof user_cache[0].name) return -1;
    struct stat st;
    int have = stat("/etc/passwd", &st) == 0;
    if (!have || st.st_ino != passwd_seen.st_ino || st.st_dev != passwd_seen.st_dev ||
        st.st_size != passwd_seen.st_size || st.st_mtim.tv_sec != passwd_seen.st_mtim.tv_sec ||
        st.st_mtim.tv_nsec != passwd_seen.st_mtim.tv_nsec) {
        memset(user_cache, 0, sizeof user_cache);
        if (have) passwd_seen = st; else memset(&passwd_seen, 0, sizeof passwd_seen);
    }
    size_t slot = 0;
    for (size_t i = 0; i < sizeof user_cache / sizeof *user_cache; i++) {
        if (user_cache[i].name[0] && !strcmp(user_cache[i].name, name)) {
            if (!user_cache[i].ok) return -1;
            *uid = user_cache[i].uid; *gid = user_cache[i].gid;
            return 0;
        }
        if (!user_cache[i].name[0]) slot = i;
    }
    long v = strtol(name, &end, 10);
    int numeric = *end == 0, rc = lookup_passwd(name, numeric, v, uid, gid);
    if (rc < 0 && numeric && v >= 0 && v < SANDBOX_UIDS) {
        *uid = (uid_t)v; *gid = (gid_t)v;
        rc = 0;
    }
    static const struct { const char *n; int id; } builtin[] = {{"root", 0}, {"agent", 1000}, {"verifier", 1001}};
    for (size_t i = 0; rc < 0 && !numeric && i < sizeof builtin / sizeof *builtin; i++)
        if (!strcmp(name, builtin[i].n)) { *uid = *gid = builtin[i].id; rc = 0; }
    snprintf(user_cache[slot].name, sizeof user_cache[slot].name, "%s", name);
    user_cache[slot].ok = rc == 0;
    if (rc == 0) { user_cache[slot].uid = *uid; user_cache[slot].gid = *gid; }
    return rc;
}

/* In a forked child: enter S (with every capability there, and only there), then take
 * uid/gid in it (root of S keeps its capabilities; any other user loses them at exec). */
static int enter_s(void) {
    if (!isolated) {
        /* A microVM's agent is the guest's PID 1 and root, and so are its commands (no user
         * switching there yet): at least they can't ptrace it, or read its memory. */
        if (getppid() == 1 && geteuid() == 0) prctl(PR_CAPBSET_DROP, CAP_SYS_PTRACE, 0, 0, 0);
        return 0;
    }
    if (s_userns < 0) return 0; /* --switch-users: the sandbox's kernel (gVisor) is the boundary */
    return setns(s_userns, CLONE_NEWUSER);
}
static int take_user(uid_t uid, gid_t gid) {
    if (!isolated) return 0;
    if (setgroups(0, NULL) < 0 || setresgid(gid, gid, gid) < 0 || setresuid(uid, uid, uid) < 0) return -1;
    if (uid != 0) {
        /* Entering S gave us every capability in it, and setresuid keeps them: our old uid
         * (GUEST_UID) is not 0 in S, so the kernel's "leaving root clears capabilities" rule
         * does not apply. A command loses them at execve, but a file opened here for READ or
         * WRITE (open_as) would be opened with CAP_DAC_OVERRIDE: drop them all, so the
         * user's own permissions decide (a write as a user into /root is denied). */
        struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
        struct __user_cap_data_struct d[2];
        memset(d, 0, sizeof d);
        if (syscall(SYS_capset, &h, d) < 0) return -1;
    }
    return 0;
}
static int become(uid_t uid, gid_t gid) { return enter_s() < 0 ? -1 : take_user(uid, gid); }

/* ---------- the commands' confinement (docs/security.md, "Syscall filter") ---------- */
/* The seccomp program the host sent in HELLO (compiled by libseccomp on the host from
 * sandfleet/sandbox/seccomp.py's profile); none: commands run unfiltered. */
static struct sock_filter *filter;
static unsigned short filter_len;

static const char *set_filter(const fld_t *f) {
    if (!f->len || f->len % sizeof *filter || f->len / sizeof *filter > BPF_MAXINSNS) return "not a BPF program";
    if (prctl(PR_GET_SECCOMP, 0, 0, 0, 0) < 0) return "this kernel has no seccomp (CONFIG_SECCOMP)";
    free(filter);
    filter = xmalloc(f->len);
    memcpy(filter, f->data, f->len);
    filter_len = (unsigned short)(f->len / sizeof *filter);
    return NULL;
}

/* The loopback of a new network namespace, up (the kernel gives it 127.0.0.1 and ::1 then);
 * -1 with errno set where the interface ioctls fail. */
static int loopback_up(void) {
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    strcpy(ifr.ifr_name, "lo");
    int rc = ioctl(fd, SIOCGIFFLAGS, &ifr);
    if (rc == 0 && !(ifr.ifr_flags & IFF_UP)) {
        ifr.ifr_flags |= IFF_UP;
        rc = ioctl(fd, SIOCSIFFLAGS, &ifr);
    }
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

/* In a command's child, inside S and before it takes its user: a pid namespace for its
 * children and a mount namespace of its own when asked (the command then runs as the pid
 * namespace's first process, start_exec, over a /proc of its own, own_proc), and a network
 * namespace of its own when asked (only a loopback, up: the verifier's no-network). */
/* A command's pid namespace gets a /proc of its own (in a mount namespace of its own) where we
 * may mount one: in S, or as the machine's root (microvm); not under gVisor's --switch-users. */
static int pidns_proc(void) { return s_userns >= 0 || !isolated; }

static int confine_ns(int no_network, int own_pidns, const char **what) {
    if (own_pidns) {
        *what = "make a pid and a mount namespace";
        if (unshare(CLONE_NEWPID | (pidns_proc() ? CLONE_NEWNS : 0)) < 0) return -1;
    }
    if (no_network) {
        *what = "make a network namespace";
        if (unshare(CLONE_NEWNET) < 0) return -1;
        *what = "bring up the loopback";
        /* gVisor (--switch-users) has no interface ioctls; its new namespace's loopback is up */
        if (loopback_up() < 0 && !(errno == ENOTTY && s_userns < 0)) return -1;
    }
    return 0;
}

/* Then the filter, which forbids the namespace and mount steps to what runs after. Loading
 * it needs CAP_SYS_ADMIN in our namespace, which entering S gave (no no_new_privs: setuid
 * programs in the image keep working). */
/* The seal of the verifier's test command (an exec asked with its own pid namespace), stacked
 * on the filter above and installed even when that one is off (docs/security.md, "Reward
 * integrity", the seal): no process of the tests reaches into another (ptrace,
 * process_vm_readv/writev: the test script's memory, its registers), changes another's limits
 * (prlimit64 with a pid: the test script's open-file limit, so that its reward write fails), or
 * signals every process it may at once (kill(-1)); another arch's entry points fail (ENOSYS).
 * Written by hand: it must hold on every backend and with the default filter opted out of. */
#if defined(__x86_64__)
#define SEAL_ARCH AUDIT_ARCH_X86_64
#define SEAL_FOREIGN_NR 0x40000000u /* x32 */
#elif defined(__aarch64__)
#define SEAL_ARCH AUDIT_ARCH_AARCH64
#define SEAL_FOREIGN_NR 0xffffffffu
#else
#error "the verifier's seal knows x86_64 and aarch64"
#endif
#define SEAL_ARG0 (offsetof(struct seccomp_data, args[0])) /* its low 32 bits (little-endian) */
static struct sock_filter seal[] = {
    /*  0 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
    /*  1 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SEAL_ARCH, 1, 0),
    /*  2 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
    /*  3 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
    /*  4 */ BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, SEAL_FOREIGN_NR, 0, 1),
    /*  5 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
    /*  6 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_ptrace, 11, 0),
    /*  7 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_readv, 10, 0),
    /*  8 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_writev, 9, 0),
    /*  9 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_kill, 2, 0),
    /* 10 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_prlimit64, 4, 0),
    /* 11 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    /* 12 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, SEAL_ARG0), /* kill(pid, ...) */
    /* 13 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0xffffffffu, 4, 0),
    /* 14 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    /* 15 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, SEAL_ARG0), /* prlimit64(pid, ...) */
    /* 16 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 1),
    /* 17 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    /* 18 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
};

static int confine_filter(int sealed, const char **what) {
    if (filter_len) {
        *what = "install the seccomp filter";
        struct sock_fprog prog = {filter_len, filter};
        if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) < 0) return -1;
    }
    if (sealed) {
        *what = "install the verifier's seal";
        struct sock_fprog prog = {(unsigned short)(sizeof seal / sizeof *seal), seal};
        if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) < 0) return -1;
    }
    return 0;
}

/* In the first process of a command's own pid namespace (in its own mount namespace, as
 * root of S): a procfs of that pid namespace on /proc, over the sandbox's. The command then
 * sees itself and its own processes there, at the pids it knows (/proc/self, /proc/1 is the
 * command, ps, pgrep, psutil), and nothing of the agent's or the sandbox's other processes;
 * /proc/self/fd and /dev/fd, /dev/stdin... follow. procfs mounts with the old one's flags.
 * The kernel allows a proc mount in a user namespace only while a proc mount already there
 * has no locked mount over a non-empty folder (mount_too_revealing: bwrap's --proc adds no
 * cover here, as the sandbox's root may not write /proc/sys). No mount event goes back to
 * the sandbox: /proc is made private first (a shared one would be a slave already where S is
 * less privileged than the sandbox's namespace; gVisor has no MS_SLAVE or MS_REC here, and
 * --switch-users keeps one user namespace). The new /proc is not
 * locked: a command that is root of S could unmount it, but the seccomp filter forbids
 * umount, and it would only find the sandbox's /proc, which its other commands see.
 * Not under --switch-users: in gVisor a proc mounted so landed in the sandbox's own mount
 * table (one more over /proc after each such command); there /proc stays the sandbox's. */
static int own_proc(const char **what) {
    *what = "make /proc private in the command's mount namespace";
    if (mount(NULL, "/proc", NULL, MS_PRIVATE, NULL) < 0) return -1;
    *what = "mount a /proc of the command's pid namespace";
    return mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
}

/* ---------- a cgroup per command (when the launcher delegated one to us) ---------- */
/* A (single-threaded) process joins a cgroup by writing "0" (itself). On cgroup v1 it
 * writes to `tasks`, not `cgroup.procs`: a thread moving itself is the one migration the
 * kernel makes without write-locking the global cgroup_threadgroup_rwsem, whose first
 * writer after a quiet spell waits out an RCU grace period (0.5-18 ms on a loaded host, on
 * every command's first start). With one thread, moving the thread moves the process, and
 * everything it starts after is born inside. The launcher's --cgroup does the same. */
static char cg_dir[256];     /* the sandbox's cgroup as we see it; empty = none */
static int cg_v2 = 0;
static int cg_tasks = 0;     /* v1: the group has a `tasks` file (v2 has none, with or without cgroup.kill) */
/* Groups are made once and reused: "e<slot>" is free again once its processes are gone
 * (a mkdir and rmdir per command would cost more than the command's own start). */
typedef struct { uint32_t id; uid_t uid; int used, made, capped; } group_t;
#define NGROUPS 4096
static group_t groups[NGROUPS];
static int ngroups_used;

static void group_path(int g, char *out, size_t n) {
    snprintf(out, n, "%s/e%d", cg_dir, g);
}
static int group_file(int g, const char *name, const char *value) {
    char f[340];
    group_path(g, f, sizeof f - 32);
    strcat(f, "/");
    strcat(f, name);
    return write_str(f, value);
}
static int group_new(uint32_t id, uid_t uid) {
    if (!cg_dir[0]) return -1;
    int g = -1;
    for (int i = 0; i < NGROUPS && g < 0; i++) if (!groups[i].used && groups[i].made) g = i;
    for (int i = 0; i < NGROUPS && g < 0; i++) if (!groups[i].used) g = i;
    if (g < 0) return -1;
    if (!groups[g].made) {
        char d[320];
        group_path(g, d, sizeof d);
        if (mkdir(d, 0700) < 0 && errno != EEXIST) return -1;
        groups[g].made = 1;
    }
    if (groups[g].capped && group_file(g, "pids.max", "max") == 0) groups[g].capped = 0;
    groups[g].id = id; groups[g].uid = uid; groups[g].used = 1;
    ngroups_used++;
    return g;
}
/* pids in a cgroup; returns how many were found (and killed, if kill_them) */
static int group_scan(int g, int kill_them) {
    char f[340];
    group_path(g, f, sizeof f - 16);
    strcat(f, "/cgroup.procs");
    int fd = open(f, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    /* read and cut by hand: stdio's buffer was an mmap and a munmap, and two fcntl, after every
       command (issue 46); whether the group is empty is its first read */
    char b[4096];
    int n = 0;
    long pid = -1;
    ssize_t k;
    while ((k = read(fd, b, sizeof b)) > 0) {
        if (!kill_them) { n = 1; break; }
        for (ssize_t i = 0; i < k; i++) {
            if (b[i] >= '0' && b[i] <= '9') pid = (pid < 0 ? 0 : pid * 10) + (b[i] - '0');
            else if (pid >= 0) { n++; kill((pid_t)pid, SIGKILL); pid = -1; }
        }
    }
    if (pid >= 0) { n++; kill((pid_t)pid, SIGKILL); }
    close(fd);
    return n;
}
static void group_kill(int g) {
    if (cg_v2 && group_file(g, "cgroup.kill", "1") == 0) return;
    if (!cg_v2 && group_file(g, "pids.max", "0") == 0) groups[g].capped = 1; /* no more forks in it */
    for (int pass = 0; pass < 4 && group_scan(g, 1); pass++) {}
}
static void group_release(int g) { /* free once empty; it stays taken while background processes live */
    if (g < 0 || !groups[g].used || group_scan(g, 0)) return;
    groups[g].used = 0;
    ngroups_used--;
}
static void groups_sweep(void) {
    if (!ngroups_used) return;
    for (int g = 0; g < NGROUPS; g++)
        if (groups[g].used) group_release(g);
}


/* ---------- pseudo-terminals (EXEC with PTY "cols rows") ---------- */
static int parse_winsize(const char *spec, struct winsize *ws) {
    unsigned cols = 0, rows = 0;
    if (!spec || sscanf(spec, "%u %u", &cols, &rows) != 2 || !cols || !rows || cols > 65535 || rows > 65535)
        return -1;
    memset(ws, 0, sizeof *ws);
    ws->ws_col = (unsigned short)cols;
    ws->ws_row = (unsigned short)rows;
    return 0;
}

/* A new pty pair: the master (ours) and its peer (the command's terminal), both opened here,
 * by the agent, so the command needs no right to /dev/pts whatever user it runs as. */
static int open_pty(const struct winsize *ws, int *master, int *peer) {
    int m = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (m < 0) return -1;
    int unlock = 0;
    if (ioctl(m, TIOCSPTLCK, &unlock) < 0) { int e = errno; close(m); errno = e; return -1; }
    int s = -1;
#ifdef TIOCGPTPEER
    s = ioctl(m, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
#endif
    if (s < 0) {
        int n = 0;
        char path[64];
        if (ioctl(m, TIOCGPTN, &n) < 0) { int e = errno; close(m); errno = e; return -1; }
        snprintf(path, sizeof path, "/dev/pts/%d", n);
        s = open(path, O_RDWR | O_NOCTTY | O_CLOEXEC);
        if (s < 0) { int e = errno; close(m); errno = e; return -1; }
    }
    ioctl(m, TIOCSWINSZ, ws);
    *master = m;
    *peer = s;
    return 0;
}

static job_t *find_job(uint32_t id);

static void do_resize(const req_t *r) {
    job_t *j = find_job((uint32_t)get_int(r, F_TARGET, 0));
    char *spec = get_str(r, F_PTY);
    struct winsize ws;
    if (parse_winsize(spec, &ws) < 0) send_error(r->id, "ProtocolError", 0, "RESIZE needs PTY \"cols rows\"");
    else if (!j || j->exited) send_error(r->id, "ProcessLookupError", ESRCH, "no such running command");
    else if (j->pty < 0) send_error(r->id, "ExecError", ENOTTY, "the command has no terminal");
    else if (ioctl(j->pty, TIOCSWINSZ, &ws) < 0)
        send_error(r->id, errno_type(errno), errno, "resize: %s", strerror(errno));
    else { frame_begin(R_DONE, r->id); frame_send(); }
    free(spec);
}


/* Close every descriptor (a process that won't exec, so O_CLOEXEC does nothing for it):
 * close_range, else those /proc/self/fd lists (gVisor 20221219 has no close_range, and a
 * close per possible descriptor there took longer than a command's timeout). */
static void close_all(void) {
#ifdef SYS_close_range
    if (syscall(SYS_close_range, 0, ~0U, 0) == 0) return;
#endif
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)))
            if (e->d_name[0] != '.' && atoi(e->d_name) != dirfd(d)) close(atoi(e->d_name));
        closedir(d);
        return;
    }
    long n = sysconf(_SC_OPEN_MAX);
    if (n < 0 || n > 1 << 16) n = 1 << 16;
    for (long fd = 0; fd < n; fd++) close((int)fd);
}

/* execvp(file, argv) as musl's, over environ's PATH, but each directory's candidate is first
 * asked with access(): a failed execve allocates and frees a whole new address space before its
 * lookup fails (about 13 us each here, under the command filter), and `true` or `bash` by name was
 * three failed ones first on a Debian PATH (issue 46). Where access() says anything but "not
 * there" (ENOENT, ENOTDIR), execve is tried as execvp would, so what runs and every error are
 * execvp's. */
static int exec_search(const char *file, char *const argv[]) {
    if (!*file) { errno = ENOENT; return -1; }
    if (strchr(file, '/')) return execv(file, argv);
    const char *path = getenv("PATH");
    if (!path) path = "/usr/local/bin:/bin:/usr/bin";
    size_t k = strnlen(file, NAME_MAX + 1);
    if (k > NAME_MAX) { errno = ENAMETOOLONG; return -1; }
    size_t l = strnlen(path, PATH_MAX - 1) + 1;
    int seen_eacces = 0;
    for (const char *p = path, *z;; p = z) {
        char b[l + k + 1];
        z = strchrnul(p, ':');
        if ((size_t)(z - p) >= l) {
            if (!*z++) break;
            continue;
        }
        memcpy(b, p, (size_t)(z - p));
        b[z - p] = '/';
        memcpy(b + (z - p) + (z > p), file, k + 1);
        if (access(b, X_OK) == 0 || (errno != ENOENT && errno != ENOTDIR)) execv(b, argv);
        switch (errno) {
        case EACCES: seen_eacces = 1; /* fall through */
        case ENOENT:
        case ENOTDIR: break;
        default: return -1;
        }
        if (!*z++) break;
    }
    if (seen_eacces) errno = EACCES;
    return -1;
}

/* A command's child could not start it: errno and the step it failed at (none: taking its
 * user) go to the agent on the status pipe, and the child ends. */
static void start_failed(int fd, const char *what, const char *user) {
    int e = errno;
    char m[600];
    if (what) snprintf(m, sizeof m, "%d %s: %s", e, what, strerror(e));
    else snprintf(m, sizeof m, "%d switch to user %s: %s", e, user ? user : "?", strerror(e));
    if (write(fd, m, strlen(m)) < 0) {}
    _exit(127);
}

/* ---------- the warden of the verifier's tests (docs/security.md, "Reward integrity III") ----------
 * A sealed command in a pid namespace of its own runs as pid 2 under this warden, pid 1: every
 * process of the tests whose parent exits while the tests run (a daemon of the code under test:
 * fork and exit, setsid, a double fork) is re-parented to it, as the namespace's init. It counts
 * them: those that end before the command (it reaps them), and those still there when the
 * command ends that were not the command's own children the last time it looked (every 10 ms:
 * the command's background jobs come to it too as the command exits). At the command's end it
 * stops every process left (SIGSTOP: nothing changes while it looks, nothing writes after), and
 * when it exits, the kernel kills them all before the command's end is reported. It reports the
 * command's wait status and the count on REPORT ("STATUS DETACHED\n"), and exits with the
 * command's code (a namespace's init can't raise a signal on itself). */
static long proc_self_pid(void) {
    char b[32];
    ssize_t k = readlink("/proc/self", b, sizeof b - 1);
    if (k <= 0) return -1;
    b[k] = 0;
    return atol(b);
}

/* /proc/PID/stat's ppid, or -1 */
static long proc_ppid(const char *pid, char *state) {
    char path[300], st[512];
    snprintf(path, sizeof path, "/proc/%s/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t k = read(fd, st, sizeof st - 1);
    close(fd);
    if (k <= 0) return -1;
    st[k] = 0;
    char *rp = strrchr(st, ')');
    long ppid;
    if (!rp || sscanf(rp + 2, "%c %ld", state, &ppid) != 2) return -1;
    return ppid;
}

#define WARDEN_MAX 4096
static long warden_seen[WARDEN_MAX], warden_kids[WARDEN_MAX]; /* /proc's pids */
/* processes seen dead (zombies) while the process that started them still lived: one that comes
 * to us after it ended did not outlive its parent (a grader that forks and never reaps) */
static long warden_dead[WARDEN_MAX];
/* where /proc's pids are not the namespace's (gVisor), what waitpid reaps can't be named by its
 * /proc pid: a scan just before it counts the ended processes that came to us and are not
 * detached (the command's own, or seen dead while their parent lived), and the reaps take those */
static long warden_claimed[WARDEN_MAX];
static int warden_nseen, warden_nkids, warden_ndead, warden_nclaimed, warden_claims, warden_detached;

static int warden_has(const long *set, int n, long pid) {
    for (int i = 0; i < n; i++) if (set[i] == pid) return 1;
    return 0;
}

static void warden_note(long pid) {
    if (warden_has(warden_seen, warden_nseen, pid)) return;
    if (warden_nseen < WARDEN_MAX) warden_seen[warden_nseen++] = pid;
    warden_detached++;
}

/* Our children that were never the command's own are detached (while it runs, and at its end);
 * the command's own children are noted while it runs. */
static void warden_scan(long me, long cmd, int at_end) {
    DIR *d = opendir("/proc");
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        long pid = atol(e->d_name);
        if (pid == cmd || pid == me) continue;
        char state = 0;
        long ppid = proc_ppid(e->d_name, &state);
        if (state == 'Z' && ppid != me && ppid > 0 && !warden_has(warden_dead, warden_ndead, pid) &&
            warden_ndead < WARDEN_MAX)
            warden_dead[warden_ndead++] = pid;
        else if (state != 'Z') /* alive: a pid used again is a new process, never one seen dead */
            for (int i = 0; i < warden_ndead; i++)
                if (warden_dead[i] == pid) warden_dead[i] = warden_dead[--warden_ndead];
        /* (one of the command's own that is ours now: the command exited since we last waited,
           between that wait and this scan, and its background jobs came to us -- not detached) */
        int dead_before = state == 'Z' && warden_has(warden_dead, warden_ndead, pid);
        if (ppid == me && !warden_has(warden_kids, warden_nkids, pid) && !dead_before)
            warden_note(pid);
        else if (ppid == me && state == 'Z' && !pidns_proc() && !warden_has(warden_claimed, warden_nclaimed, pid) &&
                 warden_nclaimed < WARDEN_MAX) {
            warden_claimed[warden_nclaimed++] = pid;
            warden_claims++;
        }
        else if (ppid == cmd && cmd > 0 && !at_end && !warden_has(warden_kids, warden_nkids, pid) &&
                 warden_nkids < WARDEN_MAX)
            warden_kids[warden_nkids++] = pid;
    }
    closedir(d);
}

/* Fork the command: returns in it (pid 2); the warden itself never returns. */
static void warden(int report, int pst_w, const char *user) {
    int cp[2];
    if (pipe2(cp, O_CLOEXEC) < 0) start_failed(pst_w, "warden pipe", user);
    pid_t cmd = fork();
    if (cmd < 0) start_failed(pst_w, "fork the tests under their warden", user);
    if (cmd == 0) { /* the command tells its pid as /proc shows it (gVisor: the sandbox's /proc) */
        close(cp[0]);
        close(report);
        char b[32];
        int n = snprintf(b, sizeof b, "%ld", proc_self_pid());
        if (write(cp[1], b, n) < 0) {}
        close(cp[1]);
        return;
    }
    close(cp[1]);
    prctl(PR_SET_NAME, "sandfleet-init"); /* what the tests' /proc shows as their pid 1 */
    char b[32] = "";
    ssize_t k;
    while ((k = read(cp[0], b, sizeof b - 1)) < 0 && errno == EINTR) {}
    close(cp[0]);
    b[k > 0 ? k : 0] = 0;
    long me = proc_self_pid(), cmd_p = k > 0 ? atol(b) : -1;
    /* nothing of the command's stays open here (its pipes: EOF once it and its own are done) */
    int closed = 0;
#ifdef SYS_close_range
    closed = syscall(SYS_close_range, 0, report - 1, 0) == 0 && syscall(SYS_close_range, report + 1, ~0U, 0) == 0;
#endif
    if (!closed) { /* no close_range (gVisor's): every fd /proc lists, but REPORT */
        DIR *d = opendir("/proc/self/fd");
        if (d) {
            int fds[4096], n = 0;
            struct dirent *e;
            while ((e = readdir(d)) && n < 4096)
                if (e->d_name[0] >= '0' && e->d_name[0] <= '9') fds[n++] = atoi(e->d_name);
            closedir(d);
            for (int i = 0; i < n; i++) if (fds[i] != report) close(fds[i]);
        } else {
            long max = sysconf(_SC_OPEN_MAX);
            if (max < 0 || max > 1 << 16) max = 1 << 16;
            for (long fd = 0; fd < max; fd++) if (fd != report) close((int)fd);
        }
    }
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    int st = 0, done = 0;
    while (!done) {
        int w;
        pid_t p;
        if (me > 0 && !pidns_proc()) warden_scan(me, cmd_p, 0); /* what the reaps below take (gVisor) */
        while (!done && (p = waitpid(-1, &w, WNOHANG)) > 0) {
            if (p == cmd) { st = w; done = 1; }
            /* an orphan that ended (not a background job of the command's, ending as it ended,
               and not one that ended while its parent lived) */
            else if (pidns_proc() ? !(warden_has(warden_kids, warden_nkids, (long)p) ||
                                      warden_has(warden_dead, warden_ndead, (long)p))
                                  : warden_claims-- <= 0)
                warden_note((long)p);
        }
        if (warden_claims < 0) warden_claims = 0;
        if (done) break;
        if (me > 0) warden_scan(me, cmd_p, 0);
        struct timespec ts = {0, 10 * 1000 * 1000};
        sigtimedwait(&chld, NULL, &ts);
    }
    kill(-1, SIGSTOP); /* all but us: nothing left writes, or leaves, while we look */
    if (me > 0) warden_scan(me, cmd_p, 1);
    char m[64];
    int n = snprintf(m, sizeof m, "%d %d\n", st, warden_detached);
    if (write(report, m, n) < 0) {}
    _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0));
}

/* The command's environment with --preload's library last in LD_PRELOAD (after the verifier's
 * seal, which must come first: statcompat.c exports statx, an ASan runtime wants to be first).
 * In the forked child, just before exec: nothing to free. */
static char **with_preload(char **envp) {
    if (!g_preload) return envp;
    size_t n = 0, at = (size_t)-1;
    for (; envp[n]; n++)
        if (!strncmp(envp[n], "LD_PRELOAD=", 11)) at = n;
    char **out = calloc(n + 2, sizeof *out);
    size_t len = strlen(g_preload) + (at != (size_t)-1 ? strlen(envp[at]) : 11) + 2;
    char *v = malloc(len);
    if (!out || !v) return envp;
    memcpy(out, envp, n * sizeof *out);
    if (at == (size_t)-1) {
        snprintf(v, len, "LD_PRELOAD=%s", g_preload);
        out[n] = v;
    } else {
        snprintf(v, len, "%s%s%s", envp[at], envp[at][11] ? " " : "", g_preload);
        out[at] = v;
    }
    return out;
}

/* ---------- the command zygote (docs/security.md, "Syscall filter") ----------
 * Installing the seccomp program costs every command's child more than its fork (the kernel
 * checks, converts and JIT-compiles it, and fills its action cache, on each install). So a plain
 * command (not the verifier's sealed tests, not one without network: those keep the path below,
 * whose namespace steps must come before the filter; nor under gVisor, see start_exec; nor a
 * request over ZYG_MAX) is forked from a process that already has
 * it: the zygote, forked from us once per sandbox (at the first such command), which entered S
 * and installed the filter exactly as a command's child does, and then only forks. Each command
 * is its child made with CLONE_PARENT, so it is ours (we reap it, as any command) and inherits
 * the filter, and with CLONE_VM | CLONE_VFORK, as posix_spawn makes one: it runs in the zygote's
 * memory, on a stack of its own, until its exec (no page tables copied; the zygote waits, and
 * prepares everything the child reads before the clone; an agent's helper, which runs in the
 * command's process without an exec, is forked instead). The child then does what a command's
 * child does after the filter: joins its cgroup, takes
 * its user (every capability dropped), setsid, default signals, its stdio, cwd, exec. The zygote
 * is not dumpable and its memory belongs to our user namespace (no command may ptrace it or read
 * it), it holds nothing but its socket to us, and it has our uid (kill_user never picks it). Root
 * of S may still signal it (it is in S): a zygote that dies is seen here (reap, or its socket),
 * one found stopped after ZYG_WAIT_MS is killed (one only slow is waited for, up to a minute);
 * the next command starts a new one.
 * What the agent sends: the EXEC's argv, env, cwd and user fields, and Z_* fields below; the
 * descriptors (SCM_RIGHTS): the status pipe's write end, then stdin, stdout, stderr (or the
 * terminal). The reply: the command's pid (> 0), or 0 and the errno of the clone. */
static int parse_frame(const unsigned char *p, uint32_t len, req_t *r);

enum { Z_UID = 200, Z_GID = 201, Z_PROCS = 202, Z_PTY = 203 };
#define ZYG_MAX (60 * 1024) /* a bigger request (a large environment) takes the path below */
#define ZYG_WAIT_MS 2000
static int zyg_fd = -1;       /* our end of the zygote's socket, or -1 */
static pid_t zyg_pid = -1;
static int zyg_failures;      /* zygotes that failed to start: after 3, commands take the path below */
/* A page the zygote shares with us (MAP_SHARED, made before its fork): its clone writes the new
 * child's pid there (CLONE_PARENT_SETTID) before the child runs. A child stopped before its exec
 * (by root of S, which may signal it: it is in S) holds the zygote in its vfork; we see that
 * child here and kill it, and the command ends killed (SIGKILL) instead of every command
 * waiting on the zygote for a minute. And a zygote that dies or stops after its clone but
 * before its reply (the command killed it: it runs again only once the command exec'd) has
 * still told us the command's pid. */
static volatile pid_t *zyg_child;

static void zygote_drop(void) { /* the zygote is done with (it is reaped as any child of ours) */
    if (zyg_fd >= 0) close(zyg_fd);
    if (zyg_pid > 0) kill(zyg_pid, SIGKILL);
    zyg_fd = -1;
    zyg_pid = -1;
}

/* Close every descriptor from LOWEST on but KEEP (-1: none kept): close_range, else what
 * /proc/self/fd lists (gVisor has no close_range). */
static void close_from(int lowest, int keep) {
#ifdef SYS_close_range
    if (keep < lowest ? syscall(SYS_close_range, lowest, ~0U, 0) == 0
                      : (keep == lowest || syscall(SYS_close_range, lowest, keep - 1, 0) == 0) &&
                            syscall(SYS_close_range, keep + 1, ~0U, 0) == 0)
        return;
#endif
    DIR *d = opendir("/proc/self/fd");
    if (!d) return;
    int fds[4096], n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 4096) {
        int fd = atoi(e->d_name);
        if (e->d_name[0] >= '0' && e->d_name[0] <= '9' && fd >= lowest && fd != keep && fd != dirfd(d)) fds[n++] = fd;
    }
    closedir(d);
    for (int i = 0; i < n; i++) close(fds[i]);
}

/* The path this agent was started by (its argv[0] in the sandbox). A command whose argv[0] is that
 * path and whose argv[1] names one of its helpers (prepare, untar, stat) runs that helper in the
 * command's own process, from this agent's image: nothing is exec'd, so a file put at the path
 * since (by a root agent on microvm, where the path is writable) is never run. */
static const char *self_path;
typedef int (*helper_fn)(int argc, char **argv);
static helper_fn helper_of(int argc, char **argv);
static void run_helper(char **argv, int status_fd) {
    int argc = 0;
    while (argv[argc]) argc++;
    helper_fn fn = self_path && argc > 1 && !strcmp(argv[0], self_path) ? helper_of(argc, argv) : NULL;
    if (!fn) return;
    close(status_fd); /* started: as the exec would have closed it */
    /* what an exec would close (the agent's, close-on-exec: the write end of this command's own
       stdin among them, without which its stdin never ends) */
    close_from(3, -1);
    int rc = fn(argc - 2, argv + 2);
    fflush(stdout);
    _exit(rc);
}

/* A command of the zygote, made ready in the zygote before its clone: the child shares the
 * zygote's memory (CLONE_VM | CLONE_VFORK, as posix_spawn does), so it allocates nothing and
 * changes nothing of the zygote's but its own stack. */
typedef struct {
    char **argv, **envp, *cwd, *user, *procs;
    int pty, nfd, fd[4], helper;
    uid_t uid;
    gid_t gid;
} zcmd_t;

/* In the zygote's child (a command): what start_exec's child does once its filter is installed,
 * in raw system calls (libc's setresuid may walk the threads, which are the zygote's here). */
static int zygote_child(void *arg) {
    const zcmd_t *c = arg;
    int st = c->fd[0];
    char m[600];
    if (c->procs && c->procs[0]) {
        int fd = open(c->procs, O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, "0", 1) != 1) {
            int e = errno;
            snprintf(m, sizeof m, "%d join the command's cgroup: %s", e, strerror(e));
            if (write(st, m, strlen(m)) < 0) {}
            _exit(127);
        }
        close(fd);
    }
    if (isolated) {
        if (syscall(SYS_setgroups, 0, NULL) < 0 || syscall(SYS_setresgid, c->gid, c->gid, c->gid) < 0 ||
            syscall(SYS_setresuid, c->uid, c->uid, c->uid) < 0)
            start_failed(st, NULL, c->user);
        if (c->uid != 0) {
            struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
            struct __user_cap_data_struct d[2];
            memset(d, 0, sizeof d);
            if (syscall(SYS_capset, &h, d) < 0) start_failed(st, NULL, c->user);
        }
    }
    syscall(SYS_setsid); /* (every signal at its default action and none blocked: the zygote's, inherited) */
    if (c->pty) {
        ioctl(c->fd[1], TIOCSCTTY, 0);
        dup2(c->fd[1], 0); dup2(c->fd[1], 1); dup2(c->fd[1], 2);
    } else {
        dup2(c->fd[1], 0); dup2(c->fd[2], 1); dup2(c->fd[3], 2);
    }
    if (c->cwd && chdir(c->cwd) < 0) {
        int e = errno;
        snprintf(m, sizeof m, "%d cwd %s: %s", e, c->cwd, strerror(e));
        if (write(st, m, strlen(m)) < 0) {}
        _exit(127);
    }
    /* execvp, as the path below: it searches the command's own PATH, which is environ's (execvpe
       takes the environment to pass, but searches the caller's PATH), and a helper reads it. The
       zygote puts its own environ back once the clone returns. */
    environ = c->envp;
    if (c->helper) run_helper(c->argv, st);
    exec_search(c->argv[0], c->argv);
    int e = errno;
    snprintf(m, sizeof m, "%d %s: %s", e, c->argv[0], strerror(e));
    if (write(st, m, strlen(m)) < 0) {}
    _exit(127);
}

/* The zygote: enter S, install the filter, say so, then fork a command for each request. */
static void zygote_main(int sock) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    prctl(PR_SET_NAME, "sandfleet-zygote");
    /* every signal to its default action and none blocked, once for all its commands (as a
       command's child does on the path below: an ignored signal survives exec); its children
       are ours, it has none of its own to hear of */
    sigset_t all;
    sigemptyset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int s = 1; s < NSIG; s++)
        if (s != SIGKILL && s != SIGSTOP) sigaction(s, &dfl, NULL);
    if (oom_protected) write_str("/proc/self/oom_score_adj", "0");
    if (enter_s() < 0) _exit(70);
    int hi = fcntl(sock, F_DUPFD_CLOEXEC, 64); /* nothing of ours open but the socket, at 64 */
    if (hi >= 0) sock = hi;
    close_from(0, sock);
    int null = open("/dev/null", O_RDWR); /* 0, 1, 2: no received descriptor lands there */
    if (null == 0) { dup2(0, 1); dup2(0, 2); }
    const char *what = NULL;
    if (confine_filter(0, &what) < 0) _exit(70);
    if (send(sock, "R", 1, MSG_NOSIGNAL) != 1) _exit(0);
    static unsigned char msg[ZYG_MAX];
    for (;;) {
        union { struct cmsghdr h; char b[CMSG_SPACE(4 * sizeof(int))]; } cb;
        struct iovec io = {msg, sizeof msg};
        struct msghdr mh = {0};
        mh.msg_iov = &io;
        mh.msg_iovlen = 1;
        mh.msg_control = cb.b;
        mh.msg_controllen = sizeof cb.b;
        ssize_t k = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) _exit(0); /* the agent is gone, or let us go */
        int fd[4], nfd = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
                for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
                    int f;
                    memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
                    if (nfd < 4) fd[nfd++] = f; else close(f);
                }
        req_t r = {0};
        long long reply[2] = {0, EPROTO};
        if (!(mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) && nfd && parse_frame(msg, (uint32_t)k, &r) == 0) {
            static char *no_env[] = {NULL};
            zcmd_t c = {0};
            c.argv = get_list(&r, F_ARGV);
            char **envp = get_list(&r, F_ENV);
            c.envp = with_preload(envp ? envp : no_env);
            c.cwd = get_str(&r, F_CWD); c.user = get_str(&r, F_USER); c.procs = get_str(&r, Z_PROCS);
            c.pty = get_int(&r, Z_PTY, 0) == 1;
            c.uid = (uid_t)get_int(&r, Z_UID, 0);
            c.gid = (gid_t)get_int(&r, Z_GID, 0);
            c.nfd = nfd;
            memcpy(c.fd, fd, sizeof fd);
            if (nfd == (c.pty ? 2 : 4) && c.argv) {
                int argc = 0;
                while (c.argv[argc]) argc++;
                long p;
                if (self_path && argc > 1 && !strcmp(c.argv[0], self_path) && helper_of(argc, c.argv)) {
                    /* a helper of ours (prepare, untar, stat) runs in the command's own process, which
                       does not exec (run_helper): a plain fork, not a child in the zygote's memory */
                    c.helper = 1;
                    p = syscall(SYS_clone, CLONE_PARENT | (zyg_child ? CLONE_PARENT_SETTID : 0) | SIGCHLD, NULL,
                                zyg_child, NULL, NULL); /* (flags, stack, parent_tid, ...: x86_64 and arm64) */
                    if (p == 0) { close(sock); zygote_child(&c); }
                } else {
                    static char stack[128 * 1024] __attribute__((aligned(16)));
                    char **own = environ; /* the child sets it, in our memory */
                    p = clone(zygote_child, stack + sizeof stack, CLONE_PARENT | CLONE_VM | CLONE_VFORK |
                              (zyg_child ? CLONE_PARENT_SETTID : 0) | SIGCHLD, &c, (pid_t *)zyg_child);
                    environ = own;
                }
                reply[0] = p > 0 ? p : 0;
                reply[1] = p > 0 ? 0 : errno;
            }
            if (c.envp != envp && c.envp != no_env) { /* with_preload's copy: its new LD_PRELOAD= and the array */
                for (size_t i = 0; c.envp[i]; i++)
                    if (!envp || c.envp[i] != envp[i]) free(c.envp[i]);
                free(c.envp);
            }
            free_list(c.argv); free_list(envp); free(c.cwd); free(c.user); free(c.procs);
        }
        free(r.f);
        for (int i = 0; i < nfd; i++) close(fd[i]);
        if (send(sock, reply, sizeof reply, MSG_NOSIGNAL) != (ssize_t)sizeof reply) _exit(0);
    }
}

/* Wait up to ZYG_WAIT_MS for the zygote's next message: 1 readable, 0 not in time, -1 error. */
static int zygote_wait(void) {
    struct pollfd p = {zyg_fd, POLLIN, 0};
    double end = now() + ZYG_WAIT_MS / 1000.0;
    for (;;) {
        int ms = (int)((end - now()) * 1000);
        int k = poll(&p, 1, ms > 0 ? ms : 0);
        if (k > 0) return 1;
        if (k == 0) return 0;
        if (errno != EINTR) return -1;
    }
}

/* Whether process PID is stopped (or gone from /proc): /proc/PID/stat's state. */
static int pid_stopped(pid_t pid) {
    char path[64], st[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 1;
    ssize_t k = read(fd, st, sizeof st - 1);
    close(fd);
    if (k <= 0) return 1;
    st[k] = 0;
    char *rp = strrchr(st, ')');
    return !rp || rp[1] != ' ' || rp[2] == 'T' || rp[2] == 't';
}
static int zygote_stopped(void) { return pid_stopped(zyg_pid); }

/* Wait until FD is readable (or hung up) while our child PID works toward it. The child is in S
 * (root of S may signal it), and one stopped before it answers would hold us here, and every
 * request behind us: found stopped after ZYG_WAIT_MS, it is killed (the read then sees its end). */
static void wait_child_answer(int fd, pid_t pid) {
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        int ready = poll(&p, 1, ZYG_WAIT_MS);
        if (ready > 0 || (ready < 0 && errno != EINTR)) return;
        if (ready == 0 && pid_stopped(pid)) kill(pid, SIGKILL);
    }
}

/* The zygote's child of this request, if it is stopped before its exec: killed (see zyg_child). */
static void zygote_unstick(void) {
    pid_t c = zyg_child ? *zyg_child : 0;
    if (c > 0 && pid_stopped(c)) kill(c, SIGKILL);
}

static int zygote_start(void) {
    int sv[2];
    if (!zyg_child) {
        void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        zyg_child = m == MAP_FAILED ? NULL : m;
    }
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) return -1;
    pid_t p = fork();
    if (p < 0) { close(sv[0]); close(sv[1]); return -1; }
    if (p == 0) { close(sv[0]); zygote_main(sv[1]); }
    close(sv[1]);
    zyg_fd = sv[0];
    zyg_pid = p;
    char c = 0;
    if (zygote_wait() != 1 || recv(zyg_fd, &c, 1, 0) != 1 || c != 'R') {
        zygote_drop();
        zyg_failures++;
        return -1;
    }
    return 0;
}

static void zfield(buf_t *b, int tag, const void *d, size_t n) {
    unsigned char h[5] = {(unsigned char)tag, (unsigned char)(n >> 24), (unsigned char)(n >> 16),
                          (unsigned char)(n >> 8), (unsigned char)n};
    buf_add(b, h, 5);
    buf_add(b, d, n);
}

#define ZYG_NOT_USED 0
#define ZYG_LOST (-1)   /* sent, then no answer: the command may have started (errno ECHILD/ETIMEDOUT) */
#define ZYG_FORK (-2)   /* the zygote's clone failed (errno: its error) */
/* Start a command through the zygote: its pid, or ZYG_NOT_USED (nothing was forked: fork it
 * ourselves), ZYG_LOST or ZYG_FORK. FD: the status pipe's write end, then the command's stdio
 * (3) or its terminal (1). */
static pid_t zygote_command(const req_t *r, const char *procs, uid_t uid, gid_t gid, const int *fd, int nfd) {
    if (zyg_pid < 0 && (zyg_failures >= 3 || zygote_start() < 0)) return ZYG_NOT_USED;
    buf_t m = {0};
    unsigned char head[5] = {0};
    buf_add(&m, head, 5);
    for (int i = 0; i < r->nf; i++)
        if (r->f[i].tag == F_ARGV || r->f[i].tag == F_ENV || r->f[i].tag == F_CWD || r->f[i].tag == F_USER)
            zfield(&m, r->f[i].tag, r->f[i].data, r->f[i].len);
    char v[32];
    zfield(&m, Z_UID, v, (size_t)snprintf(v, sizeof v, "%u", (unsigned)uid));
    zfield(&m, Z_GID, v, (size_t)snprintf(v, sizeof v, "%u", (unsigned)gid));
    if (procs[0]) zfield(&m, Z_PROCS, procs, strlen(procs));
    if (nfd == 2) zfield(&m, Z_PTY, "1", 1);
    if (m.n > ZYG_MAX) { buf_free(&m); return ZYG_NOT_USED; }
    union { struct cmsghdr h; char b[CMSG_SPACE(4 * sizeof(int))]; } cb;
    memset(&cb, 0, sizeof cb);
    struct iovec io = {m.p, m.n};
    struct msghdr mh = {0};
    mh.msg_iov = &io;
    mh.msg_iovlen = 1;
    mh.msg_control = cb.b;
    mh.msg_controllen = CMSG_SPACE((size_t)nfd * sizeof(int));
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN((size_t)nfd * sizeof(int));
    memcpy(CMSG_DATA(c), fd, (size_t)nfd * sizeof(int));
    ssize_t sent;
    if (zyg_child) *zyg_child = 0; /* this request's child, once cloned */
    while ((sent = sendmsg(zyg_fd, &mh, MSG_NOSIGNAL)) < 0 && errno == EINTR) {}
    buf_free(&m);
    if (sent != (ssize_t)io.iov_len) { zygote_drop(); return ZYG_NOT_USED; } /* not received: nothing forked */
    long long reply[2];
    /* a zygote that is only slow (a loaded host) is waited for, up to a minute; one that is
       stopped (by a command: root of S may signal it) is not */
    int w;
    double give_up = now() + 60;
    while ((w = zygote_wait()) == 0 && !zygote_stopped() && now() < give_up) zygote_unstick();
    /* the child of this request, where the zygote cloned it and then died or stopped before its
       reply (a command of its own that kills it, `kill -9 -1` as root: the zygote runs again only
       once that command has exec'd); it is ours, and its status pipe says whether it exec'd */
    pid_t cloned = zyg_child ? *zyg_child : 0;
    if (w != 1) {
        int unread = 0;
        /* stopped (or busy) before it read the request: nothing forked, ours to fork */
        if (w == 0 && ioctl(zyg_fd, SIOCOUTQ, &unread) == 0 && unread > 0) { zygote_drop(); return ZYG_NOT_USED; }
        zygote_drop();
        if (cloned > 0) return cloned;
        errno = ETIMEDOUT;
        return ZYG_LOST;
    }
    ssize_t k;
    while ((k = recv(zyg_fd, reply, sizeof reply, 0)) < 0 && errno == EINTR) {}
    if (k != (ssize_t)sizeof reply) {
        int gone = k == 0 || (k < 0 && errno == ECONNRESET); /* (ECONNRESET: it died with our request unread) */
        zygote_drop();
        if ((cloned = zyg_child ? *zyg_child : 0) > 0) return cloned;
        /* the zygote is gone (its end closed: killed by a root command's `kill -9 -1`, between our
           SIGCHLD and its reap) and cloned nothing for this request (its clone writes the child's pid
           here before the child runs, and fails once the zygote's SIGKILL is pending): ours to fork */
        if (gone && zyg_child) return ZYG_NOT_USED;
        errno = ECHILD;
        return ZYG_LOST;
    }
    if (reply[0] > 0) return (pid_t)reply[0];
    errno = (int)reply[1];
    return ZYG_FORK;
}

static void start_exec(const req_t *r) {
    char **argv = get_list(r, F_ARGV);
    char **envp = get_list(r, F_ENV);
    char *cwd = get_str(r, F_CWD);
    char *stdin_mode = get_str(r, F_STDIN_MODE);
    char *user = get_str(r, F_USER);
    char *pty_spec = get_str(r, F_PTY);
    const fld_t *stdin_data = get(r, F_DATA);
    int pty_m = -1, pty_s = -1;
    struct winsize ws;
    int no_network = get_int(r, F_NETWORK, 1) == 0;
    int sealed = get_int(r, F_PIDNS, 0) == 1; /* the verifier's tests: sealed on every backend */
    /* the tests under a warden in a pid namespace of their own: where commands get their own
     * namespaces (bwrap's S, gVisor) and where we are the machine's init (microvm) */
    int own_pidns = sealed && (isolated || getpid() == 1);
    uid_t uid = 0;
    gid_t gid = 0;
    int g = -1;
    if (!argv) { send_error(r->id, "ProtocolError", 0, "exec without argv"); goto out; }
    if (njobs >= (int)(sizeof jobs / sizeof *jobs)) {
        send_error(r->id, "ExecError", 0, "too many concurrent commands");
        goto out;
    }
    if (isolated && user && resolve_user(user, &uid, &gid) < 0) {
        send_error(r->id, "ExecError", 0, "no such user in the sandbox: %s", user);
        goto out;
    }
    if (pty_spec) {
        int e = parse_winsize(pty_spec, &ws) < 0 ? EINVAL : open_pty(&ws, &pty_m, &pty_s) < 0 ? errno : 0;
        if (e) {
            send_error(r->id, "ExecError", e, "can't open a terminal (PTY \"%s\"): %s", pty_spec, strerror(e));
            goto out;
        }
    }
    int pin[2], pout[2], perr[2], pst[2], pdet[2] = {-1, -1};
    if (own_pidns && pipe2(pdet, O_CLOEXEC) < 0) {
        int e = errno;
        if (pty_m >= 0) { close(pty_m); close(pty_s); pty_m = pty_s = -1; }
        send_error(r->id, "ExecError", e, "pipe: %s", strerror(e));
        goto out;
    }
    /* gVisor (--switch-users) refuses to chmod a pipe (EPERM, even for root; see below): the
     * pipes are made as the command's user instead (gVisor takes a pipe's owner from the
     * effective uid), so that they are its own, 0600, and it can reopen them by path. */
    int as_user = isolated && s_userns < 0 && uid != 0;
    if (as_user && (setegid(gid) < 0 || seteuid(uid) < 0)) {
        int e = errno;
        if (setegid(0) < 0) {}
        if (pty_m >= 0) { close(pty_m); close(pty_s); pty_m = pty_s = -1; }
        send_error(r->id, "ExecError", e, "can't take the command's user for its pipes: %s", strerror(e));
        goto out;
    }
    int pipes_failed = pipe2(pin, O_CLOEXEC) || pipe2(pout, O_CLOEXEC) || pipe2(perr, O_CLOEXEC) ||
                       pipe2(pst, O_CLOEXEC);
    int pipe_errno = errno;
    if (as_user && (seteuid(0) < 0 || setegid(0) < 0)) _exit(70); /* can't be root again: never go on */
    if (pipes_failed) {
        int e = pipe_errno;
        if (pdet[0] >= 0) { close(pdet[0]); close(pdet[1]); }
        if (pty_m >= 0) { close(pty_m); close(pty_s); pty_m = pty_s = -1; }
        send_error(r->id, "ExecError", e, "pipe: %s", strerror(e));
        goto out;
    }
    /* The command may reopen its stdio by path (/dev/stdout, /dev/stderr, /dev/stdin: links
     * into /proc/self/fd), as test scripts do. A pipe is its maker's, ours, and our uid is
     * unmapped in S: 0600 denied even root of S. Only a process that may ptrace one holding
     * the pipe reaches it by that path (/proc/<pid>/fd), and such a process can use the fd
     * anyway: open to all. */
    fchmod(pin[0], 0666); fchmod(pout[0], 0666); fchmod(perr[0], 0666);
    g = group_new(r->id, uid);
    char procs[340] = "";
    if (g >= 0) { /* the child joins through join_file(): see there */
        group_path(g, procs, sizeof procs - 16);
        strcat(procs, cg_tasks ? "/tasks" : "/cgroup.procs");
    }
    pid_t pid = ZYG_NOT_USED;
    /* forked by the zygote, which has the filter; not under gVisor (--switch-users: S is not ours,
       s_userns < 0), where a command cloned with CLONE_PARENT by the zygote never reached our
       waitpid (its end was never reported): commands there keep the path below */
    if (!own_pidns && !sealed && !no_network && (!isolated || s_userns >= 0)) {
        int zfd[4] = {pst[1], pty_s >= 0 ? pty_s : pin[0], pout[1], perr[1]};
        pid = zygote_command(r, procs, uid, gid, zfd, pty_s >= 0 ? 2 : 4);
    }
    if (pid == ZYG_NOT_USED) pid = fork();
    if (pid < 0) {
        int e = errno;
        close(pin[0]); close(pin[1]); close(pout[0]); close(pout[1]);
        close(perr[0]); close(perr[1]); close(pst[0]); close(pst[1]);
        if (pdet[0] >= 0) { close(pdet[0]); close(pdet[1]); }
        group_release(g);
        if (pty_m >= 0) { close(pty_m); close(pty_s); pty_m = pty_s = -1; }
        if (pid == ZYG_LOST)
            send_error(r->id, "ExecError", e, "can't start command: the sandbox's command zygote was lost "
                       "while starting it (killed or stopped by a command?): %s", strerror(e));
        else
            send_error(r->id, "ExecError", e, "fork: %s (process limit reached?)", strerror(e));
        goto out;
    }
    if (pid == 0) {
        char m[600];
        if (oom_protected) write_str("/proc/self/oom_score_adj", "0");
        if (procs[0]) {
            if (write_str(procs, "0") < 0) {
                int e = errno;
                snprintf(m, sizeof m, "%d join the command's cgroup: %s", e, strerror(e));
                if (write(pst[1], m, strlen(m)) < 0) {}
                _exit(127);
            }
        }
        const char *what = NULL;
        if (enter_s() < 0 || confine_ns(no_network, own_pidns, &what) < 0 ||
            (!own_pidns && (confine_filter(sealed, &what) < 0 || (what = NULL, take_user(uid, gid) < 0))))
            start_failed(pst[1], what, user);
        setsid();
        sigset_t all;
        sigemptyset(&all);
        sigprocmask(SIG_SETMASK, &all, NULL);
        /* every signal to its default action: an ignored one survives exec, and this agent may
           have inherited SIGINT and SIGQUIT ignored (a service started by nohup or from a
           non-interactive shell's background job), which left a command deaf to an interrupt */
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        for (int s = 1; s < NSIG; s++)
            if (s != SIGKILL && s != SIGSTOP) sigaction(s, &dfl, NULL);
        if (pty_s >= 0) { /* the terminal is the command's stdin, stdout, stderr and controlling tty */
            ioctl(pty_s, TIOCSCTTY, 0);
            dup2(pty_s, 0); dup2(pty_s, 1); dup2(pty_s, 2);
        } else {
            dup2(pin[0], 0); dup2(pout[1], 1); dup2(perr[1], 2);
        }
        if (own_pidns) { /* the command is the first process of its pid namespace: when it ends,
                            the kernel kills every process left in it (daemons included) before
                            this process, which relays how it ended, can return */
            pid_t init = fork();
            if (init < 0) start_failed(pst[1], "fork into a pid namespace", user);
            if (init > 0) { /* the relay takes the user and the filter as the command does */
                if (confine_filter(sealed, &what) < 0 || (what = NULL, take_user(uid, gid) < 0)) {
                    int e = errno;
                    kill(init, SIGKILL);
                    errno = e;
                    start_failed(pst[1], what, user);
                }
                close_all(); /* it never execs: nothing of ours stays open while it waits (the
                                write end of this command's stdin or of another's: no EOF) */
                int st = 0;
                while (waitpid(init, &st, 0) < 0 && errno == EINTR) {}
                if (WIFSIGNALED(st)) { signal(WTERMSIG(st), SIG_DFL); raise(WTERMSIG(st)); }
                _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 127);
            }
            /* the warden: its own /proc, then the filter and its user; the command under it */
            if ((pidns_proc() && own_proc(&what) < 0) || confine_filter(sealed, &what) < 0 ||
                (what = NULL, take_user(uid, gid) < 0))
                start_failed(pst[1], what, user);
            close(pdet[0]);
            warden(pdet[1], pst[1], user);
            close(pdet[1]);
        }
        if (cwd && chdir(cwd) < 0) {
            int e = errno;
            snprintf(m, sizeof m, "%d cwd %s: %s", e, cwd, strerror(e));
            if (write(pst[1], m, strlen(m)) < 0) {}
            _exit(127);
        }
        static char *no_env[] = {NULL};
        environ = with_preload(envp ? envp : no_env);
        run_helper(argv, pst[1]);
        exec_search(argv[0], argv);
        int e = errno;
        snprintf(m, sizeof m, "%d %s: %s", e, argv[0], strerror(e));
        if (write(pst[1], m, strlen(m)) < 0) {}
        _exit(127);
    }
    close(pin[0]); close(pout[1]); close(perr[1]); close(pst[1]);
    if (pdet[1] >= 0) close(pdet[1]);
    if (pty_s >= 0) { close(pty_s); pty_s = -1; }
    char m[700];
    ssize_t k;
    wait_child_answer(pst[0], pid); /* its exec (EOF) or its error; one stopped before: killed */
    while ((k = read(pst[0], m, sizeof m - 1)) < 0 && errno == EINTR) {}
    close(pst[0]);
    if (k > 0) {
        m[k] = 0;
        int e = atoi(m);
        char *msg = strchr(m, ' ');
        waitpid(pid, NULL, 0);
        close(pin[1]); close(pout[0]); close(perr[0]);
        if (pdet[0] >= 0) close(pdet[0]);
        if (pty_m >= 0) { close(pty_m); pty_m = -1; }
        group_release(g);
        send_error(r->id, e == ENOENT || e == ENOTDIR ? "ExecError" : errno_type(e), e,
                   "can't start command: %s", msg ? msg + 1 : m);
        goto out;
    }
    job_t *j = xcalloc(1, sizeof *j);
    j->id = r->id;
    j->pid = pid;
    j->group = g;
    j->fd[0] = pin[1]; j->fd[1] = pout[0]; j->fd[2] = perr[0];
    j->pty = -1;
    j->det_fd = pdet[0];
    if (pty_m >= 0) { /* input and output go through the master: fd[0] a dup of it, fd[2] unused */
        close(pin[1]); close(pout[0]); close(perr[0]);
        j->pty = pty_m;
        j->fd[1] = pty_m;
        j->fd[0] = fcntl(pty_m, F_DUPFD_CLOEXEC, 0);
        j->fd[2] = -1;
        pty_m = -1;
    }
    /* (our ends of new pipes, or the terminal's master: no status flag of theirs to keep, one call each) */
    for (int i = 0; i < 3; i++) if (j->fd[i] >= 0) fcntl(j->fd[i], F_SETFL, O_NONBLOCK);
    j->max_output = get_int(r, F_MAX_OUTPUT, 1 << 20);
    if (j->max_output < 0) j->max_output = 0;
    if (j->max_output > MAX_CAPTURE) j->max_output = MAX_CAPTURE;
    j->stream = get_int(r, F_STREAM, 0);
    j->start = now();
    long long tmo = get_int(r, F_TIMEOUT_MS, 0);
    j->deadline = tmo > 0 ? j->start + tmo / 1000.0 : 0;
    if (stdin_data) buf_add(&j->pending_in, stdin_data->data, stdin_data->len);
    j->close_in = !(stdin_mode && strcmp(stdin_mode, "pipe") == 0);
    jobs[njobs++] = j;
    if (get_int(r, F_NOSTART, 0) != 1) { /* a host that asks for no STARTED waits for EXIT alone:
                                             one frame (and one wake-up of its loop) less */
        frame_begin(R_STARTED, r->id);
        field_i(F_PID, pid);
        frame_send();
    }
out:
    free_list(argv); free_list(envp); free(cwd); free(stdin_mode); free(user); free(pty_spec);
}

/* Kill everything a command started: its cgroup (orphans and setsid escapees included),
 * else its process group and the descendants found through /proc. */
static void kill_job(job_t *j) {
    if (j->group >= 0 && groups[j->group].used && groups[j->group].id == j->id) group_kill(j->group);
    if (!j->exited) kill_tree(j->pid);
}

static job_t *find_job(uint32_t id) {
    for (int i = 0; i < njobs; i++) if (jobs[i]->id == id) return jobs[i];
    return NULL;
}

static void job_finish(int idx) {
    job_t *j = jobs[idx];
    int detached = 0;
    if (j->det_fd >= 0) { /* the warden's report: the command's own status, and its count */
        char m[64];
        ssize_t k;
        while ((k = read(j->det_fd, m, sizeof m - 1)) < 0 && errno == EINTR) {}
        int st = 0, d = 0;
        if (k > 0 && (m[k] = 0, sscanf(m, "%d %d", &st, &d) == 2) && !j->timed_out) {
            j->status = st;
            detached = d;
        }
        close(j->det_fd);
        j->det_fd = -1;
    }
    frame_begin(R_EXIT, j->id);
    int code = -1, sig = 0;
    if (WIFEXITED(j->status)) code = WEXITSTATUS(j->status);
    else if (WIFSIGNALED(j->status)) { sig = WTERMSIG(j->status); code = 128 + sig; }
    field_i(F_CODE, code);
    if (sig) field_i(F_SIGNAL, sig);
    if (j->timed_out) field_i(F_TIMED_OUT, 1);
    field(F_STDOUT, j->cap[0].p ? j->cap[0].p : "", j->cap[0].n);
    field(F_STDERR, j->cap[1].p ? j->cap[1].p : "", j->cap[1].n);
    if (j->dropped[0]) field_i(F_DROPPED_OUT, j->dropped[0]);
    if (j->dropped[1]) field_i(F_DROPPED_ERR, j->dropped[1]);
    field_i(F_DURATION_US, (long long)((j->exit_time - j->start) * 1e6));
    if (detached) field_i(F_DETACHED, detached);
    frame_send();
    for (int i = 0; i < 3; i++) if (j->fd[i] >= 0) close(j->fd[i]);
    buf_free(&j->cap[0]); buf_free(&j->cap[1]); buf_free(&j->pending_in);
    free(j);
    jobs[idx] = jobs[--njobs];
    groups_sweep(); /* groups whose background processes have all ended */
}

static void drain(job_t *j, int s) { /* s = 1 stdout, 2 stderr */
    char tmp[65536];
    for (;;) {
        ssize_t k = read(j->fd[s], tmp, sizeof tmp);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno == EAGAIN) return;
        if (k <= 0) { /* EOF; EIO on a terminal whose command and children are gone */
            if (j->fd[s] == j->pty) j->pty = -1;
            close(j->fd[s]); j->fd[s] = -1; return;
        }
        buf_t *c = &j->cap[s - 1];
        long long room = j->max_output - (long long)c->n;
        long long keep = room > 0 ? (k < room ? k : room) : 0;
        if (keep) buf_add(c, tmp, keep);
        j->dropped[s - 1] += k - keep;
        if (j->stream) {
            frame_begin(R_OUTPUT, j->id);
            field_i(F_STREAM_NO, s);
            field(F_DATA, tmp, k);
            frame_send();
        }
    }
}

static void feed_stdin(job_t *j) {
    while (j->fd[0] >= 0 && j->pending_in.n) {
        ssize_t w = write(j->fd[0], j->pending_in.p, j->pending_in.n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno == EAGAIN) return;
        if (w < 0) { close(j->fd[0]); j->fd[0] = -1; j->pending_in.n = 0; return; }
        memmove(j->pending_in.p, j->pending_in.p + w, j->pending_in.n - w);
        j->pending_in.n -= w;
    }
    if (j->fd[0] >= 0 && !j->pending_in.n && j->close_in) { close(j->fd[0]); j->fd[0] = -1; }
}

static void kill_all(void) {
    for (int i = 0; i < njobs; i++) kill_job(jobs[i]);
    for (int g = 0; g < NGROUPS; g++)
        if (groups[g].used) group_kill(g);
}

/* ---------- files ---------- */
static int mkdirs(const char *path, mode_t mode) {
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, mode) < 0 && errno != EEXIST) return -1;
            *p = '/';
        }
    return 0;
}

/* Reap children (ours, and orphans re-parented to us as subreaper), noting job exits. */
static void reap(void) {
    int st;
    pid_t p;
    while ((p = waitpid(-1, &st, WNOHANG)) > 0) {
        if (p == zyg_pid) { zyg_pid = -1; zygote_drop(); } /* killed (by a command?): the next starts anew */
        for (int i = 0; i < njobs; i++)
            if (jobs[i]->pid == p && !jobs[i]->exited) {
                jobs[i]->exited = 1;
                jobs[i]->status = st;
                jobs[i]->exit_time = now();
            }
    }
}

/* Open a file as a sandbox user: a child enters S as that user, opens it (creating parent
 * directories first if asked) and hands the descriptor back over a socket, so permissions
 * and ownership are the user's. Without isolation we open it ourselves. Returns the fd, or
 * -1 with errno set. */
static int open_as(const char *user, const char *path, int flags, mode_t mode, int mkdirs_too) {
    uid_t uid = 0;
    gid_t gid = 0;
    if (!isolated) {
        if (mkdirs_too && mkdirs(path, 0755) < 0) return -1;
        int fd = open(path, flags | O_CLOEXEC, mode);
        if (fd >= 0 && (flags & O_CREAT)) fchmod(fd, mode);
        return fd;
    }
    if (resolve_user(user ? user : "root", &uid, &gid) < 0) { errno = ESRCH; return -1; }
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) return -1;
    pid_t c = fork();
    if (c < 0) { int e = errno; close(sv[0]); close(sv[1]); errno = e; return -1; }
    if (c == 0) {
        int e = 0, fd = -1;
        if (become(uid, gid) < 0) e = errno;
        if (!e) umask(0);
        if (!e && mkdirs_too && mkdirs(path, 0755) < 0) e = errno;
        if (!e && (fd = open(path, flags | O_CLOEXEC, mode)) < 0) e = errno;
        if (!e && (flags & O_CREAT)) {
            struct stat st;
            if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) fchmod(fd, mode);
        }
        char cbuf[CMSG_SPACE(sizeof(int))];
        memset(cbuf, 0, sizeof cbuf);
        struct iovec io = {&e, sizeof e};
        struct msghdr mh = {0};
        mh.msg_iov = &io;
        mh.msg_iovlen = 1;
        if (fd >= 0) {
            mh.msg_control = cbuf;
            mh.msg_controllen = sizeof cbuf;
            struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
            cm->cmsg_level = SOL_SOCKET;
            cm->cmsg_type = SCM_RIGHTS;
            cm->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(cm), &fd, sizeof fd);
        }
        _exit(sendmsg(sv[1], &mh, 0) < 0 ? 1 : 0);
    }
    close(sv[1]);
    int e = EIO, fd = -1;
    char cbuf[CMSG_SPACE(sizeof(int))];
    struct iovec io = {&e, sizeof e};
    struct msghdr mh = {0};
    mh.msg_iov = &io;
    mh.msg_iovlen = 1;
    mh.msg_control = cbuf;
    mh.msg_controllen = sizeof cbuf;
    ssize_t k;
    wait_child_answer(sv[0], c); /* (stopped by root of S before it answered: killed, EIO) */
    while ((k = recvmsg(sv[0], &mh, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR) {}
    close(sv[0]);
    kill(c, SIGKILL); /* done with it: one stopped after its answer must not hold the wait */
    waitpid(c, NULL, 0);
    if (k == (ssize_t)sizeof e) {
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        if (cm && cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
            memcpy(&fd, CMSG_DATA(cm), sizeof fd);
    } else e = EIO;
    if (fd < 0) { errno = e ? e : EIO; return -1; }
    return fd;
}

/* Only regular files: a FIFO, socket or device would wedge or mislead the agent. */
static int check_regular(uint32_t id, int fd, const char *path) {
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        send_error(id, NULL, e, "%s: %s", path, strerror(e));
        return -1;
    }
    if (S_ISDIR(st.st_mode)) {
        send_error(id, NULL, EISDIR, "%s: %s", path, strerror(EISDIR));
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        send_error(id, "OSError", EINVAL, "%s: not a regular file", path);
        return -1;
    }
    return 0;
}

static void do_read(const req_t *r) {
    char *path = get_str(r, F_PATH);
    char *user = get_str(r, F_USER);
    long long max = get_int(r, F_MAX, 64LL << 20);
    if (max < 0 || max > MAX_READ) max = MAX_READ;
    int flags = O_RDONLY | O_NONBLOCK | O_NOCTTY | (get_int(r, F_NOFOLLOW, 0) ? O_NOFOLLOW : 0);
    if (!path) { send_error(r->id, "ProtocolError", 0, "read without path"); free(user); return; }
    int fd = open_as(user, path, flags, 0, 0);
    if (fd < 0) {
        int e = errno;
        if (e == ELOOP && (flags & O_NOFOLLOW)) send_error(r->id, "OSError", e, "%s: is a symbolic link", path);
        else if (e == ESRCH) send_error(r->id, "ExecError", 0, "no such user in the sandbox: %s", user ? user : "root");
        else send_error(r->id, NULL, e, "%s: %s", path, strerror(e));
        goto out;
    }
    if (check_regular(r->id, fd, path) < 0) { close(fd); goto out; }
    buf_t b = {0};
    char tmp[65536];
    ssize_t k;
    int rerr = 0;
    while ((long long)b.n <= max && (k = read(fd, tmp, sizeof tmp)) != 0) {
        if (k < 0) { if (errno == EINTR) continue; rerr = errno; break; }
        buf_add(&b, tmp, k);
    }
    close(fd);
    if (rerr) {
        send_error(r->id, NULL, rerr, "%s: %s", path, strerror(rerr));
    } else if ((long long)b.n > max) {
        send_error(r->id, "OSError", EFBIG, "%s: larger than the %lld-byte read limit", path, max);
    } else {
        frame_begin(R_DATA, r->id);
        field(F_DATA, b.p ? b.p : "", b.n);
        frame_send();
    }
    buf_free(&b);
out:
    free(path);
    free(user);
}

static void do_write(const req_t *r) {
    char *path = get_str(r, F_PATH);
    char *user = get_str(r, F_USER);
    const fld_t *data = get(r, F_DATA);
    mode_t mode = (mode_t)get_int(r, F_MODE, 0644) & 07777;
    if (!path) { send_error(r->id, "ProtocolError", 0, "write without path"); free(user); return; }
    int fd = open_as(user, path, O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK | O_NOCTTY, mode,
                     (int)get_int(r, F_MKDIRS, 0));
    if (fd < 0) {
        int e = errno;
        if (e == ESRCH) send_error(r->id, "ExecError", 0, "no such user in the sandbox: %s", user ? user : "root");
        else send_error(r->id, NULL, e, "%s: %s", path, strerror(e));
        goto out;
    }
    if (check_regular(r->id, fd, path) < 0) { close(fd); goto out; }
    if (data && write_all(fd, data->data, data->len) < 0) {
        int e = errno;
        close(fd);
        send_error(r->id, NULL, e, "%s: %s", path, strerror(e));
        goto out;
    }
    close(fd);
    frame_begin(R_DONE, r->id);
    frame_send();
out:
    free(path);
    free(user);
}

/* Whether /proc/<pid> is a kernel thread (PF_KTHREAD in its stat flags, the 9th field): where
 * we are a machine's init (a microVM) /proc shows the kernel's threads, which no signal ends and
 * no command can become (a process the kernel starts for a user helper, core_pattern's pipe, is
 * not one once it has exec'd: it is killed as any). Unreadable: not one (killed, counted). */
#define PF_KTHREAD_FLAG 0x00200000UL
static int is_kthread(const char *pid) {
    char path[300], st[1024];
    snprintf(path, sizeof path, "/proc/%s/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t k = read(fd, st, sizeof st - 1);
    close(fd);
    if (k <= 0) return 0;
    st[k] = 0;
    char *p = strrchr(st, ')'); /* the name may hold spaces and parentheses: fields follow the last */
    if (!p) return 0;
    p++;
    for (int field = 3; field < 9; field++) { /* state ppid pgrp session tty_nr tpgid, then flags */
        p = strchr(p + 1, ' ');
        if (!p) return 0;
    }
    return (strtoul(p + 1, NULL, 10) & PF_KTHREAD_FLAG) != 0;
}

/* Kill every process of one user (all processes without isolation, or where user is NULL: every
 * one but ours and our helpers') and return once they are gone: their cgroups first, then
 * whatever /proc still shows, for up to 2 s. */
static void kill_user(const char *user) {
    uid_t uid = 0;
    gid_t gid = 0;
    int all = !isolated || !user;
    if (!all && resolve_user(user, &uid, &gid) < 0) return;
    for (int i = 0; i < njobs; i++)
        if (all || (jobs[i]->group >= 0 && groups[jobs[i]->group].id == jobs[i]->id &&
                    groups[jobs[i]->group].uid == uid)) kill_job(jobs[i]);
    for (int g = 0; g < NGROUPS; g++)
        if (groups[g].used && (all || groups[g].uid == uid)) group_kill(g);
    pid_t self = getpid();
    int me_guest = getuid() == GUEST_UID;
    /* /proc shows only the sandbox when isolated (its own pid namespace) or where we are the
       machine's init (a microVM, whose commands all run as root: a daemon that left its job's
       tree, under any uid, is found here); never scan the host's */
    int scan = isolated || self == 1;
    /* As a machine's init, killing all: one kill(-1), which the kernel sends to every process but
       us under its task list's lock, while a fork whose parent has that SIGKILL pending fails: no
       process escapes it by forking (a chain of links that each fork the next and exit at once
       slipped past a pass of /proc, round XV). The pass below then waits for them to be gone. */
    if (all && self == 1) {
        kill(-1, SIGKILL);
        /* our command zygote too (it starts anew at the next command): reaped before we answer, or the
           next command went to it while it died and failed to start ("zygote lost", round XV's
           core-pattern-helper in a fresh sandbox of --verify separate, whose stop is root's) */
        pid_t z = zyg_pid;
        zygote_drop();
        if (z > 0) while (waitpid(z, NULL, 0) < 0 && errno == EINTR) {}
    }
    int empty = 0; /* as init: scans in a row that found nothing */
    for (double end = now() + 2.0; scan && now() < end;) {
        int left = 0;
        DIR *d = opendir("/proc");
        struct dirent *e;
        while (d && (e = readdir(d))) {
            if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
            pid_t pid = (pid_t)atoi(e->d_name);
            if (pid == self || pid == 1) continue;
            char path[300], st[4096];
            snprintf(path, sizeof path, "/proc/%s/status", e->d_name);
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd < 0) continue;
            ssize_t k = read(fd, st, sizeof st - 1);
            close(fd);
            if (k <= 0) continue;
            st[k] = 0;
            char *u = strstr(st, "\nUid:"), *z = strstr(st, "\nState:\tZ");
            if (!u || z) continue;
            long ruid = strtol(u + 5, NULL, 10);
            /* never us or our helpers: they run as GUEST_UID where we do (bwrap, in S's parent, where S's
               root can't take that uid); under gVisor and in a microVM we are root and our uid is any
               other, one the sandbox's root may take (round XXVII's stop-guest-uid) */
            if ((ruid == GUEST_UID && me_guest) || (!all && ruid != (long)uid)) continue;
            if (self == 1 && is_kthread(e->d_name)) continue; /* the VM's kernel: waited for 2 s before */
            left++;
            kill(pid, SIGKILL);
        }
        if (d) closedir(d);
        reap();
        /* as init, done at the second empty scan in a row, a kill(-1) between: a child whose fork was under way
           as the last kill(-1) went out shows in /proc only once the fork ends (gVisor: a link of the test's chain
           was left after a scan that found nothing, under the whole suite's load) */
        if (!left && (!(all && self == 1) || ++empty >= 2)) break;
        if (left) empty = 0;
        /* as init, every round kills all again at once: a fork under way as the first kill(-1) was sent (gVisor
           sends it task by task, not under one lock) left a child it missed, and the chain's links, each forking
           the next, outran a pass of /proc that kills them one by one (2 s of passes, under load: a daemon was
           left after the stop, test_root_leaves_nothing_the_stop_does_not_kill[gvisor]) */
        if (all && self == 1) kill(-1, SIGKILL);
        struct timespec ts = {0, 2000000}; /* SIGKILL is delivered asynchronously */
        nanosleep(&ts, NULL);
    }
    if (!isolated) reap();
    groups_sweep();
}

/* ---------- request dispatch ---------- */
static int handle(const req_t *r) {
    switch (r->type) {
    case T_HELLO: {
        /* optional TIME "seconds.nanoseconds": set the clock (a VM restored from a snapshot
           wakes with the time it was saved at); reply TIME 1 if it was set */
        char *ts = get_str(r, F_TIME);
        int clock_set = 0;
        if (ts) {
            struct timespec t = {0};
            char *dot = strchr(ts, '.');
            t.tv_sec = strtoll(ts, NULL, 10);
            if (dot) {
                char ns[10] = "000000000";
                memcpy(ns, dot + 1, strnlen(dot + 1, 9));
                t.tv_nsec = strtol(ns, NULL, 10);
            }
            clock_set = clock_settime(CLOCK_REALTIME, &t) == 0;
            free(ts);
        }
        /* optional SECCOMP: the program every later command runs under (the reply's SECCOMP
           is its length in instructions once taken, else MESSAGE says why not) */
        const fld_t *sf = get(r, F_SECCOMP);
        const char *bad = sf ? set_filter(sf) : NULL;
        if (sf && !bad) zygote_drop(); /* it has the old program: the next command starts a new one */
        frame_begin(R_HELLO, r->id);
        field_s(F_VERSION, PROTO_VERSION);
        field_i(F_PID, getpid());
        if (clock_set) field_i(F_TIME, 1);
        if (sf && !bad) field_i(F_SECCOMP, filter_len);
        if (bad) field_s(F_MESSAGE, bad);
        frame_send();
        break;
    }
    case T_EXEC: start_exec(r); break;
    case T_STDIN: {
        job_t *j = find_job((uint32_t)get_int(r, F_TARGET, 0));
        const fld_t *d = get(r, F_DATA);
        if (!j) break; /* the command ended already: nothing to feed */
        if (d && d->len) buf_add(&j->pending_in, d->data, d->len);
        else j->close_in = 1;
        feed_stdin(j);
        break;
    }
    case T_KILL: {
        uint32_t target = (uint32_t)get_int(r, F_TARGET, 0);
        int sig = (int)get_int(r, F_SIGNAL, SIGKILL);
        char *user = get_str(r, F_USER);
        /* USER "*": every process but ours and our helpers', whatever its uid (what a root command
           may have left under any uid: one pass instead of a list of the uids /proc shows, then a
           KILL for each); the reply's CODE 1 says it was taken so (an older agent knew no "*") */
        int everyone = !target && user && !strcmp(user, "*");
        if (!target && user) {
            kill_user(everyone ? NULL : user);
        } else {
            job_t *j = find_job(target);
            if (sig == SIGKILL) {
                if (j) kill_job(j);
                for (int g = 0; g < NGROUPS; g++) /* its background, too */
                    if (groups[g].used && groups[g].id == target) group_kill(g);
            } else if (j && !j->exited) {
                kill(-j->pid, sig);
            }
        }
        free(user);
        frame_begin(R_DONE, r->id);
        if (everyone) field_i(F_CODE, 1);
        frame_send();
        break;
    }
    case T_READ: do_read(r); break;
    case T_RESIZE: do_resize(r); break;
    case T_WRITE: do_write(r); break;
    case T_SHUTDOWN:
        kill_all();
        frame_begin(R_DONE, r->id);
        frame_send();
        return 1;
    default: send_error(r->id, "ProtocolError", 0, "unknown request type %d", r->type);
    }
    return 0;
}

static int parse_frame(const unsigned char *p, uint32_t len, req_t *r) {
    if (len < 5) return -1;
    r->type = p[0];
    r->id = (uint32_t)p[1] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 8 | p[4];
    r->nf = 0;
    int cap = 16;
    r->f = xmalloc(cap * sizeof *r->f);
    uint32_t off = 5;
    while (off < len) {
        if (len - off < 5) return -1;
        uint32_t fl = (uint32_t)p[off + 1] << 24 | (uint32_t)p[off + 2] << 16 |
                      (uint32_t)p[off + 3] << 8 | p[off + 4];
        if (fl > len - off - 5) return -1;
        if (r->nf >= 65536) return -1; /* no request needs that many fields */
        if (r->nf == cap) { cap *= 2; r->f = xrealloc(r->f, (size_t)cap * sizeof *r->f); }
        r->f[r->nf].tag = p[off];
        r->f[r->nf].len = fl;
        r->f[r->nf].data = (const char *)p + off + 5;
        r->nf++;
        off += 5 + fl;
    }
    return 0;
}

static void on_sigchld(int s) {
    (void)s;
    int e = errno;
    if (write(sig_pipe[1], "c", 1) < 0) {}
    errno = e;
}

static int serve(double ttl) {
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    prctl(PR_SET_DUMPABLE, 0); /* no command may ptrace us or read our memory or environment */
    /* a socket pair, not a pipe: where a command may see our descriptors (root under gVisor), a
       pipe can be opened again through /proc/1/fd and its wake-ups read away; a socket can't */
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sig_pipe) < 0) return 70;
    struct sigaction sa = {0};
    sa.sa_handler = on_sigchld;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    double t_end = ttl > 0 ? now() + ttl : 0;
    buf_t ib = {0};
    int input_open = 1;
    while (input_open || njobs) {
        struct pollfd pf[3 + 3 * 4096];
        job_t *owner[3 + 3 * 4096];
        int slot[3 + 3 * 4096];
        int n = 0;
        if (input_open) { pf[n].fd = in_fd; pf[n].events = POLLIN; owner[n] = NULL; n++; }
        if (life_fd >= 0) { pf[n].fd = life_fd; pf[n].events = POLLIN; owner[n] = NULL; n++; }
        pf[n].fd = sig_pipe[0]; pf[n].events = POLLIN; owner[n] = NULL; n++;
        double t = now(), wake = t + 3600;
        for (int i = 0; i < njobs; i++) {
            job_t *j = jobs[i];
            for (int s = 0; s < 3; s++) {
                if (j->fd[s] < 0) continue;
                if (s == 0 && !j->pending_in.n) continue;
                pf[n].fd = j->fd[s];
                pf[n].events = s == 0 ? POLLOUT : POLLIN;
                owner[n] = j; slot[n] = s; n++;
            }
            if (j->deadline && !j->exited && j->deadline < wake) wake = j->deadline;
            if (j->exited && j->exit_time + 0.05 < wake) wake = j->exit_time + 0.05;
        }
        if (t_end && t_end < wake) wake = t_end;
        int ms = wake > t ? (int)((wake - t) * 1000) + 1 : 0;
        int k = poll(pf, n, ms);
        if (k < 0 && errno != EINTR) return 70;
        for (int i = 0; k > 0 && i < n; i++) {
            if (!pf[i].revents) continue;
            if (pf[i].fd == sig_pipe[0] && !owner[i]) {
                char c[64];
                while (read(sig_pipe[0], c, sizeof c) > 0) {}
            } else if (pf[i].fd == life_fd && !owner[i]) {
                /* bwrap is gone, so is the sandbox: at once, reporting nothing (a command cut
                 * short here did not end by itself; the host sees the sandbox die). As the pid
                 * namespace's init, our exit makes the kernel kill everything left in it. */
                kill_all();
                _exit(137);
            } else if (!owner[i]) { /* protocol input */
                char tmp[65536];
                ssize_t got = read(in_fd, tmp, sizeof tmp);
                if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
                if (got <= 0) { input_open = 0; kill_all(); continue; }
                buf_add(&ib, tmp, got);
                size_t off = 0;
                while (ib.n - off >= 4) {
                    const unsigned char *p = (const unsigned char *)ib.p + off;
                    uint32_t len = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
                                   (uint32_t)p[2] << 8 | p[3];
                    if (len > MAX_FRAME) { send_error(0, "ProtocolError", 0, "frame too large"); return 71; }
                    if (ib.n - off - 4 < len) break;
                    req_t r = {0};
                    if (parse_frame(p + 4, len, &r) < 0) {
                        send_error(0, "ProtocolError", 0, "malformed frame");
                        free(r.f);
                        return 71;
                    }
                    int stop = handle(&r);
                    free(r.f);
                    off += 4 + len;
                    if (stop) { input_open = 0; break; }
                }
                if (off) { /* a frame still arriving stays where it is: moving it onto itself at
                            * every 64 KiB read made a 50 MB write quadratic (20 GB of memmove) */
                    memmove(ib.p, ib.p + off, ib.n - off);
                    ib.n -= off;
                }
            } else {
                job_t *j = owner[i];
                if (slot[i] == 0) {
                    if (pf[i].revents & (POLLERR | POLLHUP)) { close(j->fd[0]); j->fd[0] = -1; }
                    else feed_stdin(j);
                } else drain(j, slot[i]);
            }
        }
        reap();
        t = now();
        if (t_end && t >= t_end) { kill_all(); input_open = 0; t_end = 0; }
        for (int i = 0; i < njobs; i++) {
            job_t *j = jobs[i];
            if (!j->exited && j->deadline && t >= j->deadline) { j->timed_out = 1; kill_job(j); }
            if (j->exited) {
                if (j->fd[1] >= 0) drain(j, 1);
                if (j->fd[2] >= 0) drain(j, 2);
                /* finish at EOF, or 50 ms after exit when a background child holds the pipes */
                if ((j->fd[1] < 0 && j->fd[2] < 0) || t >= j->exit_time + 0.05) {
                    job_finish(i);
                    i--;
                }
            }
        }
    }
    return 0;
}

/* ---------- launch mode (host side, as root) ---------- */
static const char *host_mode = "launch"; /* or "tether": named in die()'s messages */
static int die(const char *what, const char *arg) {
    fprintf(stderr, "sandfleet-agent %s: %s %s: %s\n", host_mode, what, arg ? arg : "", strerror(errno));
    return 125;
}

/* Binaries the root launcher runs are found by absolute path, never through PATH. */
static const char *system_bin(const char *name) {
    static char path[64];
    const char *dirs[] = {"/usr/bin", "/bin", "/usr/sbin", "/sbin"};
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
        snprintf(path, sizeof path, "%s/%s", dirs[i], name);
        if (access(path, X_OK) == 0) return path;
    }
    return NULL;
}

static int copy_tree(const char *from, const char *to) {
    char src[PATH_MAX];
    snprintf(src, sizeof src, "%s/.", from);
    const char *cp = system_bin("cp");
    if (!cp) { errno = ENOENT; return -1; }
    pid_t p = fork();
    if (p == 0) {
        execl(cp, "cp", "-a", src, to, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    if (p < 0 || waitpid(p, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        errno = EIO;
        return -1;
    }
    return 0;
}

/* cp -a FROM/. TO for a small tree of folders and regular files (a branch child's identity layer:
 * /etc and its machine-id), in this process: a cp per child cost 1.5 ms of the cores, most of it
 * its dynamic loader's start. As cp -a: owners, modes and times kept, TO's own from FROM. Anything
 * else in the tree (a link, a device, a hard link) is refused: such a tree goes by --copy. */
static int copy_attrs(const char *to, const struct stat *st) {
    struct timespec ts[2] = {st->st_atim, st->st_mtim};
    if (lchown(to, st->st_uid, st->st_gid) < 0 || chmod(to, st->st_mode & 07777) < 0) return -1;
    return utimensat(AT_FDCWD, to, ts, AT_SYMLINK_NOFOLLOW);
}

static int copy_small(const char *from, const char *to, int depth) {
    struct stat top;
    if (depth > 16) { errno = ELOOP; return -1; }
    if (lstat(from, &top) < 0) return -1;
    if (!S_ISDIR(top.st_mode)) { errno = ENOTDIR; return -1; }
    DIR *d = opendir(from);
    if (!d) return -1;
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char s[PATH_MAX], t[PATH_MAX];
        struct stat st;
        if (snprintf(s, sizeof s, "%s/%s", from, e->d_name) >= (int)sizeof s ||
            snprintf(t, sizeof t, "%s/%s", to, e->d_name) >= (int)sizeof t) { errno = ENAMETOOLONG; rc = -1; break; }
        if (lstat(s, &st) < 0) { rc = -1; break; }
        if (S_ISDIR(st.st_mode)) {
            struct stat tt;
            if (mkdir(t, 0700) < 0 && errno != EEXIST) { rc = -1; break; }
            if (lstat(t, &tt) < 0 || !S_ISDIR(tt.st_mode)) { errno = ENOTDIR; rc = -1; break; }
            rc = copy_small(s, t, depth + 1);
        } else if (S_ISREG(st.st_mode) && st.st_nlink == 1) {
            int in = open(s, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
            int out = in < 0 ? -1 : open(t, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
            char b[8192];
            ssize_t k = 0;
            while (out >= 0 && (k = read(in, b, sizeof b)) > 0)
                if (write_all(out, b, (size_t)k) < 0) { k = -1; break; }
            if (in < 0 || out < 0 || k < 0) rc = -1;
            if (in >= 0) close(in);
            if (out >= 0 && close(out) < 0) rc = -1;
            if (rc == 0) rc = copy_attrs(t, &st);
        } else {
            errno = EINVAL;
            rc = -1;
        }
    }
    int k = errno;
    closedir(d);
    errno = k;
    return rc == 0 ? copy_attrs(to, &top) : -1;
}

/* Open directory PATH (absolute) for changing it, creating missing components, without
 * following a symlink anywhere on the way: an image that makes /logs (say) a symlink to a
 * host path must never make us chmod the host's file. Returns an O_DIRECTORY fd or -1. */
static int open_dir_nofollow(const char *path, int create, const char **bad) {
    char tmp[PATH_MAX];
    if (path[0] != '/' || snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) { errno = EINVAL; return -1; }
    int fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    char *save = NULL;
    for (char *c = strtok_r(tmp + 1, "/", &save); c && fd >= 0; c = strtok_r(NULL, "/", &save)) {
        if (!strcmp(c, "..")) { close(fd); errno = EINVAL; return -1; }
        if (!strcmp(c, ".")) continue;
        int next = openat(fd, c, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (next < 0 && errno == ENOENT && create) {
            if (mkdirat(fd, c, 0755) < 0 && errno != EEXIST) { int e = errno; close(fd); errno = e; return -1; }
            next = openat(fd, c, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        }
        if (next < 0) {
            int e = errno;
            struct stat st;
            if ((e == ENOTDIR || e == ELOOP) && fstatat(fd, c, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
                if (bad) *bad = "is a symlink";
                e = ELOOP;
            }
            close(fd);
            errno = e;
            return -1;
        }
        close(fd);
        fd = next;
    }
    if (fd < 0) return -1;
    char self[64];
    snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
    int rd = open(self, O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* reopen the very same directory */
    close(fd);
    return rd;
}

/* The last parent open_parent_nofollow() walked to: a run of --opaque and --whiteout options
 * (thirty-odd host directories and files, all in the same two or three upper directories)
 * walks each parent once. Dropped at any other option, which may mount over it. */
static char parent_cached[PATH_MAX];
static int parent_cached_fd = -1;
static void parent_cache_drop(void) {
    if (parent_cached_fd >= 0) close(parent_cached_fd);
    parent_cached_fd = -1;
    parent_cached[0] = 0;
}

/* The directory holding PATH's last component, opened as open_dir_nofollow does; *name is
 * that component (within PATH). -1 with errno EINVAL for a path without one. */
static int open_parent_nofollow(const char *p, const char **name, const char **bad) {
    char parent[PATH_MAX];
    const char *slash = strrchr(p, '/');
    if (!slash || !slash[1] || snprintf(parent, sizeof parent, "%.*s", (int)(slash - p), p) >= (int)sizeof parent) {
        errno = EINVAL;
        return -1;
    }
    *name = slash + 1;
    if (!parent[0]) strcpy(parent, "/");
    if (parent_cached_fd >= 0 && !strcmp(parent, parent_cached)) return fcntl(parent_cached_fd, F_DUPFD_CLOEXEC, 0);
    int fd = open_dir_nofollow(parent, 1, bad);
    if (fd < 0) return -1;
    parent_cache_drop();
    parent_cached_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (parent_cached_fd >= 0) strcpy(parent_cached, parent);
    return fd;
}

static int refuse(const char *what, const char *path, const char *bad) {
    if (bad) {
        fprintf(stderr, "sandfleet-agent launch: refused: %s: a path component %s (the image may not make "
                        "/logs, /tests, /solution, /oracle or the workdir a symlink)\n", path, bad);
        return 125;
    }
    return die(what, path);
}

/* --mkdir/--opaque: create PATH as a directory owned by UID:GID with MODE, never through a
 * symlink. --opaque also hides what the layers below have there (an existing non-directory
 * in the upper layer is replaced). */
static int prepare_dir(const char *p, const char *uid, const char *gid, const char *mode, int opaque) {
    const char *bad = NULL;
    struct stat st;
    int fd = -1;
    if (opaque) {
        const char *name;
        int pfd = open_parent_nofollow(p, &name, &bad);
        if (pfd < 0) return refuse("opaque", p, bad);
        int existed = fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0;
        if (existed && !S_ISDIR(st.st_mode)) {
            if (unlinkat(pfd, name, 0) < 0) { close(pfd); return die("replace", p); }
            existed = 0;
        }
        if (!existed && mkdirat(pfd, name, 0755) < 0 && errno != EEXIST) { close(pfd); return die("mkdir", p); }
        fd = openat(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        close(pfd);
        if (fd < 0) return die("open", p);
        if (!existed) { /* a directory a layer brought keeps its owner and mode */
            if (fchown(fd, atoi(uid), atoi(gid)) < 0) { close(fd); return die("chown", p); }
            if (fchmod(fd, strtol(mode, NULL, 8)) < 0) { close(fd); return die("chmod", p); }
        }
        if (fsetxattr(fd, "trusted.overlay.opaque", "y", 1, 0) < 0) { close(fd); return die("mark opaque", p); }
        close(fd);
        return 0;
    }
    fd = open_dir_nofollow(p, 1, &bad);
    if (fd < 0) return refuse("mkdir", p, bad);
    /* one that is as asked already is left alone: on the overlay a chown or chmod of a
     * directory of a lower layer copies it up (and its parents), a cost on every start for
     * /tmp and /var/tmp, which images make 1777 and root's already */
    uid_t u = (uid_t)atoi(uid);
    gid_t g = (gid_t)atoi(gid);
    mode_t m = (mode_t)strtol(mode, NULL, 8);
    if (fstat(fd, &st) == 0 && st.st_uid == u && st.st_gid == g && (st.st_mode & 07777) == m) {
        close(fd);
        return 0;
    }
    if (fchown(fd, u, g) < 0) { close(fd); return die("chown", p); }
    if (fchmod(fd, m) < 0) { close(fd); return die("chmod", p); }
    close(fd);
    return 0;
}

#ifndef MOUNT_ATTR_IDMAP
#define MOUNT_ATTR_IDMAP 0x00100000
#endif
#ifndef OPEN_TREE_CLONE
#define OPEN_TREE_CLONE 1
#endif
#ifndef MOVE_MOUNT_F_EMPTY_PATH
#define MOVE_MOUNT_F_EMPTY_PATH 0x00000004
#endif
/* (the new mount API's constants, from linux/mount.h, which a libc's sys/mount.h may lack:
 * musl's does, and including both clashes on older glibc) */
#ifndef MOUNT_ATTR_RDONLY
#define MOUNT_ATTR_RDONLY 0x00000001
#endif
#ifndef MOUNT_ATTR_NOSUID
#define MOUNT_ATTR_NOSUID 0x00000002
#endif
#ifndef MOUNT_ATTR_NODEV
#define MOUNT_ATTR_NODEV 0x00000004
#endif
#ifndef MOUNT_ATTR_NOEXEC
#define MOUNT_ATTR_NOEXEC 0x00000008
#endif
#ifndef FSOPEN_CLOEXEC
#define FSOPEN_CLOEXEC 0x00000001
#endif
#ifndef FSMOUNT_CLOEXEC
#define FSMOUNT_CLOEXEC 0x00000001
#endif
#ifndef FSCONFIG_CMD_CREATE
#define FSCONFIG_CMD_CREATE 6
#endif
struct sf_mount_attr { uint64_t attr_set, attr_clr, propagation, userns_fd; };

/* Mount a read-only clone of SRC at DST through which host uid i shows as uid i of the
 * user namespace (a base image owned by host root is then owned by the sandbox's root). */
static int idmap_mount(const char *src, const char *dst, int userns, int writable) {
    int t = (int)syscall(SYS_open_tree, AT_FDCWD, src, OPEN_TREE_CLONE | O_CLOEXEC);
    if (t < 0) return -1;
    struct sf_mount_attr a = {MOUNT_ATTR_IDMAP | (writable ? 0 : MOUNT_ATTR_RDONLY), 0, 0, (uint64_t)userns};
    if (syscall(SYS_mount_setattr, t, "", AT_EMPTY_PATH, &a, sizeof a) < 0 ||
        (mkdir(dst, 0755) < 0 && errno != EEXIST) ||
        syscall(SYS_move_mount, t, "", AT_FDCWD, dst, MOVE_MOUNT_F_EMPTY_PATH) < 0) {
        int e = errno;
        close(t);
        errno = e;
        return -1;
    }
    close(t);
    return 0;
}

/* The sandbox's mounts live in a mount namespace of their own: nothing leaks to the host. */
static int private_mounts(void) {
    if (unshare(CLONE_NEWNS) < 0) return -1;
    return mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
}

/* Per-namespace limits of P (--userns-max NAME VALUE): /proc/sys/user/max_NAME, which the
 * kernel looks up in the writer's user namespace, so they are written once we are in P. */
#define MAX_NS_LIMITS 16
static const char *ns_limit_name[MAX_NS_LIMITS], *ns_limit_value[MAX_NS_LIMITS];
static int n_ns_limits;

/* The "sys" directory of a procfs of our own: a new superblock, made while we are still
 * host root and never attached anywhere (fsopen, fsmount), gone with its last fd. Why: the
 * kernel keeps each user namespace's /proc/sys/user/max_NAME as a dentry of its own, and in
 * the one host /proc all of them (one per live sandbox) sit under the same parent in one
 * hash chain, which every lookup of that name walks: at 5,000 idle sandboxes the launchers'
 * 12 lookups each had the host at 90 % system time, most of it in proc_sys_compare. In a
 * procfs of our own the chain holds only ours. -1 (errno set) where the kernel has no fsopen
 * (before 5.2) or we may not make a procfs: the host /proc is used then. */
static int own_proc_sys(void) {
    int fs = (int)syscall(SYS_fsopen, "proc", FSOPEN_CLOEXEC);
    if (fs < 0) return -1;
    int mnt = -1, sys = -1;
    if (syscall(SYS_fsconfig, fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) == 0)
        mnt = (int)syscall(SYS_fsmount, fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC);
    if (mnt >= 0) sys = openat(mnt, "sys", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int e = errno;
    if (mnt >= 0) close(mnt);
    close(fs);
    errno = e;
    return sys;
}

/* Enter the sandbox's user namespace as its root: every capability there, none outside;
 * then set P's per-namespace limits (every count made in P and below is held to them). The
 * kernel looks a limit up in the writer's user namespace, so they are written once in P. */
static int enter_userns(int userns, int limits) {
    int sys = limits && n_ns_limits ? own_proc_sys() : -1;
    if (setns(userns, CLONE_NEWUSER) < 0 ||
        setgroups(0, NULL) < 0 || setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0) {
        int e = errno;
        if (sys >= 0) close(sys);
        errno = e;
        return -1;
    }
    if (!limits || !n_ns_limits) return 0;
    int dir = sys >= 0 ? openat(sys, "user", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
                       : open("/proc/sys/user", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int e = errno;
    if (sys >= 0) close(sys);
    if (dir < 0) {
        fprintf(stderr, "sandfleet-agent launch: open /proc/sys/user: %s\n", strerror(e));
        return -1;
    }
    for (int i = 0; i < n_ns_limits; i++) {
        char name[64];
        snprintf(name, sizeof name, "max_%s", ns_limit_name[i]);
        int fd = openat(dir, name, O_WRONLY | O_CLOEXEC);
        ssize_t n = (ssize_t)strlen(ns_limit_value[i]), w = fd < 0 ? -1 : write(fd, ns_limit_value[i], n);
        e = errno;
        if (fd >= 0) close(fd);
        if (w != n) {
            fprintf(stderr, "sandfleet-agent launch: set /proc/sys/user/%s: %s\n", name, strerror(e));
            close(dir);
            return -1;
        }
    }
    close(dir);
    return 0;
}


/* ---------- the sandbox's own namespaces, entered by the launcher (launch --sandbox) ---------- */
/* What bwrap did for a sandbox, done here without exec'ing it (one exec of a dynamically
 * linked program fewer per start, and no mount-table parse per bind: ~1 ms a sandbox here).
 * As root of P, the launcher forks the sandbox's pid 1 into new pid, mount, network, IPC, UTS
 * and cgroup namespaces (all owned by P); that child makes /dev, /proc and the binds over
 * the prepared root, pivots into it, and execs the guest agent with only the capabilities
 * it names, no_new_privs set, in a session of its own. The launcher stays as its parent (its
 * pidfd is the agent's lifeline) and exits with its status. docs/security.md, "The uid model". */
#define MAX_SANDBOX_BINDS 8
static const char *sb_root, *sb_hostname = "sandbox";
/* --mntns FD: the owner's mount namespace template (sandfleet-agent mntns-template); sb_at is
 * where the root's paths start: sb_root, or "" once the root is ours (the template's way) */
static int sb_mntns = -1;
static const char *sb_at;
static const char *sb_bind_src[MAX_SANDBOX_BINDS], *sb_bind_dst[MAX_SANDBOX_BINDS];
static int sb_bind_ro[MAX_SANDBOX_BINDS], n_sb_binds;
static uint64_t sb_caps; /* the capabilities the exec'd program keeps (bits) */
static const struct { const char *name; int cap; } cap_names[] = {
    {"CAP_CHOWN", CAP_CHOWN}, {"CAP_DAC_OVERRIDE", CAP_DAC_OVERRIDE}, {"CAP_FOWNER", CAP_FOWNER},
    {"CAP_KILL", CAP_KILL}, {"CAP_SETGID", CAP_SETGID}, {"CAP_SETUID", CAP_SETUID},
    {"CAP_SYS_PTRACE", CAP_SYS_PTRACE}, {"CAP_SYS_ADMIN", CAP_SYS_ADMIN}, {"CAP_SETFCAP", CAP_SETFCAP},
};

/* path = sb_root + inside (inside starts with '/') */
static int in_root(char *out, size_t n, const char *inside) {
    int k = snprintf(out, n, "%s%s", sb_at, inside);
    if (k < 0 || (size_t)k >= n) { errno = ENAMETOOLONG; return -1; }
    return 0;
}

/* Refuse a symbolic link anywhere in `inside` under the root, for the mounts made before the
 * pivot (/dev, /proc), when a link would resolve against the host's root: a mount point must
 * lie in the root, never lead out of it. Nothing else runs in the root yet: no race. */
static int no_links(const char *inside) {
    char p[PATH_MAX];
    if (in_root(p, sizeof p, inside) < 0) return -1;
    size_t base = strlen(sb_at);
    for (size_t i = base + 1; ; i++) {
        if (p[i] == '/' || p[i] == 0) {
            char c = p[i];
            p[i] = 0;
            struct stat st;
            int rc = lstat(p, &st);
            p[i] = c;
            if (rc == 0 && S_ISLNK(st.st_mode)) { errno = ELOOP; return -1; }
            if (rc < 0 && errno != ENOENT) return -1;
            if (c == 0) return 0;
        }
    }
}

/* The mount flags a bind of `path` must keep: those the kernel locks on a mount that came
 * from a more privileged namespace (a remount that drops one is refused). */
static unsigned long locked_flags(const char *path) {
    struct statvfs v;
    if (statvfs(path, &v) < 0) return 0;
    unsigned long f = 0;
    if (v.f_flag & ST_NOSUID) f |= MS_NOSUID;
    if (v.f_flag & ST_NODEV) f |= MS_NODEV;
    if (v.f_flag & ST_NOEXEC) f |= MS_NOEXEC;
    if (v.f_flag & ST_NOATIME) f |= MS_NOATIME;
    if (v.f_flag & ST_NODIRATIME) f |= MS_NODIRATIME;
    if (v.f_flag & ST_RELATIME) f |= MS_RELATIME;
    return f;
}

/* the host's device nodes a sandbox's /dev binds; with the template, cloned ahead (detached
 * mounts) while the host's /dev is still there */
static const char *dev_nodes[] = {"null", "zero", "full", "random", "urandom", "tty"};
#define N_DEV_NODES (sizeof dev_nodes / sizeof *dev_nodes)
static int sb_dev_fd[N_DEV_NODES] = {-1, -1, -1, -1, -1, -1};

static int sandbox_dev(const char **what) {
    char d[PATH_MAX], f[PATH_MAX + 16];
    *what = "/dev";
    if (no_links("/dev") < 0 || in_root(d, sizeof d, "/dev") < 0 || (mkdir(d, 0755) < 0 && errno != EEXIST)) return -1;
    if (mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755") < 0) return -1;
    for (size_t i = 0; i < N_DEV_NODES; i++) {
        char src[32];
        snprintf(src, sizeof src, "/dev/%s", dev_nodes[i]);
        snprintf(f, sizeof f, "%s/%s", d, dev_nodes[i]);
        *what = src;
        int fd = open(f, O_CREAT | O_WRONLY | O_CLOEXEC | O_NOFOLLOW, 0666);
        if (fd < 0) return -1;
        close(fd);
        if ((sb_dev_fd[i] >= 0 ? syscall(SYS_move_mount, sb_dev_fd[i], "", AT_FDCWD, f, MOVE_MOUNT_F_EMPTY_PATH)
                               : mount(src, f, NULL, MS_BIND, NULL)) < 0 ||
            (sb_dev_fd[i] >= 0 && close(sb_dev_fd[i]) < 0) ||
            mount(NULL, f, NULL, MS_BIND | MS_REMOUNT | MS_NOSUID | locked_flags(f), NULL) < 0)
            return -1;
    }
    static const char *links[][2] = {{"fd", "/proc/self/fd"}, {"stdin", "/proc/self/fd/0"},
                                     {"stdout", "/proc/self/fd/1"}, {"stderr", "/proc/self/fd/2"},
                                     {"core", "/proc/kcore"}, {"ptmx", "pts/ptmx"}};
    for (size_t i = 0; i < sizeof links / sizeof *links; i++) {
        snprintf(f, sizeof f, "%s/%s", d, links[i][0]);
        *what = f;
        if (symlink(links[i][1], f) < 0) return -1;
    }
    /* /dev/shm world-writable and sticky, a folder of /dev's tmpfs (docs: bwrap.py's _argv) */
    snprintf(f, sizeof f, "%s/shm", d);
    *what = f;
    if (mkdir(f, 01777) < 0 || chmod(f, 01777) < 0) return -1;
    snprintf(f, sizeof f, "%s/pts", d);
    *what = f;
    if (mkdir(f, 0755) < 0) return -1;
    return mount("devpts", f, "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620");
}

/* The binds, in two steps. Before the pivot: each source cloned as a detached mount (the host's
 * paths are still there). After it: each mount point made and the mount attached, with the
 * old root gone, so a path in the root resolves inside it (a link a snapshot's layer holds,
 * say /etc -> /tmp, leads to the sandbox's /tmp, never the host's), as bwrap's did. */
#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif
static int sb_bind_fd[MAX_SANDBOX_BINDS];

static int sandbox_binds_open(const char **what) {
    for (int i = 0; i < n_sb_binds; i++) {
        *what = sb_bind_src[i];
        sb_bind_fd[i] = (int)syscall(SYS_open_tree, AT_FDCWD, sb_bind_src[i],
                                     OPEN_TREE_CLONE | AT_RECURSIVE | O_CLOEXEC);
        if (sb_bind_fd[i] < 0) return -1;
    }
    return 0;
}

static int sandbox_binds_attach(const char **what) {
    for (int i = 0; i < n_sb_binds; i++) {
        const char *dst = sb_bind_dst[i];
        *what = dst;
        struct stat st;
        if (fstat(sb_bind_fd[i], &st) < 0) return -1;
        if (S_ISDIR(st.st_mode)) {
            if (mkdir(dst, 0755) < 0 && errno != EEXIST) return -1;
        } else if (stat(dst, &st) < 0) { /* (an existing one may be the host's: not ours to open) */
            int fd = open(dst, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
            if (fd < 0) return -1;
            close(fd);
        }
        if (syscall(SYS_move_mount, sb_bind_fd[i], "", AT_FDCWD, dst, MOVE_MOUNT_F_EMPTY_PATH) < 0) return -1;
        close(sb_bind_fd[i]);
        /* nosuid and nodev on every bind, as bwrap made them */
        if (mount(NULL, dst, NULL, MS_BIND | MS_REMOUNT | (sb_bind_ro[i] ? MS_RDONLY : 0) | MS_NOSUID | MS_NODEV |
                  locked_flags(dst), NULL) < 0)
            return -1;
    }
    return 0;
}

/* Keep only sb_caps: out of the bounding set (so no exec can regain the others), and the
 * permitted and effective sets exactly them; inheritable and ambient empty. */
static int sandbox_caps(void) {
    for (int c = 0; c <= 63; c++) {
        if (sb_caps & (1ULL << c)) continue;
        if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0) {
            if (errno == EINVAL) break; /* past the kernel's last capability */
            return -1;
        }
    }
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL) return -1;
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2];
    memset(d, 0, sizeof d);
    d[0].permitted = d[0].effective = (uint32_t)sb_caps;
    d[1].permitted = d[1].effective = (uint32_t)(sb_caps >> 32);
    return (int)syscall(SYS_capset, &h, d);
}

/* With the template (--mntns): what the child attaches once it is in a copy of the template,
 * where the host's paths are gone, cloned here ahead as detached mounts (open_tree) while we
 * are host root in the launcher's own mount namespace: the root, the device nodes, the binds. */
static int sb_root_fd = -1;

static int sandbox_open_ahead(const char **what) {
    *what = sb_root;
    sb_root_fd = (int)syscall(SYS_open_tree, AT_FDCWD, sb_root, OPEN_TREE_CLONE | AT_RECURSIVE | O_CLOEXEC);
    if (sb_root_fd < 0) return -1;
    for (size_t i = 0; i < N_DEV_NODES; i++) {
        char src[32];
        snprintf(src, sizeof src, "/dev/%s", dev_nodes[i]);
        *what = src;
        sb_dev_fd[i] = (int)syscall(SYS_open_tree, AT_FDCWD, src, OPEN_TREE_CLONE | O_CLOEXEC);
        if (sb_dev_fd[i] < 0) return -1;
    }
    return sandbox_binds_open(what);
}

/* In the sandbox's pid 1 (new namespaces, root of P): build the root and exec argv. Returns
 * only on failure (the step in *what, errno set).
 * The root is set one of two ways. With the template (sb_root_fd), our mount namespace is a
 * copy of the owner's template: an empty read-only tmpfs as its root (and a procfs of a pid
 * namespace with nobody in it, which the kernel wants visible before a user namespace mounts
 * another), nothing of the host's. The root is attached over that and made ours with chroot:
 * the host's mounts are not in the namespace to leave it for, and a command that climbs out
 * of a chroot of its own (root of S may chroot) lands on this root again, the mount stacked
 * where its `..` ends (test_launcher.py). Without it, the copy is of the launcher's namespace,
 * and pivot_root swaps the root and drops the host's: pivot_root walks every thread on the host
 * (chroot_fs_refs), a start that costs more the more sandboxes the host holds (issue 46). */
static void sandbox_child(char **argv, const char **what) {
    char p[PATH_MAX];
    *what = "die with the launcher";
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0) return;
    *what = "make the mounts private";
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) return;
    if (sb_root_fd >= 0) {
        /* the root over the template's, then ours: its paths from here on start at "/" */
        *what = "attach the root";
        if (syscall(SYS_move_mount, sb_root_fd, "", AT_FDCWD, "/", MOVE_MOUNT_F_EMPTY_PATH) < 0 ||
            fchdir(sb_root_fd) < 0 || chroot(".") < 0 || chdir("/") < 0)
            return;
        close(sb_root_fd);
        sb_at = "";
    } else {
        /* the root as a mount of this namespace's own: the one the launcher made is locked here
         * (it came from a more privileged namespace), and a locked mount can't be pivoted into */
        *what = "bind the root";
        if (mount(sb_root, sb_root, NULL, MS_BIND | MS_REC, NULL) < 0) return;
    }
    *what = "bring up the loopback";
    if (loopback_up() < 0) return;
    if (sandbox_dev(what) < 0) return;
    *what = "/proc";
    if (no_links("/proc") < 0 || in_root(p, sizeof p, "/proc") < 0 || (mkdir(p, 0555) < 0 && errno != EEXIST)) return;
    if (mount("proc", p, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0) return;
    if (sb_root_fd < 0) {
        if (sandbox_binds_open(what) < 0) return;
        /* the root: pivot onto it and drop the old one (pivot_root(".", ".") stacks the old root
         * on the new one; unmounting "." then removes the old) */
        *what = "pivot into the root";
        if (chdir(sb_root) < 0 || syscall(SYS_pivot_root, ".", ".") < 0 || umount2(".", MNT_DETACH) < 0 ||
            chdir("/") < 0)
            return;
    }
    if (sandbox_binds_attach(what) < 0) return;
    *what = "set the hostname";
    if (sethostname(sb_hostname, strlen(sb_hostname)) < 0) return;
    *what = "start a session";
    if (setsid() < 0) return;
    *what = "drop capabilities";
    if (sandbox_caps() < 0) return;
    *what = "set no_new_privs";
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) return;
    *what = argv[0];
    execv(argv[0], argv);
}

/* A step of the sandbox's start failed in a child of ours (`what`, errno set): its text to
 * `status_fd`, which the launcher prints, and the child's end */
static void sandbox_start_failed(int status_fd, const char *what) {
    char m[PATH_MAX + 128];
    int k = snprintf(m, sizeof m, "sandfleet-agent launch: sandbox %s: %s\n", what, strerror(errno));
    if (write(status_fd, m, k > 0 && (size_t)k < sizeof m ? (size_t)k : strlen(m)) < 0) {}
    _exit(125);
}

/* Fork the sandbox's pid 1 into its new namespaces (`extra`: CLONE_PARENT from the template's
 * helper, below); in the child, build it and exec argv, a failure's text to `status_fd`. */
static long sandbox_clone(char **argv, int status_fd, unsigned long extra) {
    unsigned long ns = CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | extra;
    long pid = syscall(SYS_clone, ns | CLONE_NEWCGROUP | SIGCHLD, NULL, NULL, NULL, NULL);
    if (pid < 0 && errno == EINVAL) /* a kernel without cgroup namespaces (before 4.6) */
        pid = syscall(SYS_clone, ns | SIGCHLD, NULL, NULL, NULL, NULL);
    if (pid == 0) {
        const char *what = "?";
        sandbox_child(argv, &what);
        sandbox_start_failed(status_fd, what);
    }
    return pid;
}

/* With the template: a helper (our child, still host root here) clones what the child needs,
 * enters the template's mount namespace and then P, and clones the sandbox's pid 1 with
 * CLONE_PARENT, so that it is our child as it is without the template; it sends us its pid
 * and is gone. We stay in our own mount namespace (the host reads the writable layer through
 * it) and enter P ourselves: enter_userns(userns, 0), without setting P's limits again. */
static long sandbox_clone_from_template(char **argv, int status_fd, int userns) {
    int pp[2];
    if (pipe2(pp, O_CLOEXEC) < 0) return -1;
    pid_t h = fork();
    if (h < 0) return -1;
    if (h == 0) {
        close(pp[0]);
        const char *what = "clone the mounts ahead";
        long pid = -1;
        if (sandbox_open_ahead(&what) == 0) {
            what = "enter the mount namespace template";
            if (setns(sb_mntns, CLONE_NEWNS) == 0 && close(sb_mntns) == 0) {
                what = "enter user namespace";
                if (userns < 0 || enter_userns(userns, 1) == 0) {
                    what = "make the sandbox's namespaces (clone)";
                    pid = sandbox_clone(argv, status_fd, CLONE_PARENT);
                }
            }
        }
        if (pid < 0) sandbox_start_failed(status_fd, what);
        int32_t v = (int32_t)pid;
        if (write(pp[1], &v, sizeof v) < 0) {}
        _exit(0);
    }
    close(pp[1]);
    int32_t v = -1;
    ssize_t r;
    while ((r = read(pp[0], &v, sizeof v)) < 0 && errno == EINTR) {}
    close(pp[0]);
    while (waitpid(h, NULL, 0) < 0 && errno == EINTR) {}
    if (r != (ssize_t)sizeof v || v <= 0) { errno = ECHILD; return -1; }
    return v;
}

/* Die with our owner (--pdeathsig): set after the last change of our uids, which clears it. */
static int tie_to_owner(pid_t owner) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    return getppid() == owner ? 0 : -1;
}

/* Root of P (entered here where the template is used, then tied to `owner` where not 0): fork
 * the sandbox's pid 1 and wait for it; our exit status is its. */
static int sandbox_run(char **argv, int userns, pid_t owner) {
    int status_pipe[2]; /* the child's failure, before its exec closes this */
    if (pipe2(status_pipe, O_CLOEXEC) < 0) return die("pipe", NULL);
    long pid;
    if (sb_mntns >= 0) {
        pid = sandbox_clone_from_template(argv, status_pipe[1], userns);
        if (pid > 0 && userns >= 0 && enter_userns(userns, 0) < 0) return die("enter user namespace", NULL);
        if (pid > 0 && owner && tie_to_owner(owner) < 0) return die("owner already gone", NULL);
    } else {
        pid = sandbox_clone(argv, status_pipe[1], 0);
    }
    if (pid < 0) {
        /* (the template's helper wrote why) */
        close(status_pipe[1]);
        char m[PATH_MAX + 128];
        ssize_t k = read(status_pipe[0], m, sizeof m);
        if (k > 0 && write(2, m, (size_t)k) < 0) {}
        return k > 0 ? 125 : die("make the sandbox's namespaces (clone)", NULL);
    }
    close(status_pipe[1]);
    /* The child holds the host's pipes now: ours would keep them open (no EOF to the host
     * when the agent ends) until we exit. stderr (the sandbox's log) stays. */
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null >= 0) { dup2(null, 0); dup2(null, 1); close(null); }
    char m[PATH_MAX + 128];
    ssize_t k;
    while ((k = read(status_pipe[0], m, sizeof m)) < 0 && errno == EINTR) {}
    close(status_pipe[0]);
    if (k > 0 && write(2, m, (size_t)k) < 0) {}
    int st = 0;
    while (waitpid((pid_t)pid, &st, 0) < 0) {
        if (errno != EINTR) return die("wait for the sandbox", NULL);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* `sandfleet-agent mntns-template DIR` (as host root; sandbox/mntns.py): the mount namespace
 * every sandbox's is copied from where the owner passes it (launch --mntns). Its root is an
 * empty read-only tmpfs (made over DIR in a namespace of our own, then pivoted into, the host's
 * mounts dropped: one pivot_root per owner, not per sandbox), holding only a procfs of a pid
 * namespace that nobody is left in: the kernel lets a user namespace mount a procfs only where
 * one is visible already (mount_too_revealing). Prints the pid of the namespace's process once
 * it is made; the owner opens /proc/PID/ns/mnt and closes our stdin: we end it and exit. */
static int mntns_template(int argc, char **argv) {
    host_mode = "mntns-template";
    if (argc != 1 || argv[0][0] != '/') { errno = EINVAL; return die("usage: sandfleet-agent mntns-template DIR", NULL); }
    const char *dir = argv[0];
    int ready[2];
    if (pipe2(ready, O_CLOEXEC) < 0) return die("pipe", NULL);
    if (unshare(CLONE_NEWPID) < 0) return die("make a pid namespace", NULL);
    pid_t p = fork();
    if (p < 0) return die("fork", NULL);
    if (p == 0) {
        close(ready[0]);
        char proc[PATH_MAX];
        const char *what = "die with the parent";
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0) goto fail;
        what = "make a private mount namespace";
        if (private_mounts() < 0) goto fail;
        what = "mount the tmpfs";
        if (mount("tmpfs", dir, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,nr_inodes=8,mode=0555") < 0) goto fail;
        what = "mount the procfs";
        if (snprintf(proc, sizeof proc, "%s/proc", dir) >= (int)sizeof proc || mkdir(proc, 0555) < 0 ||
            mount("proc", proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
            goto fail;
        what = "make it read-only";
        if (mount(NULL, dir, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
            goto fail;
        what = "pivot into it";
        if (chdir(dir) < 0 || syscall(SYS_pivot_root, ".", ".") < 0 || umount2(".", MNT_DETACH) < 0 || chdir("/") < 0)
            goto fail;
        char c = 1;
        if (write(ready[1], &c, 1) != 1) _exit(125);
        for (;;) pause();
    fail:
        _exit(die(what, dir));
    }
    close(ready[1]);
    char c = 0;
    ssize_t r;
    while ((r = read(ready[0], &c, 1)) < 0 && errno == EINTR) {}
    if (r != 1) {
        waitpid(p, NULL, 0);
        errno = ECHILD;
        return die("make the template", dir);
    }
    printf("%d\n", (int)p);
    fflush(stdout);
    char b[64];
    while ((r = read(0, b, sizeof b)) > 0 || (r < 0 && errno == EINTR)) {}
    kill(p, SIGKILL);
    waitpid(p, NULL, 0);
    return 0;
}

/* A descriptor number given as an argument (3 or more): it, or -1 */
static int fd_arg(const char *s) {
    char *end = NULL;
    long fd = strtol(s, &end, 10);
    return !*s || *end || fd < 3 || fd > INT_MAX ? -1 : (int)fd;
}

static int all_of(const char *s, const char *set) { return *s && strspn(s, set) == strlen(s); }

static int launch(int argc, char **argv) {
    int in_ns = 0, userns = -1, shiftns = -1, idmapns = -1, pdeath = 0;
    pid_t owner = 0;
    long ns_owner = -1; /* who owns the user namespaces we make (-1: we do, host root) */
    const char *after_from = NULL, *after_to = NULL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) {
            if (i + 1 >= argc) return die("nothing to exec", NULL);
            if (argv[i + 1][0] != '/') { errno = EINVAL; return die("not an absolute path", argv[i + 1]); }
            if (after_from) { /* run the command, then copy its writable layer out */
                /* bwrap returns before its own child (the pid namespace's init) has ended:
                 * that child comes back to us and is reaped below, not left to the caller */
                prctl(PR_SET_CHILD_SUBREAPER, 1);
                pid_t p = fork();
                if (p == 0) {
                    if (userns >= 0 && enter_userns(userns, 1) < 0) _exit(die("enter user namespace", NULL));
                    if (pdeath) prctl(PR_SET_PDEATHSIG, SIGKILL); /* a uid change clears it */
                    execv(argv[i + 1], argv + i + 1);
                    _exit(127);
                }
                int st = 0;
                if (p < 0 || waitpid(p, &st, 0) < 0) return die("run", argv[i + 1]);
                while (waitpid(-1, NULL, 0) > 0 || errno == EINTR) {}
                if (copy_tree(after_from, after_to) < 0) return die("copy layer out", after_from);
                return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            }
            /* the sandbox's OOM killer takes a command, not bwrap or the guest agent (which
             * put each command back at 0) */
            if (userns >= 0) write_str("/proc/self/oom_score_adj", "-998");
            /* (with the template, P is entered after the helper that needs host root: below) */
            if (sb_root && sb_mntns >= 0) return sandbox_run(argv + i + 1, userns, pdeath ? owner : 0);
            if (userns >= 0 && enter_userns(userns, 1) < 0) return die("enter user namespace", NULL);
            if (pdeath && tie_to_owner(owner) < 0) return die("owner already gone", NULL);
            if (sb_root) return sandbox_run(argv + i + 1, -1, 0);
            execv(argv[i + 1], argv + i + 1);
            return die("exec", argv[i + 1]);
        }
        if (!strcmp(a, "--sandbox") && i + 1 < argc) { /* ROOT: enter the namespaces here (above) */
            sb_at = sb_root = argv[++i];
            if (sb_root[0] != '/') { errno = EINVAL; return die("--sandbox needs an absolute path", sb_root); }
            continue;
        }
        if ((!strcmp(a, "--sandbox-bind") || !strcmp(a, "--sandbox-ro-bind")) && i + 2 < argc) {
            /* SRC DST: bind SRC (as the host sees it) on DST inside the sandbox's root */
            if (n_sb_binds == MAX_SANDBOX_BINDS || argv[i + 2][0] != '/') {
                errno = EINVAL;
                return die("bad --sandbox-bind", argv[i + 2]);
            }
            sb_bind_src[n_sb_binds] = argv[i + 1];
            sb_bind_dst[n_sb_binds] = argv[i + 2];
            sb_bind_ro[n_sb_binds++] = a[10] == 'r';
            i += 2;
            continue;
        }
        if (!strcmp(a, "--mntns") && i + 1 < argc) { /* FD: the template (sandfleet-agent mntns-template) */
            if ((sb_mntns = fd_arg(argv[i + 1])) < 0) { errno = EINVAL; return die("bad --mntns", argv[i + 1]); }
            if (fcntl(sb_mntns, F_SETFD, FD_CLOEXEC) < 0) return die("--mntns", argv[i + 1]); /* never the sandbox's */
            i += 1;
            continue;
        }
        if (!strcmp(a, "--hostname") && i + 1 < argc) {
            sb_hostname = argv[++i];
            continue;
        }
        if (!strcmp(a, "--keep-cap") && i + 1 < argc) { /* NAME: the sandbox's program keeps it */
            size_t c = 0;
            while (c < sizeof cap_names / sizeof *cap_names && strcmp(cap_names[c].name, argv[i + 1])) c++;
            if (c == sizeof cap_names / sizeof *cap_names) { errno = EINVAL; return die("unknown --keep-cap", argv[i + 1]); }
            sb_caps |= 1ULL << cap_names[c].cap;
            i += 1;
            continue;
        }
        if (!strcmp(a, "--copy-after") && i + 2 < argc) {
            after_from = argv[i + 1];
            after_to = argv[i + 2];
            i += 2;
            continue;
        }
        if (strcmp(a, "--opaque") && strcmp(a, "--whiteout")) parent_cache_drop();
        if (!strcmp(a, "--cgroup") && i + 1 < argc) {
            /* FILE: cgroup.procs, or on v1 the cheaper `tasks` (we are single-threaded: see
             * the per-command cgroups above); "0" is this process */
            if (write_str(argv[++i], "0") < 0) return die("join cgroup", argv[i]);
        } else if (!strcmp(a, "--disk-fd") && i + 2 < argc) {
            /* FD DIR: the disk limit, an ext4 filesystem on a loop device, mounted ahead by the
             * caller (fsmount in sandbox/disk.py, off the sandbox's start path) and handed over
             * as a detached mount: attach it. Its pages are file cache, so writing past it is
             * ENOSPC, never an OOM kill. */
            if (!in_ns && private_mounts() < 0) return die("make a private mount namespace", NULL);
            in_ns = 1;
            int fd = fd_arg(argv[i + 1]);
            if (fd < 0) { errno = EINVAL; return die("bad --disk-fd", argv[i + 1]); }
            if (syscall(SYS_move_mount, fd, "", AT_FDCWD, argv[i + 2], MOVE_MOUNT_F_EMPTY_PATH) < 0)
                return die("attach the disk", argv[i + 2]);
            close(fd);
            i += 2;
        } else if (!strcmp(a, "--scratch") && i + 1 < argc) {
            /* DIR: a small tmpfs over DIR in our private mount namespace, for the mount
             * points below it (the writable layer, the root): made and gone with the
             * namespace, never directories on the host's disk to create and remove (an ext4
             * rmdir waits on its journal, milliseconds on a busy disk) */
            if (!in_ns && private_mounts() < 0) return die("make a private mount namespace", NULL);
            in_ns = 1;
            if (mount("tmpfs", argv[i + 1], "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755") < 0)
                return die("mount scratch tmpfs", argv[i + 1]);
            i += 1;
        } else if (!strcmp(a, "--tmpfs") && i + 2 < argc) {
            if (!in_ns && private_mounts() < 0) return die("make a private mount namespace", NULL);
            in_ns = 1;
            char opt[64];
            snprintf(opt, sizeof opt, "size=%s,mode=0755", argv[i + 2]);
            if (mount("tmpfs", argv[i + 1], "tmpfs", MS_NOSUID | MS_NODEV, opt) < 0) return die("mount tmpfs", argv[i + 1]);
            i += 2;
        } else if (!strcmp(a, "--userns-owner") && i + 1 < argc) { /* UID: owns what --userns/--shift-ns make */
            char *end = NULL;
            ns_owner = strtol(argv[i + 1], &end, 10);
            if (*end || ns_owner < 1 || ns_owner > 0xfffffffeL) { errno = EINVAL; return die("bad --userns-owner", argv[i + 1]); }
            i += 1;
        } else if (!strcmp(a, "--userns-max") && i + 2 < argc) { /* NAME VALUE: P's /proc/sys/user/max_NAME */
            if (n_ns_limits == MAX_NS_LIMITS || !all_of(argv[i + 1], "abcdefghijklmnopqrstuvwxyz_") ||
                !all_of(argv[i + 2], "0123456789")) { errno = EINVAL; return die("bad --userns-max", argv[i + 1]); }
            ns_limit_name[n_ns_limits] = argv[i + 1];
            ns_limit_value[n_ns_limits++] = argv[i + 2];
            i += 2;
        } else if (!strcmp(a, "--userns") && i + 2 < argc) { /* BASE COUNT */
            long base = atol(argv[i + 1]), count = atol(argv[i + 2]);
            if (base < 1 || count < 1) { errno = EINVAL; return die("bad --userns range", argv[i + 1]); }
            userns = new_userns(base, count, ns_owner);
            if (userns < 0) return die("make user namespace", argv[i + 1]);
            i += 2;
        } else if (!strcmp(a, "--shift-ns") && i + 3 < argc) {
            /* FROM TO COUNT: through --shift mounts host uid FROM+i shows as TO+i, and host
             * root stays itself (overlayfs makes its work files as the mounter, host root) */
            long from = atol(argv[i + 1]), to = atol(argv[i + 2]), count = atol(argv[i + 3]);
            if (from < 1 || to < 1 || count < 1) { errno = EINVAL; return die("bad --shift-ns range", argv[i + 1]); }
            if (shiftns >= 0) close(shiftns);
            shiftns = new_userns_at(from, to, count, ns_owner, 1);
            if (shiftns < 0) return die("make the shifting user namespace", argv[i + 1]);
            i += 3;
        } else if (!strcmp(a, "--idmap-ns") && i + 2 < argc) {
            /* BASE COUNT: as --userns for --idmap, but not entered: what we exec stays host
             * root (runsc, whose gofer takes the sandbox's uids from its OCI spec) */
            long base = atol(argv[i + 1]), count = atol(argv[i + 2]);
            if (base < 1 || count < 1) { errno = EINVAL; return die("bad --idmap-ns range", argv[i + 1]); }
            if (idmapns >= 0) close(idmapns);
            idmapns = new_userns(base, count, ns_owner);
            if (idmapns < 0) return die("make the idmapping user namespace", argv[i + 1]);
            i += 2;
        } else if (!strcmp(a, "--idmap") && i + 2 < argc) { /* SRC DST, through --idmap-ns, else --userns */
            int ns = idmapns >= 0 ? idmapns : userns;
            if (ns < 0) { errno = EINVAL; return die("--idmap needs --userns or --idmap-ns first", argv[i + 1]); }
            if (idmap_mount(argv[i + 1], argv[i + 2], ns, 0) < 0) return die("idmapped mount of", argv[i + 1]);
            i += 2;
        } else if ((!strcmp(a, "--shift") || !strcmp(a, "--shift-rw")) && i + 2 < argc) { /* SRC DST, through --shift-ns */
            if (shiftns < 0) { errno = EINVAL; return die("--shift needs --shift-ns first", argv[i + 1]); }
            if (idmap_mount(argv[i + 1], argv[i + 2], shiftns, a[7] == '-') < 0) return die("shifted mount of", argv[i + 1]);
            i += 2;
        } else if (!strcmp(a, "--overlay") && i + 4 < argc) {
            char opt[PATH_MAX * 3];
            snprintf(opt, sizeof opt, "lowerdir=%s,upperdir=%s,workdir=%s,volatile", argv[i + 1], argv[i + 2], argv[i + 3]);
            if (mount("overlay", argv[i + 4], "overlay", MS_NOSUID | MS_NODEV, opt) < 0) return die("mount overlay", argv[i + 4]);
            i += 4;
        } else if (!strcmp(a, "--mkdir") && i + 4 < argc) { /* PATH UID GID MODE(octal) */
            int rc = prepare_dir(argv[i + 1], argv[i + 2], argv[i + 3], argv[i + 4], 0);
            if (rc) return rc;
            i += 4;
        } else if ((!strcmp(a, "--bind") || !strcmp(a, "--ro-bind")) && i + 2 < argc) {
            if (mount(argv[i + 1], argv[i + 2], NULL, MS_BIND | MS_REC, NULL) < 0) return die("bind", argv[i + 2]);
            if (a[2] == 'r' && mount(NULL, argv[i + 2], NULL, MS_BIND | MS_REMOUNT | MS_RDONLY, NULL) < 0)
                return die("remount read-only", argv[i + 2]);
            i += 2;
        } else if (!strcmp(a, "--user") && i + 2 < argc) { /* UID GID: drop privileges */
            gid_t g = atoi(argv[i + 2]);
            if (setgroups(0, NULL) < 0 || setresgid(g, g, g) < 0 || setresuid(atoi(argv[i + 1]), atoi(argv[i + 1]), atoi(argv[i + 1])) < 0)
                return die("drop privileges to", argv[i + 1]);
            i += 2;
        } else if (!strcmp(a, "--opaque") && i + 4 < argc) { /* PATH UID GID MODE: hide lower */
            int rc = prepare_dir(argv[i + 1], argv[i + 2], argv[i + 3], argv[i + 4], 1);
            if (rc) return rc;
            i += 4;
        } else if (!strcmp(a, "--whiteout") && i + 1 < argc) { /* PATH: hide a lower's file */
            const char *p = argv[++i], *bad = NULL, *name;
            int pfd = open_parent_nofollow(p, &name, &bad);
            if (pfd < 0) return refuse("whiteout", p, bad);
            unlinkat(pfd, name, 0);
            int rc = mknodat(pfd, name, S_IFCHR | 0600, makedev(0, 0));
            close(pfd);
            if (rc < 0 && errno != EEXIST) return die("whiteout", p);
        } else if (!strcmp(a, "--copy") && i + 2 < argc) { /* SRC DST: cp -a SRC/. DST */
            if (copy_tree(argv[i + 1], argv[i + 2]) < 0) return die("copy layer", argv[i + 1]);
            i += 2;
        } else if (!strcmp(a, "--copy-small") && i + 2 < argc) { /* SRC DST: the same, folders and files only */
            if (copy_small(argv[i + 1], argv[i + 2], 0) < 0) return die("copy small layer", argv[i + 1]);
            i += 2;
        } else if (!strcmp(a, "--lifeline")) {
            /* A pidfd of this process, which is about to become bwrap, kept across the exec
             * and named to the guest agent in LIFELINE_ENV. As the pid namespace's init (bwrap
             * --as-pid-1), the agent can't die with bwrap by PR_SET_PDEATHSIG: the kernel
             * checks that signal's permission, and bwrap (root of P) may not signal the agent
             * once it has dropped to its own uid. It sees bwrap's end, whoever caused it, on
             * this pidfd (readable once bwrap has exited), and ends the sandbox. */
            int pfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
            char v[16];
            if (pfd < 0 || fcntl(pfd, F_SETFD, 0) < 0) return die("lifeline (pidfd_open)", NULL);
            snprintf(v, sizeof v, "%d", pfd);
            if (setenv(LIFELINE_ENV, v, 1) < 0) return die("lifeline", NULL);
        } else if (!strcmp(a, "--pdeathsig") && i + 1 < argc) {
            /* OWNER: our parent's pid, as it knows it. Die with it; gone already if our
             * parent is someone else (not "is 1": the owner may be PID 1 of a container, and
             * an orphan goes to a subreaper where there is one) */
            char *end = NULL;
            long o = strtol(argv[++i], &end, 10);
            if (!*argv[i] || *end || o < 1 || o > INT_MAX) { errno = EINVAL; return die("bad --pdeathsig owner", argv[i]); }
            owner = (pid_t)o;
            pdeath = 1;
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != owner) return die("owner already gone", NULL);
        } else {
            errno = EINVAL;
            return die("bad option", a);
        }
    }
    errno = EINVAL;
    return die("missing --", NULL);
}

/* tether OWNER -- ARGV: run ARGV as our child, and end it when OWNER (our parent process,
 * whichever of its threads started us) has exited, or when we die ourselves (the child's
 * PR_SET_PDEATHSIG names us, a single-threaded parent; a PR_SET_PDEATHSIG set by a
 * multi-threaded owner fires when the thread that forked ends, not the process). Exits with
 * the child's status, or 0 once it has killed the child for an owner gone. For the helpers
 * a sandbox needs that would otherwise outlive an owner killed with SIGKILL (pasta, which
 * as a daemon moves to a pid namespace of its own and has no parent to die with). */
static int tether(int argc, char **argv) {
    host_mode = "tether";
    char *end = NULL;
    long o = argc > 0 ? strtol(argv[0], &end, 10) : 0;
    if (argc < 3 || !*argv[0] || *end || o < 1 || o > INT_MAX || strcmp(argv[1], "--")) {
        errno = EINVAL;
        return die("usage: sandfleet-agent tether OWNER -- /ABSOLUTE/PATH [ARG...]", NULL);
    }
    if (argv[2][0] != '/') { errno = EINVAL; return die("not an absolute path", argv[2]); }
    /* the pidfd names the owner only while it is still our parent (not a reused pid); a
     * kernel without pidfds (before 5.3): we look at our parent every 100 ms instead */
    int ofd = (int)syscall(SYS_pidfd_open, (pid_t)o, 0);
    if ((ofd < 0 && errno != ENOSYS) || getppid() != (pid_t)o) {
        errno = ESRCH;
        return die("owner already gone: not our parent", argv[0]);
    }
    pid_t me = getpid();
    pid_t c = fork();
    if (c < 0) return die("fork", NULL);
    if (c == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != me) _exit(127);
        close(ofd);
        execv(argv[2], argv + 2);
        _exit(die("exec", argv[2]));
    }
    int cfd = ofd >= 0 ? (int)syscall(SYS_pidfd_open, c, 0) : -1;
    for (;;) {
        /* a negative fd is ignored by poll: then the 100 ms timeout is our clock */
        struct pollfd p[2] = {{cfd, POLLIN, 0}, {ofd, POLLIN, 0}};
        int n = poll(p, 2, cfd >= 0 ? -1 : 100);
        if (n < 0 && errno != EINTR) return die("poll", NULL);
        int st = 0;
        if (cfd < 0 || (n > 0 && p[0].revents)) { /* the child ended: its status is ours */
            pid_t w = waitpid(c, &st, cfd < 0 ? WNOHANG : 0);
            if (w == c) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            if (w < 0 && errno != EINTR) return die("wait", NULL);
        }
        if ((n > 0 && p[1].revents) || (ofd < 0 && getppid() != (pid_t)o)) { /* the owner ended: so does its helper */
            kill(c, SIGKILL);
            while (waitpid(c, &st, 0) < 0 && errno == EINTR) {}
            return 0;
        }
    }
}

#include "prepare.c"
#include "untar.c"
#include "spawner.c"

/* sandfleet-agent prepare|untar|stat|procs|envs-record|envs-changes ...: the helper argv[1] names (run as a command: run_helper), or NULL */
static helper_fn helper_of(int argc, char **argv) {
    static const struct { const char *name; helper_fn fn; } helpers[] = {
        {"prepare", prepare}, {"untar", untar}, {"stat", stat_files}, {"procs", procs},
        {"envs-record", envs_record}, {"envs-changes", envs_changes}};
    for (size_t i = 0; argc > 1 && i < sizeof helpers / sizeof *helpers; i++)
        if (!strcmp(argv[1], helpers[i].name)) return helpers[i].fn;
    return NULL;
}

int main(int argc, char **argv) {
    int isolate_wanted = 0;
    if (argc > 1 && !strcmp(argv[1], "launch")) return launch(argc - 2, argv + 2);
    helper_fn helper = helper_of(argc, argv);
    if (helper) return helper(argc - 2, argv + 2);
    self_path = argv[0];
    if (argc > 1 && !strcmp(argv[1], "tether")) return tether(argc - 2, argv + 2);
    if (argc > 1 && !strcmp(argv[1], "spawner")) return spawner(argc - 2, argv + 2);
    if (argc > 1 && !strcmp(argv[1], "mntns-template")) return mntns_template(argc - 2, argv + 2);
    double ttl = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) {
            int fd = open(argv[++i], O_RDWR | O_CLOEXEC | O_NOCTTY);
            if (fd < 0) { perror(argv[i]); return 66; }
            in_fd = out_fd = fd;
        } else if (!strcmp(argv[i], "--ttl") && i + 1 < argc) {
            ttl = atof(argv[++i]);
        } else if (!strcmp(argv[i], "--isolate")) {
            isolate_wanted = 1;
        } else if (!strcmp(argv[i], "--switch-users")) {
            /* As root of a sandbox whose kernel is not the host's (gVisor's Sentry, which
             * can't setns into a user namespace): commands take their users directly. */
            isolate_wanted = 2;
        } else if (!strcmp(argv[i], "--preload") && i + 1 < argc) {
            g_preload = argv[++i];
        } else if (!strcmp(argv[i], "--cgroup-dir") && i + 1 < argc) {
            snprintf(cg_dir, sizeof cg_dir, "%s", argv[++i]);
        } else if (!strcmp(argv[i], "--version")) {
            printf("sandfleet-agent protocol %s\n", PROTO_VERSION);
            return 0;
        } else {
            fprintf(stderr, "usage: sandfleet-agent [--device PATH] [--ttl SECONDS] [--isolate | --switch-users] "
                            "[--cgroup-dir DIR] [--preload LIB] | launch ... | tether OWNER -- ARGV | spawner | prepare OWNER PATH... | untar DEST | stat PATH...\n");
            return 64;
        }
    }
    const char *life = getenv(LIFELINE_ENV); /* launch --lifeline: bwrap's pidfd */
    if (life) {
        char *end = NULL;
        long fd = strtol(life, &end, 10);
        if (*life && !*end && fd > 2 && fd < INT_MAX && fcntl((int)fd, F_SETFD, FD_CLOEXEC) == 0) life_fd = (int)fd;
        unsetenv(LIFELINE_ENV);
    }
    if (cg_dir[0]) {
        char f[300];
        snprintf(f, sizeof f, "%s/cgroup.kill", cg_dir);
        cg_v2 = access(f, F_OK) == 0;
        snprintf(f, sizeof f, "%s/tasks", cg_dir);
        cg_tasks = !cg_v2 && access(f, F_OK) == 0;
        if (access(cg_dir, W_OK) < 0) cg_dir[0] = 0; /* not delegated to us: kill by process tree */
    }
    char adj[16] = "";
    int afd = open("/proc/self/oom_score_adj", O_RDONLY | O_CLOEXEC);
    if (afd >= 0) {
        if (read(afd, adj, sizeof adj - 1) < 0) adj[0] = 0;
        close(afd);
    }
    oom_protected = atoi(adj) < 0;
    if (isolate_wanted == 1 && isolate() < 0) return 77;
    if (isolate_wanted == 2) {
        prctl(PR_SET_DUMPABLE, 0);
        clearenv();
        isolated = 1;
    }
    return serve(ttl);
}
