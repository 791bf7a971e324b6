/*
 * statx(2) compatibility for older gVisor releases (such as Debian 12's runsc), which reject
 * the AT_NO_AUTOMOUNT flag with EINVAL. coreutils always passes it, so `ls -la` and `stat`
 * fail there. Preloaded through /etc/ld.so.preload, this wrapper clears the flag; automount
 * points do not exist inside a sandbox, so nothing else changes.
 */
#define _GNU_SOURCE
#include <sys/syscall.h>
#include <unistd.h>

#define HAROMBE_AT_NO_AUTOMOUNT 0x800

struct statx;

int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf)
{
    return (int)syscall(SYS_statx, dirfd, path, flags & ~HAROMBE_AT_NO_AUTOMOUNT, mask, buf);
}
