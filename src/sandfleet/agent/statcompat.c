/* sandfleet's stat shim for gVisor sandboxes (sandbox/gvisor.py, _statcompat).
 *
 * Debian's runsc (0.0~20221219) answers EINVAL to statx(2) and newfstatat(2) given
 * AT_NO_AUTOMOUNT, a flag it does not know. coreutils' ls and stat (8.32 and later, so every
 * Debian/Ubuntu image of the last years) pass it to statx on every path: `ls DIR` and
 * `stat FILE` failed in every gvisor sandbox ("ls: cannot access 'DIR': Invalid argument").
 * The Sentry has no automount points, so the flag means nothing there: this library, which
 * the guest agent (--preload) puts at the end of every command's LD_PRELOAD, drops it and
 * makes the call itself. Freestanding (no libc of its own: `syscall` is the process's libc's,
 * glibc or musl), it exports these three functions only. Statically linked programs don't
 * load it: they keep the EINVAL. */

#define AT_NO_AUTOMOUNT 0x800

#if defined(__x86_64__)
#define NR_STATX 332
#define NR_NEWFSTATAT 262
#elif defined(__aarch64__)
#define NR_STATX 291
#define NR_NEWFSTATAT 79
#else
#error "statcompat: x86_64 or aarch64"
#endif

long syscall(long number, ...);
struct stat;
struct statx;

#define EXPORT __attribute__((visibility("default")))

EXPORT int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf) {
    return (int)syscall(NR_STATX, dirfd, path, flags & ~AT_NO_AUTOMOUNT, mask, buf);
}

/* (glibc's and musl's struct stat is the kernel's on both arches) */
EXPORT int fstatat(int dirfd, const char *path, struct stat *buf, int flags) {
    return (int)syscall(NR_NEWFSTATAT, dirfd, path, buf, flags & ~AT_NO_AUTOMOUNT);
}

EXPORT int fstatat64(int dirfd, const char *path, struct stat *buf, int flags) {
    return (int)syscall(NR_NEWFSTATAT, dirfd, path, buf, flags & ~AT_NO_AUTOMOUNT);
}
