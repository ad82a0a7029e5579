/*
 * `sandfleet-agent prepare OWNER [t:PATH | r:PATH | w:PATH ...]`: the verifier's PREPARE
 * (src/sandfleet/rollout/verifier.py) in one process, with system calls where the script
 * starts about twenty programs (mkdir, find, chmod, chown, mktemp, cat, env, ...).
 *
 * The script stays the definition: this does each of its steps the same way, prints the
 * same lines in the same order, and takes the same environment (PY_GUARD, SEAL_ARCH, DEMOTE,
 * SPLIT, AGENT_USER, TESTS_HOME, PY_DIR, CODE_HOME, TESTS_PATH) and stdin (the seal). Two steps stay the script's:
 * a workdir with anything git could read (its sanitizer, SANDFLEET_GIT_SCRIPT, runs as a bash
 * child) and whatever this code does not handle. Then it exits 75 (EX_TEMPFAIL) at once,
 * before its first change where it can tell beforehand (a user given by name, an image whose
 * programs are not of a known architecture), and otherwise at the first step that fails: the
 * caller runs the script, whose steps may all run twice (each is idempotent; the seal's line
 * in /etc/ld.so.preload is written after the last step that gives up). Exit 1: a step after
 * that failed (the preparation failed, as the script's `set -e` would say). Any other status
 * (a crash, an older agent's usage) and the caller runs the script too.
 */
#include <sys/random.h>

#define PREP_SCRIPT 75
#define PREP_MAX_DEPTH 200

static void prep_give_up(const char *what, const char *path) {
    int e = errno;
    fprintf(stderr, "sandfleet-agent prepare: %s%s%s: %s (the script does it)\n", what, path ? " " : "",
            path ? path : "", e ? strerror(e) : "not handled here");
    fflush(stdout);
    _exit(PREP_SCRIPT);
}

/* a note's path on one line: a newline in a name of the agent's is printed as \\n (the values that
   follow the notes are the caller's to trust) */
static void prep_note(buf_t *b, const char *kind, const char *path) {
    buf_add(b, kind, strlen(kind));
    for (const char *p = path; *p; p++) {
        if (*p == '\n') buf_add(b, "\\n", 2);
        else buf_add(b, p, 1);
    }
    buf_add(b, "\n", 1);
}

static int prep_numeric(const char *s) {
    if (!s || !*s) return 0;
    for (const char *p = s; *p; p++)
        if (*p < '0' || *p > '9') return 0;
    return strlen(s) < 10;
}

/* rm -rf NAME (at dirfd): a link or file is unlinked, a folder emptied and removed; never follows a link */
static int prep_rm_at(int dirfd, const char *name, int depth) {
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(st.st_mode)) return unlinkat(dirfd, name, 0) < 0 && errno != ENOENT ? -1 : 0;
    if (depth > PREP_MAX_DEPTH) { errno = ELOOP; return -1; }
    for (int pass = 0; pass < 3; pass++) {
        int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) return -1;
        DIR *d = fdopendir(fd);
        if (!d) { close(fd); return -1; }
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            if (prep_rm_at(fd, e->d_name, depth + 1) < 0) { int k = errno; closedir(d); errno = k; return -1; }
        }
        closedir(d);
        if (unlinkat(dirfd, name, AT_REMOVEDIR) == 0 || errno == ENOENT) return 0;
        if (errno != ENOTEMPTY && errno != EEXIST) return -1;
    }
    return -1;
}

static int prep_rm(const char *path) { return prep_rm_at(AT_FDCWD, path, 0); }

/* mkdir -p PATH (mode 0777 & ~umask; an existing link to a folder on the way is followed) */
static int prep_mkdir_p(const char *path) {
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) { errno = ENAMETOOLONG; return -1; }
    for (char *p = tmp + 1;; p++)
        if (*p == '/' || !*p) {
            char c = *p;
            *p = 0;
            if (mkdir(tmp, 0777) < 0 && errno != EEXIST) return -1;
            *p = c;
            if (!c) break;
        }
    struct stat st;
    if (stat(path, &st) < 0) return -1;
    if (!S_ISDIR(st.st_mode)) { errno = ENOTDIR; return -1; }
    return 0;
}

static int prep_is_link_or_nondir(const char *p) { /* [ -L p ] || { [ -e p ] && [ ! -d p ]; } */
    struct stat st;
    if (lstat(p, &st) == 0 && S_ISLNK(st.st_mode)) return 1;
    return stat(p, &st) == 0 && !S_ISDIR(st.st_mode);
}

/* trust_parents: every folder above a reward folder a real folder, root's, not writable by others */
static void prep_trust_parents(const char *d) {
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s", d) >= (int)sizeof p) { errno = ENAMETOOLONG; prep_give_up("path", d); }
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (prep_is_link_or_nondir(p)) {
            if (prep_rm(p) < 0) prep_give_up("rm -rf", p);
            printf("rewardpath: replaced %s\n", p);
        }
        struct stat st;
        if (stat(p, &st) < 0 || !S_ISDIR(st.st_mode)) {
            if (mkdir(p, 0755) < 0 || chmod(p, 0755) < 0) prep_give_up("mkdir", p);
        }
        if (lstat(p, &st) < 0) prep_give_up("lstat", p);
        if ((st.st_uid != 0 || st.st_gid != 0) && chown(p, 0, 0) < 0) prep_give_up("chown", p);
        mode_t m = st.st_mode & 07777;
        if (!(m & 01000) && (m & 022) && chmod(p, m & ~(mode_t)022) < 0) prep_give_up("chmod", p);
        *s = '/';
    }
}

/* A walk that never follows a link: fn(path, name, st, depth) for each entry below `root`
 * (depth 1 and on; not `root` itself), pre-order, in the order readdir gives (as find's).
 * `xdev`: no descent into a folder of another filesystem. Stops at `maxdepth` (0: none).
 * Returns -1 where a folder could not be read and `strict`, or the walk ran too deep. */
typedef int (*prep_visit)(const char *path, const char *name, const struct stat *st, int depth, void *ctx);

static int prep_walk_dir(int fd, char *path, size_t len, int depth, int maxdepth, dev_t dev, int xdev, int strict,
                         prep_visit fn, void *ctx) {
    DIR *d = fdopendir(fd);
    if (!d) { close(fd); return strict ? -1 : 0; }
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        size_t n = strlen(e->d_name);
        if (len + 1 + n + 1 > PATH_MAX) { errno = ENAMETOOLONG; rc = -1; break; }
        path[len] = '/';
        memcpy(path + len + 1, e->d_name, n + 1);
        struct stat st;
        if (fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
            if (strict) rc = -1;
            path[len] = 0;
            continue;
        }
        if (fn(path, e->d_name, &st, depth, ctx) < 0) { rc = -1; break; }
        if (S_ISDIR(st.st_mode) && (!maxdepth || depth < maxdepth) && (!xdev || st.st_dev == dev)) {
            if (depth + 1 > PREP_MAX_DEPTH) { errno = ELOOP; rc = -1; break; }
            int sub = openat(fd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub < 0) {
                if (strict) rc = -1;
            } else if (prep_walk_dir(sub, path, len + 1 + n, depth + 1, maxdepth, dev, xdev, strict, fn, ctx) < 0) {
                rc = -1;
            }
        }
        path[len] = 0;
    }
    int k = errno;
    closedir(d);
    errno = k;
    return rc;
}

/* walk below root; -1 when root is not a folder (strict) or the walk failed */
static int prep_walk(const char *root, int maxdepth, int xdev, int strict, prep_visit fn, void *ctx) {
    char path[PATH_MAX];
    size_t len = strlen(root);
    if (len + 1 >= sizeof path) { errno = ENAMETOOLONG; return -1; }
    memcpy(path, root, len + 1);
    struct stat st;
    if (lstat(root, &st) < 0 || !S_ISDIR(st.st_mode)) return strict ? -1 : 0;
    int fd = open(root, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return strict ? -1 : 0;
    while (len > 1 && path[len - 1] == '/') path[--len] = 0; /* find prints "d/x" for "d/" as "d//x": rare, kept simple */
    return prep_walk_dir(fd, path, len, 1, maxdepth, st.st_dev, xdev, strict, fn, ctx);
}

/* ---- the workdir's git: anything sanitize_git would act on (the script's walk, the same tests) */
static int prep_gitlike(const char *dir) {
    static const char *const names[] = {"HEAD", "commondir", "objects", "refs"};
    char p[PATH_MAX];
    struct stat st;
    for (int i = 0; i < 4; i++) {
        if (snprintf(p, sizeof p, "%s/%s", dir, names[i]) >= (int)sizeof p) return 1;
        if (lstat(p, &st) == 0) return 1;
    }
    return 0;
}

static int prep_git_visit(const char *path, const char *name, const struct stat *st, int depth, void *ctx) {
    (void)depth;
    int *found = ctx;
    int file_or_link = S_ISREG(st->st_mode) || S_ISLNK(st->st_mode);
    int dir_or_link = S_ISDIR(st->st_mode) || S_ISLNK(st->st_mode);
    if ((!strcmp(name, ".git") || !strcmp(name, "commondir")) && file_or_link) *found = 1;
    else if (!strcmp(name, "config.worktree") && file_or_link) *found = 1;
    else if ((!strcmp(name, "config") && file_or_link) || (!strcmp(name, "hooks") && dir_or_link)) {
        char parent[PATH_MAX];
        size_t n = strlen(path) - strlen(name) - 1;
        memcpy(parent, path, n);
        parent[n] = 0;
        if (prep_gitlike(parent)) *found = 1;
    }
    return 0;
}

/* ---- the image's programs the preparation runs: the seal's probe (`true`), the workdir's git sanitizer (bash,
 * git and the tools of its script). Where the agent was root (shared mode; on microvm every command is root) they
 * may be the agent's: a static `true` first on PATH ran as root, unsealed, while the seal and the guards were
 * being written, and left a daemon that wrote 1 into the reward file after the tests (stop 74's
 * prep-probe-static-true, forged on microvm). So each runs in a Landlock domain of ours, with no_new_privs: it
 * may write beneath the folders its step needs (the workdir for the sanitizer; nothing but /dev/null for the
 * probe) and nowhere else -- not the reward, tests or guard folders, not the image -- nor signal (ABI 6) or
 * trace anything outside its domain; and nothing it leaves running outlives it (prepare is the subreaper of
 * what they start: prep_reap_rest). Where the kernel has no Landlock (gVisor) the domain is not made; the
 * reaping is. */
#ifndef __NR_landlock_create_ruleset
#define __NR_landlock_create_ruleset 444
#define __NR_landlock_add_rule 445
#define __NR_landlock_restrict_self 446
#endif
static const char *const *prep_allow; /* the folders the next confined program may write beneath, NULL-ended */
static int prep_sanitized;             /* the workdir's git sanitizer ran: the folders are cleared again after it */
static int prep_subreaper;             /* we are the subreaper of what we start (gVisor refuses it) */

static void prep_confine(void) {
    long abi = syscall(__NR_landlock_create_ruleset, NULL, 0, 1UL /* LANDLOCK_CREATE_RULESET_VERSION */);
    if (abi < 1) return;
    /* write_file, remove_dir, remove_file, make_char, make_dir, make_reg, make_sock, make_fifo, make_block,
       make_sym; refer (ABI 2), truncate (ABI 3) */
    unsigned long long writes = 1ULL << 1 | 1ULL << 4 | 1ULL << 5 | 1ULL << 6 | 1ULL << 7 | 1ULL << 8 | 1ULL << 9 |
                                1ULL << 10 | 1ULL << 11 | 1ULL << 12;
    if (abi >= 2) writes |= 1ULL << 13;
    if (abi >= 3) writes |= 1ULL << 14;
    unsigned long long file_rights = 1ULL << 1 | (abi >= 3 ? 1ULL << 14 : 0);
    struct { unsigned long long fs, net, scoped; } attr = {writes, 0, abi >= 6 ? 1ULL << 1 /* signal */ : 0};
    int fd = (int)syscall(__NR_landlock_create_ruleset, &attr, abi >= 6 ? sizeof attr : sizeof attr.fs, 0UL);
    if (fd < 0) _exit(126);
    struct { unsigned long long allowed; int parent; } __attribute__((packed)) rule;
    const char *devnull[] = {"/dev/null", NULL};
    for (int pass = 0; pass < 2; pass++)
        for (const char *const *a = pass ? prep_allow : devnull; a && *a; a++) {
            int pf = open(*a, O_PATH | O_CLOEXEC);
            if (pf < 0) continue;
            struct stat st;
            rule.allowed = fstat(pf, &st) == 0 && S_ISDIR(st.st_mode) ? writes : file_rights;
            rule.parent = pf;
            if (syscall(__NR_landlock_add_rule, fd, 1UL /* LANDLOCK_RULE_PATH_BENEATH */, &rule, 0UL) < 0) _exit(126);
            close(pf);
        }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 || syscall(__NR_landlock_restrict_self, fd, 0UL) < 0) _exit(126);
    close(fd);
}

/* every process the confined program left, killed and reaped until none is left: our children (each one of them
 * now, or soon: we are the subreaper), or, where we can't be their subreaper (gVisor: what they leave goes to
 * pid 1, the guest agent, where no scan of our children finds it: a fork chain lived on through the tests and
 * emptied the seal, stop 74's prep-fork-chain), every process but pid 1 and us, at once with kill(-1), again
 * until kill(-1) finds none to signal (a fork under way as it was sent: gVisor under load) -- nothing else runs while the
 * verifier prepares: the agent's were stopped before. Where some are still forking after 1000 rounds (a storm
 * outrunning each scan), the preparation fails (exit 1): none of them may live on beside the guards written
 * next, unconfined where the kernel has no Landlock. */
static void prep_reap_rest(void) {
    pid_t me = getpid();
    int clean = 0; /* rounds in a row that found none left */
    for (int round = 0;; round++) {
        if (round == 1000) {
            fprintf(stderr, "sandfleet-agent prepare: the image's programs left processes that would not end\n");
            fflush(stdout);
            _exit(1);
        }
        int left = 0;
        if (!prep_subreaper) {
            /* the kernel's own answer, not a scan of /proc: kill(-1) fails with ESRCH only where no process but pid
               1 and us was left to signal, a zombie included (a scan of /proc raced a fork chain under load and
               missed its newest hop: stop 74's prep-fork-chain forged 1 on gVisor in the whole suite's run of
               stop 77); twice in a row, a millisecond apart */
            left = !(kill(-1, SIGKILL) < 0 && errno == ESRCH);
        } else {
            DIR *d = opendir("/proc");
            struct dirent *e;
            while (d && (e = readdir(d))) {
                if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
                pid_t p = (pid_t)atoi(e->d_name);
                char state = 0;
                long ppid = proc_ppid(e->d_name, &state);
                if (ppid < 0 || p == me || state == 'Z' || state == 'X') continue; /* (a zombie is its parent's to reap) */
                if (ppid == me) {
                    kill(p, SIGKILL);
                    left = 1;
                }
            }
            if (d) closedir(d);
        }
        for (;;) {
            pid_t w = waitpid(-1, NULL, WNOHANG);
            if (w <= 0 && !(w < 0 && errno == EINTR)) break;
        }
        clean = left ? 0 : clean + 1;
        if (clean == (prep_subreaper ? 1 : 2)) return;
        usleep(1000);
    }
}

/* Run ARGV (a PATH search) with its stdout into OUT, its stderr ours or (QUIET) /dev/null, and
 * LD_PRELOAD=PRELOAD where given, confined (prep_confine: it writes beneath prep_allow alone), and what it left
 * running killed: its wait status, or -1 where it could not be started. */
static int prep_capture(char *const argv[], const char *preload, int quiet, buf_t *out) {
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) < 0) return -1;
    fflush(stdout);
    pid_t c = fork();
    if (c < 0) { close(pfd[0]); close(pfd[1]); return -1; }
    if (c == 0) {
        dup2(pfd[1], 1);
        /* never our stdin: the seal is still to be read there when the git sanitizer runs, and a program of the
           agent's that read it to the end left the tests unsealed (stop 74's prep-drains-seal) */
        int in = open("/dev/null", O_RDONLY);
        if (in < 0 || dup2(in, 0) < 0) _exit(126);
        int null = quiet ? open("/dev/null", O_WRONLY) : -1;
        if (null >= 0) dup2(null, 2);
        if (preload) setenv("LD_PRELOAD", preload, 1);
        prep_confine();
        execvp(argv[0], argv);
        _exit(127);
    }
    close(pfd[1]);
    char b[4096];
    for (;;) {
        ssize_t k = read(pfd[0], b, sizeof b);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        buf_add(out, b, (size_t)k);
    }
    close(pfd[0]);
    int st;
    while (waitpid(c, &st, 0) < 0 && errno == EINTR) {}
    prep_reap_rest();
    while (out->n && out->p[out->n - 1] == '\n') out->n--; /* as $(...) drops them */
    return st;
}

/* run `bash -c SCRIPT sanitize REAL`; its stdout, each line as "git: LINE" (the script's notes) */
static void prep_sanitize_git(const char *real) {
    const char *lib = getenv("SANDFLEET_GIT_SCRIPT");
    if (!lib || !*lib) { errno = 0; prep_give_up("no SANDFLEET_GIT_SCRIPT for the workdir's git", real); }
    size_t n = strlen(lib);
    char *script = xmalloc(n + 32);
    memcpy(script, lib, n);
    memcpy(script + n, "\nsanitize_git \"$1\"\n", 20);
    char *argv[] = {"bash", "-c", script, "sanitize", (char *)real, NULL};
    buf_t out = {0};
    const char *allow[] = {real, "/tmp", NULL}; /* the repository's folders, and its temporary files */
    prep_sanitized = 1;
    prep_allow = allow;
    int st = prep_capture(argv, NULL, 0, &out);
    prep_allow = NULL;
    free(script);
    if (st < 0) prep_give_up("fork", NULL);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 127) { errno = ENOENT; prep_give_up("bash", NULL); }
    if (out.n) { /* every line gets "git: " */
        fputs("git: ", stdout);
        for (size_t i = 0; i < out.n; i++) {
            putchar(out.p[i]);
            if (out.p[i] == '\n') fputs("git: ", stdout);
        }
        putchar('\n');
    }
    buf_free(&out);
}

/* ---- links the agent left that lead into a test or reward folder (round XVII's answer-key-link: the
 * agent's output a link to the tests' expected answer, a file that does not exist while it runs): each
 * is removed before the tests, so that they never read or write through it. Where a link leads is
 * `realpath -m`'s answer: every link on the way followed (40 at most), what does not exist kept as named. */
struct prep_links {
    const char **protect;
    int n, count;
    buf_t notes;
};

/* Where each link the walk has met leads, by the link's own place (a path with no link before its
 * last part): realpath -m of the link, whether the way passed through /proc or a test or reward
 * folder, and how many links it took. A link reached again -- every workdir link of round XVIII's link-flood enters one chain of
 * 40 -- costs one look-up instead of its whole way (50,000 such links took the preparation 14 s on
 * bwrap and past its 120 s on gVisor). Only what resolved is kept: a way cut by the 40-link bound
 * from a longer start may still resolve from the link's own. */
struct prep_memo_entry {
    char *link, *res;
    int via_proc, hops;
};
static struct prep_memo_entry *prep_memo;
static size_t prep_memo_cap, prep_memo_n;

static size_t prep_memo_hash(const char *s) {
    size_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static const struct prep_memo_entry *prep_memo_get(const char *link) {
    if (!prep_memo_cap) return NULL;
    for (size_t i = prep_memo_hash(link) & (prep_memo_cap - 1);; i = (i + 1) & (prep_memo_cap - 1)) {
        if (!prep_memo[i].link) return NULL;
        if (!strcmp(prep_memo[i].link, link)) return &prep_memo[i];
    }
}

/* the entry kept for LINK, or NULL where none could be (the bound, memory) */
static const struct prep_memo_entry *prep_memo_put(const char *link, const char *res, int via_proc, int hops) {
    if (prep_memo_n >= (1u << 18)) return NULL; /* a bound on its memory (tens of MB): past it, links are walked again */
    if (2 * (prep_memo_n + 1) > prep_memo_cap) {
        size_t cap = prep_memo_cap ? 2 * prep_memo_cap : 4096;
        struct prep_memo_entry *t = calloc(cap, sizeof *t);
        if (!t) return NULL;
        for (size_t k = 0; k < prep_memo_cap; k++) {
            if (!prep_memo[k].link) continue;
            size_t i = prep_memo_hash(prep_memo[k].link) & (cap - 1);
            while (t[i].link) i = (i + 1) & (cap - 1);
            t[i] = prep_memo[k];
        }
        free(prep_memo);
        prep_memo = t;
        prep_memo_cap = cap;
    }
    char *l = strdup(link), *r = strdup(res);
    if (!l || !r) { free(l); free(r); return NULL; }
    size_t i = prep_memo_hash(link) & (prep_memo_cap - 1);
    while (prep_memo[i].link) i = (i + 1) & (prep_memo_cap - 1);
    prep_memo[i] = (struct prep_memo_entry){l, r, via_proc, hops};
    prep_memo_n++;
    return &prep_memo[i];
}

/* the test and reward folders, once known (prep_links' list): a step of a way under one of them counts
 * as a step under /proc. A way that enters such a folder through another link of the agent's and climbs
 * out again (/app/out.txt -> /tmp/work/../../tests/expected.txt, with /tmp/work -> /logs/verifier/a:
 * round XVIII's answer-key-climb) ends elsewhere only while that link is there; once it is removed, or the
 * tests make /tmp/work, the same way ends in their expected answer */
static const char *const *prep_protect_list;
static int prep_protect_n;

static int prep_under(const char *path, const char *dir);

struct prep_frame {
    char todo[2 * PATH_MAX], next[2 * PATH_MAX], target[PATH_MAX], sub[PATH_MAX];
};

/* realpath -m of START into RES ("/" for the root); *HOPS: the links followed, 40 at most in all;
 * -1 past that (a loop) or for a name too long. DEPTH bounds the recursion into links not yet met. */
static int prep_resolve_d(const char *start, char *res, size_t rn, int *via_proc, int *hops, int depth) {
    if (depth > 41 || rn < 2) return -1;
    struct prep_frame *f = malloc(sizeof *f);
    if (!f) return -1;
    int ret = -1;
    if (snprintf(f->todo, sizeof f->todo, "%s", start) >= (int)sizeof f->todo) goto out;
    res[0] = 0; /* "" is the root */
    char *p = f->todo;
    while (*p) {
        while (*p == '/') p++;
        if (!*p) break;
        char *e = strchr(p, '/');
        size_t cl = e ? (size_t)(e - p) : strlen(p);
        if (cl == 1 && p[0] == '.') { p += cl; continue; }
        if (cl == 2 && p[0] == '.' && p[1] == '.') {
            char *s = strrchr(res, '/');
            if (s) *s = 0;
            p += cl;
            continue;
        }
        size_t rl = strlen(res);
        if (rl + 1 + cl >= rn) goto out;
        res[rl] = '/';
        memcpy(res + rl + 1, p, cl);
        res[rl + 1 + cl] = 0;
        p += cl;
        if (via_proc && !strncmp(res, "/proc", 5) && (res[5] == 0 || res[5] == '/')) *via_proc = 1;
        for (int i = 0; via_proc && i < prep_protect_n; i++)
            if (prep_under(res, prep_protect_list[i])) *via_proc = 1;
        struct stat st;
        if (lstat(res, &st) == 0 && S_ISLNK(st.st_mode)) {
            const struct prep_memo_entry *m = prep_memo_get(res);
            struct prep_memo_entry once; /* a way not kept (the bound, memory): used this time only */
            if (!m) {
                ssize_t k = readlink(res, f->target, sizeof f->target - 1);
                if (k < 0) goto out;
                f->target[k] = 0;
                /* the link's target, from the folder that holds it where it is relative */
                if (snprintf(f->next, sizeof f->next, "%.*s/%s", f->target[0] == '/' ? 0 : (int)rl, res,
                             f->target) >= (int)sizeof f->next) goto out;
                int sub_via = 0, sub_hops = 0;
                if (prep_resolve_d(f->next, f->sub, sizeof f->sub, &sub_via, &sub_hops, depth + 1) < 0) goto out;
                m = prep_memo_put(res, f->sub, sub_via, sub_hops + 1);
                if (!m) {
                    once = (struct prep_memo_entry){NULL, f->sub, sub_via, sub_hops + 1};
                    m = &once;
                }
            }
            if ((*hops += m->hops) > 40) goto out;
            if (via_proc && m->via_proc) *via_proc = 1;
            if (strlen(m->res) >= rn) goto out;
            snprintf(res, rn, "%s", strcmp(m->res, "/") ? m->res : "");
        }
    }
    if (!res[0]) { res[0] = '/'; res[1] = 0; }
    ret = 0;
out:
    free(f);
    return ret;
}

static void prep_memo_clear(void) {
    for (size_t i = 0; i < prep_memo_cap; i++) { free(prep_memo[i].link); free(prep_memo[i].res); }
    free(prep_memo);
    prep_memo = NULL;
    prep_memo_cap = prep_memo_n = 0;
}

static int prep_resolve(const char *start, char *res, size_t rn, int *via_proc) {
    int hops = 0;
    if (via_proc) *via_proc = 0;
    return prep_resolve_d(start, res, rn, via_proc, &hops, 0);
}

static int prep_under(const char *path, const char *dir) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    if (n == 1 && dir[0] == '/') return 1;
    return !strncmp(path, dir, n) && (path[n] == 0 || path[n] == '/');
}

/* the link at PATH, if it leads into a protected folder, or through /proc (where /proc/self/cwd, a
 * descriptor's link and the like name what the reader has: the tests' folder when they read from
 * there, round XVII's answer-key-proc-cwd): removed, noted ("link: PATH", 20 at most) */
static int prep_link_check(struct prep_links *l, const char *path) {
    char res[PATH_MAX];
    int via_proc = 0;
    if (!l || !l->n || prep_resolve(path, res, sizeof res, &via_proc) < 0) return 0; /* a loop: the tests can't follow it either */
    for (int i = 0; i < l->n && !via_proc; i++)
        if (prep_under(res, l->protect[i])) via_proc = 1;
    if (!via_proc) return 0;
    if (unlink(path) < 0 && errno != ENOENT) return -1;
    if (l->count++ < 20) prep_note(&l->notes, "link: ", path);
    return 0;
}

static int prep_link_visit(const char *path, const char *name, const struct stat *st, int depth, void *ctx) {
    (void)name; (void)depth;
    return S_ISLNK(st->st_mode) ? prep_link_check(ctx, path) : 0;
}

/* ---- the tests' PATH ($TESTS_PATH): each absolute folder of it that the agent (uid A) could have
 * written -- its own, below a folder of its own, below one it may write into (not sticky), or missing
 * where it may make it -- noted "agentpath: DIR": the programs the tests find there may be the
 * agent's (round XVII's agent-owned-path; a flag, not a cut: an honest agent installs there what
 * the tests then run). */
static int prep_writable_by(const struct stat *st, uid_t a, int create) {
    if (st->st_uid == a) return 1;
    if (!S_ISDIR(st->st_mode) || ((st->st_mode & S_ISVTX) && !create)) return 0;
    return (st->st_mode & S_IWOTH) || ((st->st_mode & S_IWGRP) && st->st_gid == (gid_t)a);
}

static int prep_agent_path(const char *dir, uid_t a) {
    char p[PATH_MAX], real[PATH_MAX];
    if (dir[0] != '/' || snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return 0;
    int missing = 0;
    while (!realpath(p, real)) { /* the deepest folder above it that exists */
        missing = 1;
        char *slash = strrchr(p, '/');
        if (!slash) return 0;
        if (slash == p) { p[1] = 0; if (!realpath(p, real)) return 0; break; }
        *slash = 0;
    }
    struct stat st;
    if (missing && stat(real, &st) == 0 && prep_writable_by(&st, a, 1)) return 1;
    for (;;) { /* real, then each folder above it, up to / */
        if (lstat(real, &st) == 0 && prep_writable_by(&st, a, 0)) return 1;
        if (!strcmp(real, "/")) return 0;
        char *slash = strrchr(real, '/');
        if (!slash) return 0;
        if (slash == real) real[1] = 0;
        else *slash = 0;
    }
}

static void prep_agent_paths(uid_t a) {
    const char *path = getenv("TESTS_PATH");
    if (!path || !*path) return;
    char d[PATH_MAX];
    for (const char *s = path; *s;) {
        const char *e = strchr(s, ':');
        size_t n = e ? (size_t)(e - s) : strlen(s);
        if (n && n < sizeof d) {
            memcpy(d, s, n);
            d[n] = 0;
            if (prep_agent_path(d, a)) {
                buf_t b = {0};
                prep_note(&b, "agentpath: ", d);
                fwrite(b.p, 1, b.n, stdout);
                buf_free(&b);
            }
        }
        s = e ? e + 1 : s + n;
    }
}

/* ---- the workdir handed to the tests' user, and what the tests' tools would read from it */
struct prep_work {
    uid_t owner;
    int chown_all;
    int conftests, pths;
    buf_t notes;
    struct prep_links *links;
};

static int prep_work_visit(const char *path, const char *name, const struct stat *st, int depth, void *ctx) {
    struct prep_work *w = ctx;
    if (S_ISLNK(st->st_mode) && prep_link_check(w->links, path) < 0) return -1;
    if (w->chown_all && lchown(path, w->owner, (gid_t)-1) < 0 && errno != ENOENT) return -1;
    if (depth > 6 || !S_ISREG(st->st_mode)) return 0;
    size_t k = strlen(name);
    if (!strcmp(name, "conftest.py")) {
        if (depth <= 3 && w->conftests < 20) { w->conftests++; prep_note(&w->notes, "conftest: ", path); }
    } else if (k >= 4 && !strcmp(name + k - 4, ".pth") && strstr(path, "-packages/")) {
        if (w->pths < 20) { w->pths++; prep_note(&w->notes, "pth: ", path); }
    }
    return 0;
}

static int prep_grep_tool(const char *path) { /* grep -qE '^[[:space:]]*(addopts|pytest_plugins|required_plugins)' */
    FILE *f = fopen(path, "re");
    if (!f) return 0;
    char *line = NULL;
    size_t cap = 0;
    int hit = 0;
    while (!hit && getline(&line, &cap, f) >= 0) {
        const char *s = line;
        while (*s == ' ' || *s == '\t' || *s == '\v' || *s == '\f' || *s == '\r') s++;
        hit = !strncmp(s, "addopts", 7) || !strncmp(s, "pytest_plugins", 14) || !strncmp(s, "required_plugins", 16);
    }
    free(line);
    fclose(f);
    return hit;
}

static int prep_is_file(const char *dir, const char *name) { /* [ -f dir/name ] */
    char p[PATH_MAX];
    struct stat st;
    return snprintf(p, sizeof p, "%s/%s", dir, name) < (int)sizeof p && stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int prep_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* bash's globs "$d"/ *.py then "$d"/ * /__init__.py (sorted, no dot names), each that exists: 200 in all */
static void prep_modules(const char *d) {
    DIR *dir = opendir(d);
    if (!dir) return;
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) names = xrealloc(names, (cap = cap ? cap * 2 : 64) * sizeof *names);
        names[n++] = strdup(e->d_name);
    }
    closedir(dir);
    qsort(names, n, sizeof *names, prep_cmp);
    int count = 0;
    char p[PATH_MAX];
    struct stat st;
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < n; i++) {
            size_t k = strlen(names[i]);
            int ok = pass == 0 ? k >= 3 && !strcmp(names[i] + k - 3, ".py") &&
                                     snprintf(p, sizeof p, "%s/%s", d, names[i]) < (int)sizeof p
                               : snprintf(p, sizeof p, "%s/%s/__init__.py", d, names[i]) < (int)sizeof p;
            if (ok && count < 200 && stat(p, &st) == 0) {
                count++;
                buf_t b = {0};
                prep_note(&b, "module: ", p);
                fwrite(b.p, 1, b.n, stdout);
                buf_free(&b);
            }
        }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
}

static void prep_workdir(const char *d, const char *owner, uid_t uid, struct prep_links *links) {
    struct stat st, lst;
    if (stat(d, &st) < 0 || !S_ISDIR(st.st_mode) || lstat(d, &lst) < 0 || S_ISLNK(lst.st_mode)) return;
    if (*owner) {
        char real[PATH_MAX];
        if (!realpath(d, real)) prep_give_up("realpath", d);
        int found = 0;
        if (prep_walk(real, 0, 0, 1, prep_git_visit, &found) < 0) prep_give_up("walk", real);
        if (found) prep_sanitize_git(real);
    }
    struct prep_work w = {.owner = uid, .chown_all = *owner && strcmp(owner, "0"), .links = links};
    if (w.chown_all && lchown(d, uid, (gid_t)-1) < 0) prep_give_up("chown", d);
    /* the script's chown -R fails on what it can't walk; its find only reports */
    if (prep_walk(d, 0, 0, w.chown_all, prep_work_visit, &w) < 0) prep_give_up("chown -R", d);
    fwrite(w.notes.p ? w.notes.p : "", 1, w.notes.n, stdout);
    buf_free(&w.notes);
    static const char *const pytest[] = {"pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml"};
    static const char *const other[] = {".npmrc", ".yarnrc", ".yarnrc.yml", ".pythonstartup"};
    char p[PATH_MAX];
    for (int i = 0; i < 4; i++)
        if (prep_is_file(d, pytest[i]) && snprintf(p, sizeof p, "%s/%s", d, pytest[i]) < (int)sizeof p &&
            prep_grep_tool(p))
            printf("toolconfig: %s\n", p);
    for (int i = 0; i < 4; i++)
        if (prep_is_file(d, other[i])) printf("toolconfig: %s/%s\n", d, other[i]);
    prep_modules(d);
}

/* ---- the agent's files in the shared temporary folders: the tests' user's (find -user A -exec chown -h) */
struct prep_tmp { uid_t agent, owner; };

/* one walk of a shared temporary folder for both of its steps: the agent's links checked
   (prep_link_check), its files handed over (where `chown` is given) */
struct prep_tmp_walk { struct prep_tmp *chown; struct prep_links *links; };

static int prep_tmp_visit(const char *path, const char *name, const struct stat *st, int depth, void *ctx) {
    (void)name; (void)depth;
    struct prep_tmp_walk *w = ctx;
    if (S_ISLNK(st->st_mode) && prep_link_check(w->links, path) < 0) return -1;
    if (w->chown && st->st_uid == w->chown->agent) (void)lchown(path, w->chown->owner, (gid_t)-1);
    return 0;
}

/* mktemp -d -t NAME.XXXXXXXX: a new folder, mode 0700, in $TMPDIR or /tmp */
static void prep_mkdtemp(const char *name, char *out, size_t n) {
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp) tmp = "/tmp";
    static const char abc[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    for (int tries = 0; tries < 100; tries++) {
        unsigned char r[8];
        if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) prep_give_up("getrandom", NULL);
        char x[9];
        for (int i = 0; i < 8; i++) x[i] = abc[r[i] % (sizeof abc - 1)];
        x[8] = 0;
        if (snprintf(out, n, "%s/%s.%s", tmp, name, x) >= (int)n) { errno = ENAMETOOLONG; prep_give_up("mktemp", tmp); }
        if (mkdir(out, 0700) == 0) return;
        if (errno != EEXIST) prep_give_up("mktemp", out);
    }
    prep_give_up("mktemp", out);
}

/* a fresh folder at `path` (rm -rf; mkdir -m MODE) */
static void prep_fresh_dir(const char *path, mode_t mode) {
    if (prep_rm(path) < 0) prep_give_up("rm -rf", path);
    if (mkdir(path, mode) < 0 || chmod(path, mode) < 0) prep_give_up("mkdir", path);
}

/* The script's `if [ -n "$P" ] && [ -d "${P%/ *}" ]; then rm -rf "$P"; mkdir -m MODE "$P"`: a fresh
 * folder at the path $NAME gives where its parent is a folder ("" for "/x", whose ${P%/ *} is empty;
 * the whole name where it has no slash), its path in OUT; else 0 (the caller makes one in /tmp). */
static int prep_fresh_beside(const char *name, mode_t mode, char *out, size_t n) {
    const char *path = getenv(name);
    if (!path || !*path) return 0;
    const char *slash = strrchr(path, '/');
    char parent[PATH_MAX];
    if (!slash) snprintf(parent, sizeof parent, "%s", path);
    else if ((size_t)(slash - path) < sizeof parent) snprintf(parent, sizeof parent, "%.*s", (int)(slash - path), path);
    else return 0;
    struct stat st;
    if (!*parent || stat(parent, &st) < 0 || !S_ISDIR(st.st_mode)) return 0;
    prep_fresh_dir(path, mode);
    snprintf(out, n, "%s", path);
    return 1;
}

/* The machine the image's bash was built for, as bash's $HOSTTYPE names it; "" when unknown. */
static const char *prep_image_arch(void) {
    /* the host's word for it where it has one (the image store's: taken before any agent ran, where a root agent
       could otherwise leave a `bash` first on PATH that is no ELF, and the script ran for us: stop 74) */
    const char *given = getenv("IMAGE_ARCH");
    if (given && (!strcmp(given, "x86_64") || !strcmp(given, "aarch64"))) return given;
    const char *path = getenv("PATH");
    if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
    char p[PATH_MAX];
    for (const char *s = path; *s;) {
        const char *e = strchr(s, ':');
        size_t n = e ? (size_t)(e - s) : strlen(s);
        if (n && snprintf(p, sizeof p, "%.*s/bash", (int)n, s) < (int)sizeof p && access(p, X_OK) == 0) {
            unsigned char h[20];
            int fd = open(p, O_RDONLY | O_CLOEXEC);
            ssize_t k = fd >= 0 ? read(fd, h, sizeof h) : -1;
            if (fd >= 0) close(fd);
            if (k < 20 || memcmp(h, "\177ELF", 4)) return "";
            unsigned m = h[5] == 2 ? (unsigned)h[18] << 8 | h[19] : (unsigned)h[19] << 8 | h[18];
            switch (m) {
            case 62: return "x86_64";
            case 183: return "aarch64";
            default: return "";
            }
        }
        s = e ? e + 1 : s + n;
    }
    return "";
}

/* `env LD_PRELOAD=SEAL true --sandfleet-seal-probe`: its stdout, trailing newlines dropped */
static void prep_probe(const char *seal, char *out, size_t n) {
    char *argv[] = {"true", "--sandfleet-seal-probe", NULL};
    buf_t b = {0};
    prep_capture(argv, seal, 1, &b);
    snprintf(out, n, "%.*s", (int)b.n, b.p ? b.p : "");
    buf_free(&b);
}

/* ---- the image's environments in the workdir (round XXVI) ----
 * An image that makes the project's venv in the workdir (`RUN python3 -m venv /app/.venv && .venv/bin/pip
 * install ...`) hands the tests a runner that is a file of the workdir's, which the agent may change. What
 * the image put there is known only before the agent's first command: `envs-record` (run as root as the
 * sandbox is made ready, rollout/envrecord.py) names the venvs of the workdir and a time after every write the
 * platform made there, at which a later change time (which no process can set) is the agent's; the host keeps
 * that record. `envs-changes` (the agent's sandbox, before the workdir is copied for --verify separate) and the
 * preparation (ENVS_SINCE) list what in those venvs changed since. Records are NUL-terminated: "s" the time,
 * "v" a venv's root, "c" an entry of it changed (anything but a folder: a file, a link), "a" a root the agent
 * made whole (a link or file at its name, or more changes than are listed). */
#define ENV_DEPTH 4            /* venvs this many folders below the workdir */
#define ENV_DIRS_MAX 20000     /* folders the record looks in */
#define ENV_CHANGED_MAX 20000  /* changed entries listed per venv: past it, the venv is the agent's whole */

static int env_skipped(const char *name) {
    return !strcmp(name, ".git") || !strcmp(name, "node_modules") || !strcmp(name, "__pycache__");
}

/* the venvs at FD (PATH, LEN) and below it, as "v" records into OUT; FD is closed */
static void env_find(int fd, char *path, size_t len, int depth, long *dirs, buf_t *out) {
    struct stat st;
    if (fstatat(fd, "pyvenv.cfg", &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode)) {
        buf_add(out, "v", 1);
        buf_add(out, path, len + 1);
        close(fd);
        return;
    }
    if (depth >= ENV_DEPTH || ++*dirs > ENV_DIRS_MAX) { close(fd); return; }
    DIR *d = fdopendir(fd);
    if (!d) { close(fd); return; }
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *nm = e->d_name;
        if ((nm[0] == '.' && (!nm[1] || (nm[1] == '.' && !nm[2]))) || env_skipped(nm)) continue;
        if (e->d_type != DT_DIR && e->d_type != DT_UNKNOWN) continue;
        size_t n = strlen(nm);
        if (len + 1 + n + 1 > PATH_MAX) continue;
        int sub = openat(dirfd(d), nm, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0) continue;
        path[len] = '/';
        memcpy(path + len + 1, nm, n + 1);
        env_find(sub, path, len + 1 + n, depth + 1, dirs, out);
        path[len] = 0;
    }
    closedir(d);
}

static int ts_after(struct timespec a, struct timespec b) {
    return a.tv_sec > b.tv_sec || (a.tv_sec == b.tv_sec && a.tv_nsec > b.tv_nsec);
}

/* `sandfleet-agent envs-record WORKDIR`: "s" the time, then a "v" record for each venv of the workdir. The
 * time is the clock's when the walk ended (every change time of the platform's writes is at or before it:
 * coarse or fine, a file's time is never ahead of the clock); it returns only once the coarse clock is
 * past it, so that every later change (the agent's) has a change time after it, on any filesystem. A venv
 * whose pyvenv.cfg is ahead of the clock (an image's times from a host ahead of this clock) is left out:
 * its files could not be told from the agent's. */
static int envs_record(int argc, char **argv) {
    if (argc != 1 || argv[0][0] != '/') {
        fputs("usage: sandfleet-agent envs-record /WORKDIR\n", stderr);
        return 2;
    }
    char real[PATH_MAX];
    buf_t found = {0}, out = {0};
    if (realpath(argv[0], real)) {
        int fd = open(real, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        long dirs = 0;
        if (fd >= 0) env_find(fd, real, strlen(real), 0, &dirs, &found);
    }
    struct timespec t0, now;
    clock_gettime(CLOCK_REALTIME, &t0);
    char s[64];
    int sl = snprintf(s, sizeof s, "s%lld.%09ld", (long long)t0.tv_sec, (long)t0.tv_nsec);
    buf_add(&out, s, (size_t)sl + 1);
    for (size_t i = 0; i < found.n; i += strlen(found.p + i) + 1) {
        char cfg[PATH_MAX + 16];
        struct stat st;
        snprintf(cfg, sizeof cfg, "%s/pyvenv.cfg", found.p + i + 1);
        if (lstat(cfg, &st) == 0 && ts_after(st.st_ctim, t0)) {
            fprintf(stderr, "sandfleet-agent envs-record: %s changed after the clock's now: left out\n", cfg);
            continue;
        }
        buf_add(&out, found.p + i, strlen(found.p + i) + 1);
    }
    for (int i = 0; i < 1000; i++) { /* a tick of the coarse clock at most (1-10 ms): a change the agent makes
                                        next has a change time after t0 (the image's programs too: stop 74) */
        clock_gettime(CLOCK_REALTIME_COARSE, &now);
        if (ts_after(now, t0)) break;
        struct timespec nap = {0, 200000};
        nanosleep(&nap, NULL);
    }
    if (write_all(1, out.p, out.n) < 0) return 1;
    buf_free(&found);
    buf_free(&out);
    return 0;
}

struct env_walk { struct timespec since; buf_t *out; long n; };

static int env_changed_visit(const char *path, const char *name, const struct stat *st, int depth, void *ctx) {
    (void)name, (void)depth;
    struct env_walk *w = ctx;
    if (S_ISDIR(st->st_mode) || !ts_after(st->st_ctim, w->since)) return 0;
    if (++w->n > ENV_CHANGED_MAX) return -1;
    buf_add(w->out, "c", 1);
    buf_add(w->out, path, strlen(path) + 1);
    return 0;
}

/* ROOT (a venv of the record) as "v", then its entries changed after SINCE as "c" records into OUT, or "a"
 * where ROOT is no folder now (a link, a file) or more changed than are listed; nothing where ROOT is gone
 * (what the tests make there is theirs). The count of changed entries, -1 for the whole */
static long env_changes(const char *root, struct timespec since, buf_t *out) {
    struct stat st;
    if (lstat(root, &st) < 0) return 0;
    buf_add(out, "v", 1);
    buf_add(out, root, strlen(root) + 1);
    size_t mark = out->n;
    struct env_walk w = {since, out, 0};
    if (S_ISDIR(st.st_mode) && prep_walk(root, 0, 0, 0, env_changed_visit, &w) == 0) return w.n;
    out->n = mark;
    buf_add(out, "a", 1);
    buf_add(out, root, strlen(root) + 1);
    return -1;
}

/* "SEC.NSEC" into T */
static int env_since(const char *s, struct timespec *t) {
    char *end;
    long long sec = strtoll(s, &end, 10);
    if (end == s || *end != '.' || strlen(end + 1) != 9) return -1;
    long ns = strtol(end + 1, &end, 10);
    if (*end || ns < 0) return -1;
    t->tv_sec = (time_t)sec;
    t->tv_nsec = ns;
    return 0;
}

/* `sandfleet-agent envs-changes SINCE ROOT...`: env_changes for each ROOT */
static int envs_changes(int argc, char **argv) {
    struct timespec since;
    if (argc < 1 || env_since(argv[0], &since) < 0) {
        fputs("usage: sandfleet-agent envs-changes SEC.NSEC /ROOT...\n", stderr);
        return 2;
    }
    buf_t out = {0};
    for (int i = 1; i < argc; i++)
        if (argv[i][0] == '/') env_changes(argv[i], since, &out);
    int rc = write_all(1, out.p ? out.p : "", out.n) < 0;
    buf_free(&out);
    return rc;
}

/* The programs of the image's PATH folders whose change time is after SINCE (a root agent's: planted, replaced,
 * or a link turned elsewhere), each as an "agentprog: " note, 20 at most: the seal runs them as the code under
 * test (agent_changed), and the row says so. Each folder once (/bin is /usr/bin's link in a merged /usr). */
static void prep_agent_programs(struct timespec since, buf_t *notes) {
    static const char *const dirs[] = {"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"};
    char seen[6][PATH_MAX];
    int nseen = 0, noted = 0;
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs && noted < 20; i++) {
        char real[PATH_MAX];
        if (!realpath(dirs[i], real)) continue;
        int dup = 0;
        for (int j = 0; j < nseen; j++) dup |= !strcmp(seen[j], real);
        if (dup) continue;
        snprintf(seen[nseen++], PATH_MAX, "%s", real);
        DIR *d = opendir(dirs[i]);
        if (!d) continue;
        struct dirent *e;
        while ((e = readdir(d)) && noted < 20) {
            if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2]))) continue;
            struct stat st;
            if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) continue;
            if (st.st_ctim.tv_sec < since.tv_sec ||
                (st.st_ctim.tv_sec == since.tv_sec && st.st_ctim.tv_nsec <= since.tv_nsec))
                continue;
            char f[PATH_MAX + 256];
            snprintf(f, sizeof f, "%s/%s", dirs[i], e->d_name);
            prep_note(notes, "agentprog: ", f);
            noted++;
        }
        closedir(d);
    }
}

/* Python's module folders of the image (the standard library's, site-packages and dist-packages under /usr/lib and
 * /usr/local/lib) whose entries a root agent changed since the record, two levels down (a module, a .pth, a
 * package's __init__ or __main__, a distribution's entry points): each noted ("agentmod: ", 5 at most). What the
 * tests' Python reads of them is the code under test's (the Python guard's agent_file); a runner among them (-m
 * pytest, the agent's reinstall) reports its own status, as a program of the system folders it changed does. */
static int prep_agent_modules_in(const char *dir, struct timespec since, buf_t *notes, int depth, int noted) {
    DIR *d = opendir(dir);
    if (!d) return noted;
    struct dirent *e;
    while ((e = readdir(d)) && noted < 5) {
        if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2]))) continue;
        if (!strcmp(e->d_name, "__pycache__")) continue; /* a cache the guard reads from no root agent */
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) continue;
        char f[PATH_MAX + 256];
        snprintf(f, sizeof f, "%s/%s", dir, e->d_name);
        if (st.st_ctim.tv_sec > since.tv_sec || (st.st_ctim.tv_sec == since.tv_sec && st.st_ctim.tv_nsec > since.tv_nsec)) {
            if (!S_ISDIR(st.st_mode)) {
                prep_note(notes, "agentmod: ", f);
                noted++;
                continue;
            }
        }
        int site = !strcmp(e->d_name, "site-packages") || !strcmp(e->d_name, "dist-packages");
        if (S_ISDIR(st.st_mode) && (depth < 1 || site)) noted = prep_agent_modules_in(f, since, notes, site ? 0 : depth + 1, noted);
    }
    closedir(d);
    return noted;
}

static void prep_agent_modules(struct timespec since, buf_t *notes) {
    static const char *const roots[] = {"/usr/lib", "/usr/local/lib"};
    int noted = 0;
    for (size_t i = 0; i < sizeof roots / sizeof *roots && noted < 5; i++) {
        DIR *d = opendir(roots[i]);
        if (!d) continue;
        struct dirent *e;
        while ((e = readdir(d)) && noted < 5) {
            if (strncmp(e->d_name, "python3", 7)) continue; /* python3, python3.11: the interpreters' folders */
            char f[PATH_MAX];
            snprintf(f, sizeof f, "%s/%s", roots[i], e->d_name);
            noted = prep_agent_modules_in(f, since, notes, 0, noted);
        }
        closedir(d);
    }
}

/* the changed byte-compiled files of a venv removed: Python reads one in a __pycache__ whose header matches its
 * source's time and size, which the agent can write (the tests' Python compiles the source again), and one
 * beside a module whose source is gone (sourceless: its code keeps the file name it was compiled with, a file
 * of the image's: image-venv-sourceless) */
static void env_drop_bytecode(const buf_t *list) {
    for (size_t i = 0; i < list->n; i += strlen(list->p + i) + 1) {
        const char *r = list->p + i;
        size_t l = strlen(r);
        if (r[0] == 'c' && l > 4 && !strcmp(r + l - 4, ".pyc")) unlink(r + 1);
    }
}

/* The test and reward folders made empty, root's and 0755 (a reward folder 0777 where the tests are a user):
 * the script's mkdir, find -delete, chmod and chown, once for them all. Again after the workdir's git sanitizer
 * (prep_sanitized): what the image's programs it ran wrote there is gone before the tests go in. */
static void prep_clear_folders(const char **clear, int nclear, const char **rewards, int nrewards, const char *owner,
                               int nested) {
    for (int i = 0; i < nclear; i++)
        if (prep_mkdir_p(clear[i]) < 0) prep_give_up("mkdir -p", clear[i]);
    for (int i = 0; i < nclear; i++) { /* find D -mindepth 1 -maxdepth 1 -exec rm -rf {} + */
        DIR *dir = opendir(clear[i]);
        if (!dir) continue; /* removed with a folder it was in: made again below */
        struct dirent *e;
        while ((e = readdir(dir))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            if (prep_rm_at(dirfd(dir), e->d_name, 1) < 0) prep_give_up("rm -rf in", clear[i]);
        }
        closedir(dir);
    }
    if (nested)
        for (int i = 0; i < nclear; i++)
            if (prep_mkdir_p(clear[i]) < 0) prep_give_up("mkdir -p", clear[i]);
    for (int i = 0; i < nclear; i++)
        if (chmod(clear[i], 0755) < 0) prep_give_up("chmod 0755", clear[i]);
    if (*owner) {
        for (int i = 0; i < nclear; i++)
            if (chown(clear[i], 0, 0) < 0) prep_give_up("chown 0:0", clear[i]);
        if (strcmp(owner, "0"))
            for (int i = 0; i < nrewards; i++)
                if (chmod(rewards[i], 0777) < 0) prep_give_up("chmod 0777", rewards[i]);
    }
}

static int prepare(int argc, char **argv) {
    if (argc < 1) { errno = EINVAL; prep_give_up("usage: sandfleet-agent prepare OWNER [t:|r:|w:PATH ...]", NULL); }
    prep_subreaper = prctl(PR_SET_CHILD_SUBREAPER, 1) == 0; /* what the image's programs we run leave is ours to
                                                                kill (prep_reap_rest) */
    const char *owner = argv[0];
    const char *agent = getenv("AGENT_USER");
    const char *seal_arch = getenv("SEAL_ARCH");
    const char *demote = getenv("DEMOTE");
    const char *split = getenv("SPLIT");
    /* what the script does by name, or where the image is not one this code knows: the script's */
    errno = 0;
    if (*owner && !prep_numeric(owner)) prep_give_up("a user by name", owner);
    int agent_chown = agent && *agent && *owner && strcmp(owner, "0") && strcmp(agent, owner);
    if (agent_chown && !prep_numeric(agent)) prep_give_up("an agent user by name", agent);
    const char *arch = "";
    if (*owner && seal_arch && *seal_arch) {
        arch = prep_image_arch();
        if (!*arch) prep_give_up("an image whose bash is of an architecture not known here", NULL);
    }
    for (int i = 1; i < argc; i++)
        if (strlen(argv[i]) < 3 || argv[i][1] != ':' || !strchr("trwvca", argv[i][0]) || argv[i][2] != '/')
            prep_give_up("an argument not of the form t:|r:|w:|v:|c:|a:/PATH", argv[i]);
    uid_t uid = *owner ? (uid_t)strtoul(owner, NULL, 10) : 0;
    /* the agent as a uid of its own (not root): whose PATH folders and top folders are looked at */
    int agent_known = agent && prep_numeric(agent) && strcmp(agent, "0");
    uid_t agent_uid = agent_known ? (uid_t)strtoul(agent, NULL, 10) : 0;
    if (agent_known) prep_agent_paths(agent_uid); /* before any owner changes */
    /* the image's venvs in the workdir (v:, from the record taken before the agent's first command): what of
       them changed since (ENVS_SINCE: this sandbox is the agent's; else c: and a:, listed in the agent's
       sandbox for a fresh one), before any owner changes; kept as the seal's "image-envs" below */
    buf_t envs = {0}, env_notes = {0};
    const char *since_s = getenv("ENVS_SINCE");
    struct timespec since;
    int walk_envs = since_s && *since_s, bad_since = walk_envs && env_since(since_s, &since) < 0;
    int listed = 0;
    /* "s" the record's time, first: a program of the image's system folders whose change time falls between
       it and this preparation's is the agent's (a root agent's: the seal's agent_changed), in this sandbox */
    if (walk_envs && !bad_since) {
        buf_add(&envs, "s", 1);
        buf_add(&envs, since_s, strlen(since_s) + 1);
        prep_agent_programs(since, &env_notes);
        prep_agent_modules(since, &env_notes);
    }
    for (int i = 1; i < argc; i++) {
        char k = argv[i][0];
        const char *d = argv[i] + 2;
        if (!strchr("vca", k)) continue;
        if (!walk_envs) {
            buf_add(&envs, &k, 1);
            buf_add(&envs, d, strlen(d) + 1);
        } else if (k == 'v' && bad_since) { /* no time to judge by: the venv is the agent's whole */
            buf_add(&envs, "v", 1);
            buf_add(&envs, d, strlen(d) + 1);
            buf_add(&envs, "a", 1);
            buf_add(&envs, d, strlen(d) + 1);
        } else if (k == 'v' && env_changes(d, since, &envs)) {
            prep_note(&env_notes, "imageenv: ", d);
        }
        if (!walk_envs && k != 'v' && listed++ < 20) prep_note(&env_notes, "imageenv: ", d);
    }
    env_drop_bytecode(&envs);
    fwrite(env_notes.p ? env_notes.p : "", 1, env_notes.n, stdout);
    buf_free(&env_notes);
    umask(022);
    const char **clear = xcalloc((size_t)argc, sizeof *clear);
    const char **rewards = xcalloc((size_t)argc, sizeof *rewards);
    const char **work = xcalloc((size_t)argc, sizeof *work);
    int nclear = 0, nrewards = 0, nwork = 0, nested = 0;
    for (int i = 1; i < argc; i++) {
        const char *d = argv[i] + 2;
        if (strchr("vca", argv[i][0])) continue;
        if (argv[i][0] == 'w') { work[nwork++] = d; continue; }
        if (argv[i][0] == 'r') {
            rewards[nrewards++] = d;
            if (*owner) prep_trust_parents(d);
        }
        if (prep_is_link_or_nondir(d) && prep_rm(d) < 0) prep_give_up("rm -rf", d);
        size_t dl = strlen(d);
        for (int j = 0; j < nclear; j++) {
            size_t ol = strlen(clear[j]);
            if ((dl > ol && !strncmp(d, clear[j], ol) && d[ol] == '/') ||
                (ol > dl && !strncmp(clear[j], d, dl) && clear[j][dl] == '/') || (ol == dl && !strcmp(d, clear[j])))
                nested = 1;
        }
        clear[nclear++] = d;
    }
    prep_clear_folders(clear, nclear, rewards, nrewards, owner, nested);
    /* the folders no link of the agent's may lead into: each test and reward folder, as given and as
       resolved (a folder above it may be a link of the image's) */
    const char **protect = xcalloc((size_t)(2 * nclear + 1), sizeof *protect);
    struct prep_links links = {.protect = protect};
    for (int i = 0; i < nclear; i++) {
        protect[links.n++] = clear[i];
        char r[PATH_MAX];
        if (prep_resolve(clear[i], r, sizeof r, NULL) == 0 && strcmp(r, clear[i])) protect[links.n++] = strdup(r);
    }
    /* from here on a way's steps are judged against them too: what was resolved before without them goes */
    prep_memo_clear();
    prep_protect_list = protect;
    prep_protect_n = links.n;
    for (int i = 0; i < nwork; i++) prep_workdir(work[i], owner, uid, &links);
    if (prep_sanitized) { /* (where Landlock kept its programs from them, a no-op; without it, gVisor's case, not) */
        for (int i = 0; i < nrewards; i++)
            if (*owner) prep_trust_parents(rewards[i]);
        for (int i = 0; i < nclear; i++)
            if (prep_is_link_or_nondir(clear[i]) && prep_rm(clear[i]) < 0) prep_give_up("rm -rf", clear[i]);
        prep_clear_folders(clear, nclear, rewards, nrewards, owner, nested);
    }
    /* the shared temporary folders, one walk each: the agent's links there (below), the agent's files
       handed to the tests' user */
    struct prep_tmp t = {agent_chown ? (uid_t)strtoul(agent, NULL, 10) : 0, uid};
    struct prep_tmp_walk tw = {agent_chown ? &t : NULL, &links};
    static const char *const tmps[] = {"/tmp", "/var/tmp", "/dev/shm"};
    for (int i = 0; (agent_chown || links.n) && i < 3; i++)
        if (prep_walk(tmps[i], 4, 1, 0, prep_tmp_visit, &tw) < 0 && links.n) prep_give_up("remove a link in", tmps[i]);
    if (links.n) { /* and where else the agent keeps files: the homes, the logs, and every folder at the top
                      that is the agent's own (/oracle, /work, ...) */
        static const char *const elsewhere[] = {"/home", "/root", "/logs"};
        for (int i = 0; i < 3; i++)
            if (prep_walk(elsewhere[i], 4, 1, 0, prep_link_visit, &links) < 0) prep_give_up("remove a link in", elsewhere[i]);
        DIR *top = agent_known ? opendir("/") : NULL;
        struct dirent *e;
        while (top && (e = readdir(top))) {
            char tp[PATH_MAX];
            struct stat st;
            int walked = 0; /* a workdir: walked whole already */
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(tp, sizeof tp, "/%s", e->d_name);
            for (int w = 0; w < nwork; w++) walked |= !strcmp(work[w], tp);
            if (!walked && lstat(tp, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == agent_uid &&
                prep_walk(tp, 4, 1, 0, prep_link_visit, &links) < 0)
                prep_give_up("remove a link in", tp);
        }
        if (top) closedir(top);
    }
    fwrite(links.notes.p ? links.notes.p : "", 1, links.notes.n, stdout);
    buf_free(&links.notes);
    char home[PATH_MAX], py[PATH_MAX], seal[PATH_MAX + 64] = "";
    const char *code_home = getenv("CODE_HOME");
    if (!prep_fresh_beside("TESTS_HOME", 0700, home, sizeof home)) prep_mkdtemp("sandfleet-verifier-home", home, sizeof home);
    if (*owner && chown(home, uid, (gid_t)-1) < 0) prep_give_up("chown", home);
    if (code_home && *code_home) {
        prep_fresh_dir(code_home, 0700);
        if (*owner && chown(code_home, uid, (gid_t)-1) < 0) prep_give_up("chown", code_home);
    }
    if (!prep_fresh_beside("PY_DIR", 0755, py, sizeof py)) prep_mkdtemp("sandfleet-verifier-py", py, sizeof py);
    char f[PATH_MAX + 32];
    snprintf(f, sizeof f, "%s/sitecustomize.py", py);
    const char *guard = getenv("PY_GUARD");
    int fd = open(f, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0 || write_all(fd, guard ? guard : "", guard ? strlen(guard) : 0) < 0 || close(fd) < 0)
        prep_give_up("write", f);
    /* the tests' other guards beside it: bash's BASH_ENV (shellguard.py), Node's --require and Perl's -M
       (langguard.py) */
    static const char *const guards[][2] = {{"SH_GUARD", "sandfleet-bash.sh"}, {"NODE_GUARD", "sandfleet-node.js"},
                                            {"PERL_GUARD", "sandfleet_guard.pm"}};
    for (size_t i = 0; i < sizeof guards / sizeof guards[0]; i++) {
        const char *text = getenv(guards[i][0]);
        if (!text || !*text) continue;
        snprintf(f, sizeof f, "%s/%s", py, guards[i][1]);
        fd = open(f, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
        if (fd < 0 || write_all(fd, text, strlen(text)) < 0 || close(fd) < 0) prep_give_up("write", f);
    }
    if (envs.n) { /* read by the seal (sandfleet_seal_planted, sandfleet_seal_tests_venv) */
        snprintf(f, sizeof f, "%s/image-envs", py);
        fd = open(f, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0 || write_all(fd, envs.p, envs.n) < 0 || close(fd) < 0) prep_give_up("write", f);
    }
    buf_free(&envs);
    if (chmod(py, 0755) < 0) prep_give_up("chmod", py);
    if (*owner && seal_arch && *seal_arch && !strcmp(arch, seal_arch)) {
        snprintf(seal, sizeof seal, "%s/sandfleet-seal.libasan.so", py);
        int sfd = open(seal, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
        if (sfd < 0) prep_give_up("write", seal);
        long long total = 0;
        char b[65536];
        for (;;) {
            ssize_t k = read(0, b, sizeof b);
            if (k < 0 && errno == EINTR) continue;
            if (k < 0) prep_give_up("read the seal", NULL);
            if (k == 0) break;
            if (write_all(sfd, b, (size_t)k) < 0) prep_give_up("write", seal);
            total += k;
        }
        if (close(sfd) < 0) prep_give_up("write", seal);
        /* all of it, or none: the host says how much it sends (a library cut short is one the loader refuses,
           and the tests would run unsealed) */
        const char *size = getenv("SEAL_SIZE");
        if (size && *size && total != strtoll(size, NULL, 10)) {
            fprintf(stderr, "sandfleet-agent prepare: the seal: %lld bytes of %s\n", total, size);
            return 1;
        }
        if (total > 0) { /* the last step that can fail is behind us: the script would not be run again */
            int lfd = open("/etc/ld.so.preload", O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
            if (lfd >= 0) {
                size_t sl = strlen(seal);
                seal[sl] = '\n';
                if (write(lfd, seal, sl + 1) < 0) {}
                seal[sl] = 0;
                close(lfd);
            }
        } else {
            seal[0] = 0;
        }
    }
    printf("home=%s\npython=%s\nseal=%s\n", home, py, seal);
    char landlock[256] = "";
    if (*seal) {
        prep_probe(seal, landlock, sizeof landlock);
        printf("%s\n", landlock);
    }
    if (*seal && demote && *demote && (!strcmp(landlock, "landlock=0") || (split && *split))) {
        /* past the seal's line in /etc/ld.so.preload: a failure here is the preparation's (exit 1,
           as the script's set -e), not a case for the script */
        for (int i = 0; i < nrewards; i++)
            if (chmod(rewards[i], 0755) < 0) { perror(rewards[i]); return 1; }
        if (chown(home, 0, 0) < 0) { perror(home); return 1; }
        printf("demote=%s\n", demote);
    }
    if (*owner) printf("uid=%s\n", owner);
    fflush(stdout);
    return 0;
}

/* `sandfleet-agent stat PATH...`: for each PATH that is a regular file and not a link, "UID MODE
 * PATH" (MODE in octal, as find's %m), or "? ? PATH" where it can't be read: the verifier's check
 * of the reward files' owner and mode (rollout/verifier.py) without a shell and a find per file. */
static int stat_files(int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        struct stat st;
        if (lstat(argv[i], &st) < 0) {
            if (errno == ENOENT || errno == ENOTDIR) continue;
            printf("? ? %s\n", argv[i]);
        } else if (S_ISREG(st.st_mode)) {
            printf("%u %o %s\n", (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777), argv[i]);
        }
    }
    return fflush(stdout) == 0 ? 0 : 1;
}

/* `sandfleet-agent procs`: the processes of the sandbox that are not sandfleet's own, one line each,
 * "PID\tCOMM\tARGS" (the arguments joined by spaces): what a branch would lose (sandbox/branching.py's
 * _LIST, whose lines these are, without a bash and its loop over /proc). Left out: pid 1, this process
 * and its children, the kernel's (parent 0), what runs without arguments, sandfleet's own programs
 * (under /.sandfleet/) and the sessions' shells. */
static long procs_read(const char *path, char *buf, size_t n) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t got = 0;
    for (;;) {
        ssize_t k = read(fd, buf + got, n - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        got += (size_t)k;
        if (got == n) break;
    }
    close(fd);
    return (long)got;
}

static int procs(int argc, char **argv) {
    (void)argc; (void)argv;
    pid_t self = getpid();
    DIR *d = opendir("/proc");
    if (!d) { perror("/proc"); return 1; }
    struct dirent *e;
    char path[64], buf[8192];
    while ((e = readdir(d))) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 1 || pid == self) continue;
        char state;
        long ppid = proc_ppid(e->d_name, &state); /* (agent.c's) */
        if (ppid < 0 || ppid == self || ppid == 0) continue;
        char comm[64];
        snprintf(path, sizeof path, "/proc/%ld/comm", pid);
        long k = procs_read(path, comm, sizeof comm - 1);
        if (k <= 0) continue;
        comm[k] = 0;
        char *nl = strchr(comm, '\n');
        if (nl) *nl = 0;
        snprintf(path, sizeof path, "/proc/%ld/cmdline", pid);
        k = procs_read(path, buf, sizeof buf - 1);
        if (k <= 0) continue;
        buf[k] = 0;
        if (!strncmp(buf, "/.sandfleet/", 12)) continue;
        const char *args[3] = {buf, NULL, NULL};
        for (long i = 0, n = 1; i < k - 1 && n < 3; i++)
            if (!buf[i]) args[n++] = buf + i + 1;
        if (args[2] && !strcmp(args[2], "sandfleet-session")) continue;
        for (long i = 0; i < k; i++)
            if (!buf[i]) buf[i] = ' ';
        while (k > 0 && buf[k - 1] == ' ') buf[--k] = 0; /* the last NUL: "${args[*]}" ends there */
        printf("%ld\t%s\t%s\n", pid, comm, buf);
    }
    closedir(d);
    return fflush(stdout) == 0 ? 0 : 1;
}
