/*
 * sandfleet-seccomp-gen: compile a seccomp profile into the classic-BPF program the guest
 * agent installs before each command (sandfleet/sandbox/seccomp.py writes the profile).
 *
 * Runs on the host, once per profile, with libseccomp doing the compiling: the guest agent
 * then needs no libseccomp of its own. The program is for the host's arch, which is the
 * agent's: bwrap runs the host's agent even over an arm64 image (its commands are emulated
 * by qemu-user, an x86_64 process), and microVMs are x86_64 guests on x86_64 hosts.
 * Reads the profile from stdin, one directive a line, and writes the program (an array of
 * struct sock_filter, the target's byte order) to stdout:
 *
 *   arch ARCH                         the host's (x86_64, aarch64): the only arch of the filter
 *   default ERRNO                     the action for a syscall no rule names
 *   badarch ERRNO                     the action for a syscall of another arch (i386, x32)
 *   allow NAME|NR                     allow it
 *   errno NAME|NR ERRNO               fail it with ERRNO
 *   allow_arg NAME|NR ARG OP VALUE [MASK]   allow it when argument ARG matches (OP: eq, ne, masked_eq)
 *
 * A NAME that libseccomp does not know for ARCH is skipped (as the OCI runtimes do); a
 * number (NR) is taken as is. Exit 2 with a message on stderr for a bad profile.
 */
#include <errno.h>
#include <seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int fail(int line, const char *what, const char *detail) {
    fprintf(stderr, "sandfleet-seccomp-gen: line %d: %s%s%s\n", line, what, detail ? ": " : "", detail ? detail : "");
    return 2;
}

static int parse_u64(const char *s, scmp_datum_t *v) {
    char *end;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 0);
    if (errno || !*s || *end) return -1;
    *v = (scmp_datum_t)x;
    return 0;
}

/* The syscall number of NAME|NR on the filter's arch; -1 when libseccomp does not know it. */
static int syscall_of(uint32_t arch, const char *s) {
    if (*s >= '0' && *s <= '9') return atoi(s);
    int nr = seccomp_syscall_resolve_name_arch(arch, s);

    return nr == __NR_SCMP_ERROR || nr < 0 ? -1 : nr;
}

int main(void) {
    char buf[512];
    scmp_filter_ctx ctx = NULL;
    uint32_t arch = 0;
    int line = 0, skipped = 0, rc;
    while (fgets(buf, sizeof buf, stdin)) {
        line++;
        char *w[8] = {0};
        int n = 0;
        for (char *t = strtok(buf, " \t\n"); t && n < 8; t = strtok(NULL, " \t\n")) w[n++] = t;
        if (!n || w[0][0] == '#') continue;
        if (!strcmp(w[0], "arch") && n == 2) {
            arch = seccomp_arch_resolve_name(w[1]);
            if (!arch) return fail(line, "unknown arch", w[1]);
            /* numbers are taken exactly, which libseccomp does for its native arch only */
            if (arch != seccomp_arch_native()) return fail(line, "not this host's arch", w[1]);
            continue;
        }
        if (!strcmp(w[0], "default") && n == 2) {
            if (ctx || !arch) return fail(line, "default must follow arch, once", NULL);
            ctx = seccomp_init(SCMP_ACT_ERRNO(atoi(w[1])));
            if (!ctx) return fail(line, "seccomp_init failed", NULL);
            /* a decision tree, not a linear list: a few comparisons per syscall, not hundreds */
            seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, 2);
            continue;
        }
        if (!ctx) return fail(line, "rules must follow arch and default", NULL);
        if (!strcmp(w[0], "badarch") && n == 2) {
            if ((rc = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_ERRNO(atoi(w[1])))) < 0)
                return fail(line, "badarch", strerror(-rc));
            continue;
        }
        if (n < 2) return fail(line, "bad directive", w[0]);
        int nr = syscall_of(arch, w[1]);
        if (nr < 0) { skipped++; continue; }
        if (!strcmp(w[0], "allow") && n == 2) {
            rc = seccomp_rule_add_exact(ctx, SCMP_ACT_ALLOW, nr, 0);
        } else if (!strcmp(w[0], "errno") && n == 3) {
            rc = seccomp_rule_add_exact(ctx, SCMP_ACT_ERRNO(atoi(w[2])), nr, 0);
        } else if (!strcmp(w[0], "allow_arg") && (n == 5 || n == 6)) {
            scmp_datum_t value, mask = 0;
            int arg = atoi(w[2]);
            if (arg < 0 || arg > 5 || parse_u64(w[4], &value) < 0 || (n == 6 && parse_u64(w[5], &mask) < 0))
                return fail(line, "bad argument test", w[1]);
            struct scmp_arg_cmp cmp;
            if (!strcmp(w[3], "eq")) cmp = SCMP_CMP(arg, SCMP_CMP_EQ, value);
            else if (!strcmp(w[3], "ne")) cmp = SCMP_CMP(arg, SCMP_CMP_NE, value);
            else if (!strcmp(w[3], "masked_eq") && n == 6) cmp = SCMP_CMP(arg, SCMP_CMP_MASKED_EQ, mask, value);
            else return fail(line, "bad operator", w[3]);
            rc = seccomp_rule_add_exact(ctx, SCMP_ACT_ALLOW, nr, 1, cmp);
        } else {
            return fail(line, "bad directive", w[0]);
        }
        if (rc < 0) return fail(line, w[1], strerror(-rc));
    }
    if (!ctx) return fail(line, "no arch and default", NULL);
    if ((rc = seccomp_export_bpf(ctx, STDOUT_FILENO)) < 0) return fail(line, "seccomp_export_bpf", strerror(-rc));
    seccomp_release(ctx);
    fprintf(stderr, "sandfleet-seccomp-gen: %d names unknown for this arch, skipped\n", skipped);
    return 0;
}
