/* no_socket.c: an LD_PRELOAD shim that proves a process opens no socket.
 * socket() and socketpair() append one line ("socket DOMAIN TYPE") to the
 * file named by $KHUB_NO_SOCKET_LOG and fail with EACCES, so a command that
 * tries the network both fails and leaves a trace. t_hub_cli runs the
 * offline commands under it and expects an empty log (and one online
 * command, which must leave a line: the shim works). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

static void note(const char *what, int domain, int type)
{
    const char *path = getenv("KHUB_NO_SOCKET_LOG");
    if (!path) return;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    char line[96];
    int n = snprintf(line, sizeof line, "%s %d %d\n", what, domain, type);
    if (n > 0 && write(fd, line, (size_t)n) < 0) {
    }
    close(fd);
}

__attribute__((visibility("default"))) int socket(int domain, int type, int protocol)
{
    (void)protocol;
    note("socket", domain, type);
    errno = EACCES;
    return -1;
}

__attribute__((visibility("default"))) int socketpair(int domain, int type, int protocol, int sv[2])
{
    (void)protocol;
    (void)sv;
    note("socketpair", domain, type);
    errno = EACCES;
    return -1;
}
