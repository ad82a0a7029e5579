/*
 * spawner: the host side's process starter (issue 46, creation as a host fills). Included by
 * agent.c; run as `sandfleet-agent spawner` by its owner (sandfleet/sandbox/spawner.py), with
 * its request socket (SOCK_SEQPACKET) on stdin.
 *
 * An owner that holds thousands of sandboxes holds about 8 descriptors for each; every fork
 * it makes copies that table and its child closes all of them again (close_fds): a start
 * that costs more the more sandboxes the process holds. This small process holds nothing but
 * its socket, and starts each process for its owner: the owner's descriptors that the new
 * process needs come with the request (SCM_RIGHTS), each with the number it must have.
 * The child is cloned with CLONE_PARENT: it is the owner's child, not ours (the owner waits
 * for it, its pidfd and PR_SET_PDEATHSIG name the owner), so we never reap anything.
 *
 * request (one message): u32 flags | u32 nfds | u32 argc | u32 envc | u32 target[nfds] |
 *                        cwd\0 argv[0]\0 ... env[0]\0 ...   with nfds descriptors attached
 *   flags: 1 = setsid() in the child; cwd "" = ours (the owner's when it started us)
 * reply: i32 pid (0 when nothing was started) | i32 errno (of the clone, or of the child's
 *        exec: then the child exited 127 and is the owner's to reap)
 */
#define SPAWN_MAX_MSG (1u << 20)
#define SPAWN_MAX_FDS 64
#define SPAWN_SETSID 1u

static void spawn_reply(int sock, int32_t pid, int32_t err) {
    int32_t r[2] = {pid, err};
    while (send(sock, r, sizeof r, MSG_NOSIGNAL) < 0 && errno == EINTR) {}
}

/* the child: descriptors to their numbers, the owner's limits, session, folder, exec; an
 * error's errno to `ep` (close-on-exec: EOF there means the exec happened) */
static void spawn_child(int ep, uint32_t flags, int nfds, const int *fds, const uint32_t *target,
                        const char *cwd, char **argv, char **envp) {
    int moved[SPAWN_MAX_FDS];
    int top = ep;
    for (int i = 0; i < nfds; i++) {
        if (fds[i] > top) top = fds[i];
        if ((int)target[i] > top) top = (int)target[i];
    }
    /* first above every number in play, then each to its own (dup2 clears close-on-exec) */
    for (int i = 0; i < nfds; i++)
        if ((moved[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, top + 1)) < 0) goto fail;
    for (int i = 0; i < nfds; i++)
        if (dup2(moved[i], (int)target[i]) < 0) goto fail;
    /* the owner's limits now (it may have raised its open-file limit since it started us) */
    for (int r = 0; r < RLIM_NLIMITS; r++) {
        struct rlimit lim;
        if (prlimit(getppid(), r, NULL, &lim) == 0) prlimit(0, r, &lim, NULL);
    }
    if ((flags & SPAWN_SETSID) && setsid() < 0) goto fail;
    if (*cwd && chdir(cwd) < 0) goto fail;
    execve(argv[0], argv, envp);
fail:;
    int32_t e = errno;
    while (write(ep, &e, sizeof e) < 0 && errno == EINTR) {}
    _exit(127);
}

static int spawner(int argc, char **argv) {
    (void)argv;
    host_mode = "spawner";
    if (argc != 0) { errno = EINVAL; return die("usage: sandfleet-agent spawner (its socket on stdin)", NULL); }
    int sock = fcntl(0, F_DUPFD_CLOEXEC, 3);
    if (sock < 0) return die("dup", NULL);
    int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null >= 0) { dup2(null, 0); close(null); }
    /* gone with its owner through its socket's EOF, below (not PR_SET_PDEATHSIG, which fires when
     * the thread that started us ends: one clone after the fork and before our reply, and the
     * owner would not know its own child) */
    char *buf = malloc(SPAWN_MAX_MSG);
    if (!buf) return die("malloc", NULL);
    for (;;) {
        union { struct cmsghdr h; char b[CMSG_SPACE(SPAWN_MAX_FDS * sizeof(int))]; } ctl;
        struct iovec iov = {buf, SPAWN_MAX_MSG - 1};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof ctl.b};
        ssize_t n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return 0; /* the owner closed its end, or is gone */
        int fds[SPAWN_MAX_FDS], nfds = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
                int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
                for (int i = 0; i < k; i++) {
                    int fd;
                    memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
                    if (nfds < SPAWN_MAX_FDS) fds[nfds++] = fd; else close(fd);
                }
            }
        uint32_t h[4];
        int32_t err = 0, pid = 0;
        buf[n] = 0;
        char **args = NULL;
        int ep[2] = {-1, -1};
        if ((m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || (size_t)n < sizeof h) { err = EMSGSIZE; goto done; }
        memcpy(h, buf, sizeof h);
        if (h[1] != (uint32_t)nfds || h[2] < 1 || h[2] > 65536 || h[3] > 65536 ||
            (size_t)n < sizeof h + (size_t)h[1] * 4) { err = EINVAL; goto done; }
        uint32_t target[SPAWN_MAX_FDS];
        memcpy(target, buf + sizeof h, (size_t)nfds * 4);
        for (int i = 0; i < nfds; i++)
            if (target[i] > INT_MAX) { err = EBADF; goto done; }
        /* the strings: cwd, argc of argv, envc of env; each ends with a NUL inside the message */
        size_t want = 1 + (size_t)h[2] + (size_t)h[3];
        args = calloc(want + 2, sizeof *args);
        if (!args) { err = ENOMEM; goto done; }
        char *p = buf + sizeof h + (size_t)nfds * 4, *end = buf + n;
        for (size_t i = 0; i < want; i++) {
            char *z = p < end ? memchr(p, 0, (size_t)(end - p)) : NULL;
            if (!z) { err = EINVAL; goto done; }
            args[i + (i > h[2] ? 1 : 0)] = p; /* a NULL after argv, one after env (calloc) */
            p = z + 1;
        }
        char *cwd = args[0], **cargv = args + 1, **cenv = args + 2 + h[2];
        if (cargv[0][0] != '/') { err = ENOENT; goto done; } /* the owner sends absolute paths */
        if (pipe2(ep, O_CLOEXEC) < 0) { err = errno; goto done; }
        pid = (int32_t)syscall(SYS_clone, CLONE_PARENT, 0, NULL, NULL, 0);
        if (pid == 0) spawn_child(ep[1], h[0], nfds, fds, target, cwd, cargv, cenv);
        if (pid < 0) { err = errno; pid = 0; goto done; }
        close(ep[1]);
        ep[1] = -1;
        int32_t e = 0;
        ssize_t r;
        while ((r = read(ep[0], &e, sizeof e)) < 0 && errno == EINTR) {}
        if (r == (ssize_t)sizeof e) err = e ? e : EIO;
    done:
        for (int i = 0; i < 2; i++) if (ep[i] >= 0) close(ep[i]);
        for (int i = 0; i < nfds; i++) close(fds[i]);
        free(args);
        spawn_reply(sock, pid, err);
    }
}
