/* The gvisor backend's statx shim (docs/security.md, "gVisor: the platform, and what Debian's
 * runsc lacks"). Debian's runsc 0.0~20221219 answers EINVAL to statx and fstatat called with
 * AT_NO_AUTOMOUNT, a flag that only matters on automount points (none in a sandbox) and that
 * coreutils' ls, stat and others always pass. Loaded into every dynamically linked program
 * inside a gvisor sandbox through /etc/ld.so.preload, it drops the flag and makes the call. */
#include <sys/syscall.h>
#include <unistd.h>

#define AT_NO_AUTOMOUNT 0x800 /* (not from fcntl.h and sys/stat.h: their prototypes differ by glibc) */

int statx(int dirfd, const char *path, int flags, unsigned int mask, void *buf) {
    return (int)syscall(SYS_statx, dirfd, path, flags & ~AT_NO_AUTOMOUNT, mask, buf);
}

#ifdef SYS_newfstatat
int fstatat(int dirfd, const char *path, void *buf, int flags) {
    return (int)syscall(SYS_newfstatat, dirfd, path, buf, flags & ~AT_NO_AUTOMOUNT);
}

int fstatat64(int dirfd, const char *path, void *buf, int flags) {
    return (int)syscall(SYS_newfstatat, dirfd, path, buf, flags & ~AT_NO_AUTOMOUNT);
}

/* glibc before 2.33: fstatat is an inline call of these */
int __fxstatat(int ver, int dirfd, const char *path, void *buf, int flags) {
    (void)ver;
    return (int)syscall(SYS_newfstatat, dirfd, path, buf, flags & ~AT_NO_AUTOMOUNT);
}

int __fxstatat64(int ver, int dirfd, const char *path, void *buf, int flags) {
    (void)ver;
    return (int)syscall(SYS_newfstatat, dirfd, path, buf, flags & ~AT_NO_AUTOMOUNT);
}
#endif
