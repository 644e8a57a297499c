/* flock(2) as an NFS client does it (LD_PRELOAD): NFS emulates flock() with byte-range locks on the server, so an
 * exclusive lock needs a file open for writing (flock(2), "NFS details"), and a directory, which cannot be opened
 * for writing, never takes one: EBADF. With NFS_FLOCK_ERRNO=ENOLCK every flock() fails with ENOLCK instead, as
 * on a mount without a lock manager (nolock, no lockd). Otherwise the real flock() runs. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>

int flock(int fd, int operation) {
    static int (*real)(int, int);
    const char *mode = getenv("NFS_FLOCK_ERRNO");
    if (mode && strcmp(mode, "ENOLCK") == 0) {
        errno = ENOLCK;
        return -1;
    }
    int flags = fcntl(fd, F_GETFL);
    if ((operation & LOCK_EX) && flags >= 0 && (flags & O_ACCMODE) == O_RDONLY) {
        errno = EBADF;
        return -1;
    }
    if (!real)
        real = (int (*)(int, int))dlsym(RTLD_NEXT, "flock");
    return real(fd, operation);
}
