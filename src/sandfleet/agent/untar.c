/*
 * `sandfleet-agent untar DEST`: what `Sandbox.upload` ran as `{ [ -d DEST ] || mkdir -p DEST; }
 * && tar -x --no-same-owner -C DEST` (GNU tar), for the archives Python's tarfile writes
 * (ustar and pax headers; folders and regular files), in one process of our own instead of a
 * shell and tar. Files are the running user's; modes as tar gives them (root: the archive's;
 * another user: less the umask); modification times the archive's, a folder's set after its
 * contents. Exit 75 (before or part way, as with `prepare`) for what it leaves to tar: links,
 * devices, sparse files, a name with "..", anything over what it knows, a step that fails;
 * the caller then runs tar on the same archive, which writes every member again.
 */
#define UNTAR_TAR 75

static void untar_give_up(const char *what, const char *name) {
    int e = errno;
    fprintf(stderr, "sandfleet-agent untar: %s%s%s%s%s (tar does it)\n", what, name ? " " : "", name ? name : "",
            e ? ": " : "", e ? strerror(e) : "");
    _exit(UNTAR_TAR);
}

static size_t untar_read(unsigned char *b, size_t n) { /* n bytes of stdin, or fewer at its end */
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(0, b + got, n - got);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) untar_give_up("read", NULL);
        if (k == 0) break;
        got += (size_t)k;
    }
    return got;
}

static int untar_octal(const unsigned char *f, size_t n, long long *out) {
    size_t i = 0;
    long long v = 0;
    if (n && (f[0] & 0x80)) return -1; /* base-256 */
    while (i < n && f[i] == ' ') i++;
    for (; i < n && f[i] >= '0' && f[i] <= '7'; i++) {
        if (v > (LLONG_MAX >> 3)) return -1;
        v = v * 8 + (f[i] - '0');
    }
    for (; i < n; i++)
        if (f[i] != ' ' && f[i] != 0) return -1;
    *out = v;
    return 0;
}

struct untar_dir { char *name; mode_t mode; struct timespec mtime; };

static int untar_safe(const char *name) { /* no ".." component; not empty */
    if (!*name) return 0;
    for (const char *p = name; *p;) {
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == 2 && p[0] == '.' && p[1] == '.') return 0;
        p += n;
        while (*p == '/') p++;
    }
    return 1;
}

static int untar(int argc, char **argv) {
    if (argc != 1 || !argv[0][0]) { errno = EINVAL; untar_give_up("usage: sandfleet-agent untar DEST", NULL); }
    const char *dest = argv[0];
    struct stat st;
    if (stat(dest, &st) < 0 || !S_ISDIR(st.st_mode)) {
        if (prep_mkdir_p(dest) < 0) untar_give_up("mkdir -p", dest);
    }
    if (chdir(dest) < 0) untar_give_up("cd", dest);
    mode_t mask = umask(0);
    umask(mask);
    int root = geteuid() == 0;
    struct untar_dir *dirs = NULL;
    size_t ndirs = 0, capdirs = 0;
    char *pax_path = NULL;
    long long pax_size = -1;
    struct timespec pax_mtime = {0, -1};
    unsigned char h[512];
    static unsigned char data[1 << 16];
    for (;;) {
        size_t got = untar_read(h, 512);
        if (got == 0) break;
        if (got < 512) { errno = 0; untar_give_up("a short header", NULL); }
        int zero = 1;
        for (int i = 0; i < 512; i++)
            if (h[i]) { zero = 0; break; }
        if (zero) break;
        long long sum = 0, want = 0;
        for (int i = 0; i < 512; i++) sum += (i >= 148 && i < 156) ? ' ' : h[i];
        long long size = 0, mtime = 0, mode = 0;
        if (untar_octal(h + 148, 8, &want) < 0 || want != sum || untar_octal(h + 124, 12, &size) < 0 ||
            untar_octal(h + 136, 12, &mtime) < 0 || untar_octal(h + 100, 8, &mode) < 0) {
            errno = 0;
            untar_give_up("a header it can't read", NULL);
        }
        char type = (char)h[156];
        if (type == 'x') { /* pax: "LEN key=value\n" records for the next member */
            if (size > (1 << 20)) { errno = 0; untar_give_up("a pax header over 1 MiB", NULL); }
            char *rec = xmalloc((size_t)size + 1);
            size_t padded = ((size_t)size + 511) & ~(size_t)511, off = 0;
            while (off < padded) {
                size_t k = untar_read(data, padded - off < sizeof data ? padded - off : sizeof data);
                if (!k) { errno = 0; untar_give_up("a short pax header", NULL); }
                if (off < (size_t)size) memcpy(rec + off, data, (size_t)size - off < k ? (size_t)size - off : k);
                off += k;
            }
            rec[size] = 0;
            for (size_t p = 0; p < (size_t)size;) {
                char *end;
                unsigned long len = strtoul(rec + p, &end, 10);
                if (!len || *end != ' ' || p + len > (size_t)size || rec[p + len - 1] != '\n') {
                    errno = 0;
                    untar_give_up("a pax record it can't read", NULL);
                }
                char *kv = end + 1, *eq = memchr(kv, '=', rec + p + len - 1 - kv);
                if (!eq) { errno = 0; untar_give_up("a pax record without =", NULL); }
                *eq = 0;
                rec[p + len - 1] = 0;
                const char *v = eq + 1;
                if (!strcmp(kv, "path")) { free(pax_path); pax_path = strdup(v); }
                else if (!strcmp(kv, "size")) pax_size = strtoll(v, NULL, 10);
                else if (!strcmp(kv, "mtime")) {
                    char *dot;
                    pax_mtime.tv_sec = strtoll(v, &dot, 10);
                    pax_mtime.tv_nsec = 0;
                    if (*dot == '.') {
                        long ns = 0;
                        int digits = 0;
                        for (const char *q = dot + 1; *q >= '0' && *q <= '9'; q++)
                            if (digits < 9) { ns = ns * 10 + (*q - '0'); digits++; }
                        while (digits++ < 9) ns *= 10;
                        /* GNU tar rounds a negative time toward -inf; tarfile writes none */
                        pax_mtime.tv_nsec = ns;
                    }
                } else if (!strncmp(kv, "GNU.sparse", 10) || !strcmp(kv, "linkpath")) {
                    errno = 0;
                    untar_give_up("a pax key it leaves to tar:", kv);
                }
                p += len;
            }
            free(rec);
            continue;
        }
        if (type == 'g') { /* global pax: tar applies it to every member after; tarfile writes none */
            errno = 0;
            untar_give_up("a global pax header", NULL);
        }
        if (type != '0' && type != 0 && type != '5') {
            errno = 0;
            char t[2] = {type, 0};
            untar_give_up("a member of type", t);
        }
        char name[PATH_MAX];
        if (pax_path) {
            if (snprintf(name, sizeof name, "%s", pax_path) >= (int)sizeof name) { errno = ENAMETOOLONG; untar_give_up("name", NULL); }
        } else if (!memcmp(h + 257, "ustar", 5) && h[345]) {
            snprintf(name, sizeof name, "%.155s/%.100s", (const char *)h + 345, (const char *)h);
        } else {
            snprintf(name, sizeof name, "%.100s", (const char *)h);
        }
        if (pax_size >= 0) size = pax_size;
        struct timespec mt = {(time_t)mtime, 0};
        if (pax_mtime.tv_nsec >= 0) mt = pax_mtime;
        free(pax_path);
        pax_path = NULL;
        pax_size = -1;
        pax_mtime.tv_nsec = -1;
        char *n = name;
        if (*n == '/') { errno = 0; untar_give_up("an absolute name", name); } /* tar strips it, with a warning */
        while (n[0] == '.' && n[1] == '/') { n += 2; while (*n == '/') n++; }
        size_t nl = strlen(n);
        while (nl > 1 && n[nl - 1] == '/') n[--nl] = 0;
        if (!strcmp(n, ".") || !*n) { errno = 0; untar_give_up("a member for the folder itself", NULL); }
        if (!untar_safe(n)) { errno = 0; untar_give_up("a name with ..", n); }
        mode_t m = (mode_t)mode & (root ? 07777 : 0777 & ~mask);
        if (type == '5') {
            if (size) { errno = 0; untar_give_up("a folder with data", n); }
            if (lstat(n, &st) == 0) {
                if (!S_ISDIR(st.st_mode)) { errno = EEXIST; untar_give_up("a folder over a file", n); }
            } else {
                if (prep_mkdir_p(n) < 0) untar_give_up("mkdir", n);
                if (chmod(n, (m | S_IRWXU) & 07777) < 0) untar_give_up("chmod", n);
            }
            if (ndirs == capdirs) dirs = xrealloc(dirs, (capdirs = capdirs ? capdirs * 2 : 16) * sizeof *dirs);
            dirs[ndirs].name = strdup(n);
            dirs[ndirs].mode = m;
            dirs[ndirs].mtime = mt;
            ndirs++;
            continue;
        }
        char *slash = strrchr(n, '/');
        if (slash) { /* a folder the archive did not list first: made as tar makes it */
            *slash = 0;
            if (stat(n, &st) < 0 && prep_mkdir_p(n) < 0) untar_give_up("mkdir", n);
            *slash = '/';
        }
        int fd = open(n, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0 && errno == EEXIST) {
            if (lstat(n, &st) == 0 && S_ISDIR(st.st_mode)) { errno = EISDIR; untar_give_up("a file over a folder", n); }
            if (unlink(n) < 0) untar_give_up("unlink", n);
            fd = open(n, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        }
        if (fd < 0) untar_give_up("open", n);
        long long left = size;
        size_t pad = (size_t)(((size + 511) & ~511LL) - size);
        while (left > 0) {
            size_t want_n = left < (long long)sizeof data ? (size_t)left : sizeof data;
            size_t k = untar_read(data, want_n);
            if (k < want_n) { errno = 0; untar_give_up("a short member", n); }
            if (write_all(fd, data, k) < 0) untar_give_up("write", n);
            left -= (long long)k;
        }
        if (pad && untar_read(data, pad) < pad) { errno = 0; untar_give_up("a short member", n); }
        struct timespec ts[2] = {{0, UTIME_OMIT}, mt};
        if (fchmod(fd, m) < 0 || futimens(fd, ts) < 0) untar_give_up("chmod", n);
        if (close(fd) < 0) untar_give_up("write", n);
    }
    /* the folders' modes and times once their contents are in, the deepest first (as tar's delayed set) */
    for (size_t i = ndirs; i-- > 0;) {
        struct timespec ts[2] = {{0, UTIME_OMIT}, dirs[i].mtime};
        if (chmod(dirs[i].name, dirs[i].mode) < 0 || utimensat(AT_FDCWD, dirs[i].name, ts, AT_SYMLINK_NOFOLLOW) < 0)
            untar_give_up("chmod", dirs[i].name);
        free(dirs[i].name);
    }
    free(dirs);
    while (untar_read(data, sizeof data) > 0) {} /* the archive's padding: read, as tar reads its record */
    return 0;
}
