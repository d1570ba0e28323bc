/*
 * Review finding 4: the library an unprivileged user names in
 * GAPSCOPE_CUPTI. Loaded into a process, its constructor writes the ids it
 * runs with to MARKER (set when compiling) — a harmless stand-in for code
 * run as root.
 */
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

__attribute__((constructor)) static void ran(void)
{
	int fd = open(MARKER, O_WRONLY | O_CREAT | O_APPEND, 0644);
	if (fd < 0)
		return;
	dprintf(fd, "payload ran in pid %d as uid %d euid %d\n", getpid(), getuid(), geteuid());
	close(fd);
}
