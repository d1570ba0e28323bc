/*
 * The processes an unprivileged user points a root-run gapscope at, in
 * tests/attacks.rs. Each maps what it is told (-m FILE: anywhere; -M
 * HEX:FILE: at that address), says "ready PID" on stdout, and then:
 *
 *   read        blocks reading stdin; exits 0 at its end
 *   sleep       sleeps in 10 ms steps, counting (-c FILE) each
 *   spin-anon   spins in an anonymous executable page (a JIT's code)
 *   spin-lib L  dlopens L and calls its gs_attack_spin() for ever
 *   sigalrm     malloc/free for ever, counting; a SIGALRM every 100 us
 *               whose handler makes the thread's only syscall (getppid)
 *   strict      enters strict seccomp, then echoes "got" for each read
 *               from stdin; _exit(0) at its end
 *
 * A mapped file whose name starts with libcuda.so or libcupti is what makes
 * a process a GPU process to gapscope.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

static volatile uint64_t *counter;

static void die(const char *what, const char *arg)
{
	fprintf(stderr, "target: %s %s: %m\n", what, arg ? arg : "");
	exit(2);
}

static void map_file(const char *path, uintptr_t at)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0)
		die("open", path);
	size_t len = st.st_size > 4096 ? (size_t)st.st_size : 4096;
	void *p = mmap((void *)at, len, PROT_READ,
		       MAP_PRIVATE | (at ? MAP_FIXED_NOREPLACE : 0), fd, 0);
	if (p == MAP_FAILED || (at && p != (void *)at))
		die("mmap", path);
	close(fd);
}

static void count_in(const char *path)
{
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0 || ftruncate(fd, 4096) != 0)
		die("counter", path);
	void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		die("mmap", path);
	counter = p;
}

static void tick(void)
{
	if (counter)
		__atomic_add_fetch(counter, 1, __ATOMIC_RELAXED);
}

static void on_alarm(int sig)
{
	(void)sig;
	syscall(SYS_getppid);
}

static void *nothing(void *arg)
{
	return arg;
}

int main(int argc, char **argv)
{
	int i = 1;
	for (; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "-m")) {
			map_file(argv[i + 1], 0);
		} else if (!strcmp(argv[i], "-M")) {
			char *colon = strchr(argv[i + 1], ':');
			if (!colon)
				die("-M wants HEX:FILE", argv[i + 1]);
			map_file(colon + 1, (uintptr_t)strtoull(argv[i + 1], NULL, 16));
		} else if (!strcmp(argv[i], "-c")) {
			count_in(argv[i + 1]);
		} else {
			break;
		}
	}
	if (i >= argc)
		die("no mode", NULL);
	const char *mode = argv[i];
	void (*spin)(void) = NULL;
	if (!strcmp(mode, "spin-lib")) {
		if (i + 1 >= argc)
			die("spin-lib wants a library", NULL);
		void *h = dlopen(argv[i + 1], RTLD_NOW);
		if (!h || !(spin = (void (*)(void))dlsym(h, "gs_attack_spin"))) {
			fprintf(stderr, "target: %s\n", dlerror());
			return 2;
		}
	}
	printf("ready %d\n", getpid());
	fflush(stdout);

	if (!strcmp(mode, "read")) {
		char buf[256];
		while (read(0, buf, sizeof(buf)) > 0)
			;
		return 0;
	}
	if (!strcmp(mode, "sleep")) {
		for (;;) {
			struct timespec ts = {0, 10 * 1000 * 1000};
			nanosleep(&ts, NULL);
			tick();
		}
	}
	if (!strcmp(mode, "spin-anon")) {
		/* jmp . */
		unsigned char *code = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
					   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (code == MAP_FAILED)
			die("mmap", "anon");
		code[0] = 0xeb;
		code[1] = 0xfe;
		((void (*)(void))code)();
	}
	if (spin) {
		for (;;) {
			spin();
			tick();
		}
	}
	if (!strcmp(mode, "sigalrm")) {
		/* A thread, gone at once: from now on malloc takes its locks. */
		pthread_t t;
		if (pthread_create(&t, NULL, nothing, NULL) != 0 || pthread_join(t, NULL) != 0)
			die("pthread", NULL);
		struct sigaction sa;
		memset(&sa, 0, sizeof(sa));
		sa.sa_handler = on_alarm;
		sa.sa_flags = SA_RESTART;
		sigaction(SIGALRM, &sa, NULL);
		struct itimerval it = {{0, 100}, {0, 100}};
		setitimer(ITIMER_REAL, &it, NULL);
		uint32_t x = 12345;
		for (;;) {
			x = x * 1103515245u + 12345u;
			size_t size = 1024 * (1 + (x >> 16) % 31);
			char *p = malloc(size);
			if (!p)
				abort();
			p[0] = (char)x;
			p[size - 1] = (char)size;
			free(p);
			tick();
		}
	}
	if (!strcmp(mode, "strict")) {
		if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT) != 0)
			die("prctl", "PR_SET_SECCOMP");
		char buf[256];
		for (;;) {
			long n = syscall(SYS_read, 0, buf, sizeof(buf));
			if (n <= 0)
				syscall(SYS_exit, 0);
			syscall(SYS_write, 1, "got\n", 4);
		}
	}
	die("unknown mode", mode);
	return 2;
}
