/*
 * grace-policy: the check in a helper process (see grace.h and docs/SPANK.md
 * "The deadline").
 *
 * Why a process and not a thread: glibc's seteuid/setresuid/setgroups in a
 * threaded process signal every thread (SIGSETXID) and wait for each to run
 * the handler. A thread blocked in an uninterruptible file-system wait (a
 * FUSE daemon that never answers, a hard-mounted NFS server that is gone)
 * never does, so slurmstepd's next credential change - right after
 * user_init - would never return, the tasks would never start, and the step
 * could not even be cancelled. A child process shares no such barrier: when
 * it hangs, slurmstepd kills it (SIGKILL to its process group) and goes on
 * with on_error; the kill takes effect when the wait ends.
 *
 * The child is forked from user_init and is single-threaded. It never calls
 * into Slurm (another thread of slurmstepd may have held a Slurm lock at the
 * fork) and it starts the interpreter itself, fresh: slurmstepd never runs
 * Python (field notes §3). It keeps slurmstepd's credentials at user_init
 * (euid/egid and groups of the user, real and saved uid root), so the user
 * can neither signal nor trace it, and Python reads exactly what the user
 * could read. It keeps four descriptors: the result pipe, the audit file
 * and the two verdict-cache files (the user's and the node-wide one, all opened
 * by root in slurm_spank_init); all
 * others are closed at once, so it never holds the step's I/O or
 * slurmstepd's sockets open. It dies with the thread that forked it
 * (PR_SET_PDEATHSIG) and ends with _exit(), running none of slurmstepd's
 * atexit handlers.
 *
 * The result comes back as records on the pipe: one byte of kind, four of
 * length (host order), the bytes. The parent trusts nothing without the
 * final 'Z' record (the helper reached its end).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "grace.h"

/* More than any real result (a few KiB); a helper sending more is broken. */
#define GRACE_RESULT_MAX (8u << 20)

/* ------------------------------------------------------------------------ */
/* The child                                                                */

/*
 * The Python part, loaded in the child on a cache miss. RTLD_GLOBAL: its
 * libpython must be visible to the extension modules Python loads later
 * (grace_python.c also promotes libpython itself, RTLD_NOLOAD|RTLD_GLOBAL).
 * Slurm loaded this stub RTLD_LOCAL; the Python part never calls back into
 * it (grace_emit lives there), so nothing needs to resolve against us.
 */
static grace_python_check_fn grace_python_load(const struct grace_context *ctx, char *err,
					       size_t errlen)
{
	char path[sizeof(ctx->plugin_dir) + 64];
	grace_python_check_fn check = NULL;
	void *handle;
	const char *why;

	if (ctx->plugin_dir[0] == '\0') {
		snprintf(err, errlen, "cannot find the Python part: the plugin's own "
			 "directory is unknown");
		return NULL;
	}
	snprintf(path, sizeof(path), "%s/../grace-policy/" GRACE_PY_LIBRARY, ctx->plugin_dir);
	handle = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
	if (handle == NULL) {
		why = dlerror();
		snprintf(err, errlen, "cannot load the Python part %.200s: %.250s", path,
			 why ? why : "unknown error");
		return NULL;
	}
	*(void **)&check = dlsym(handle, GRACE_PY_SYMBOL);
	if (check == NULL) {
		why = dlerror();
		snprintf(err, errlen, "cannot load the Python part %.200s: %.250s", path,
			 why ? why : "no " GRACE_PY_SYMBOL);
	}
	return check;
}

static double grace_ms_since(const struct timespec *t0)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(now.tv_sec - t0->tv_sec) * 1000.0 +
	       (double)(now.tv_nsec - t0->tv_nsec) / 1e6;
}

static int grace_write_all(int fd, const void *data, size_t len)
{
	const char *p = data;

	while (len > 0) {
		ssize_t n = write(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static void grace_send(int fd, char kind, const char *text)
{
	uint32_t len = text ? (uint32_t)strlen(text) : 0;
	char head[5];

	head[0] = kind;
	memcpy(head + 1, &len, sizeof(len));
	/* A failed write means the parent gave up: nothing left to do. */
	if (grace_write_all(fd, head, sizeof(head)) < 0 ||
	    (len && grace_write_all(fd, text, len) < 0))
		_exit(1);
}

static void grace_send_list(int fd, char kind, const struct grace_strlist *l)
{
	size_t i;

	for (i = 0; i < l->n; i++)
		grace_send(fd, kind, l->items[i]);
}

static int grace_keep(int fd, const int *keep, size_t nkeep)
{
	size_t i;

	for (i = 0; i < nkeep; i++)
		if (keep[i] == fd)
			return 1;
	return 0;
}

/* close_range(2) over [lo, hi], or -1 if the kernel has none (< 5.9). */
static int grace_close_span(unsigned int lo, unsigned int hi)
{
	if (lo > hi)
		return 0;
#ifdef SYS_close_range
	return (int)syscall(SYS_close_range, lo, hi, 0);
#else
	errno = ENOSYS;
	return -1;
#endif
}

static int grace_cmp_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;

	return (x > y) - (x < y);
}

/* Close every descriptor but keep[] (stdin/out/err become /dev/null), so the
 * helper never holds the step's I/O pipes or slurmstepd's sockets open. */
static void grace_close_others(const int *keep, size_t nkeep)
{
	int sorted[8];
	unsigned int lo = 0;
	size_t i, n = 0;
	int fd, null;

	for (i = 0; i < nkeep && n < 8; i++)
		if (keep[i] >= 0)
			sorted[n++] = keep[i];
	qsort(sorted, n, sizeof(sorted[0]), grace_cmp_int);
	for (i = 0; i <= n; i++) {
		unsigned int hi = i < n ? (unsigned int)sorted[i] : ~0u;

		if (i < n && hi == 0) {
			lo = 1;
			continue;
		}
		if (grace_close_span(lo, i < n ? hi - 1 : hi) != 0) {
			/* No close_range (kernel < 5.9): one by one, bounded. */
			long max = sysconf(_SC_OPEN_MAX);

			if (max < 0 || max > 65536)
				max = 65536;
			for (fd = (int)lo; fd < max && (i == n || fd < (int)hi); fd++)
				close(fd);
		}
		lo = hi + 1;
	}
	null = open("/dev/null", O_RDWR);
	for (fd = 0; fd < 3 && null >= 0; fd++)
		if (!grace_keep(fd, keep, nkeep) && fd != null)
			dup2(null, fd);
	if (null > 2 && !grace_keep(null, keep, nkeep))
		close(null);
}

static void grace_child(const struct grace_context *ctx, const struct grace_step *step,
			const struct timespec *started, int fd, pid_t parent)
{
	struct grace_outcome out;
	grace_python_check_fn check;
	struct sigaction dfl;
	sigset_t none;
	int keep[4] = { fd, ctx->audit_fd, ctx->cache_fd, ctx->node_cache_fd };
	char num[64];
	int sig;

	setpgid(0, 0);
	/* What ps shows in the COMMAND column's short form (comm): admins (and
	 * the tests) tell the helper from slurmstepd proper by it. */
	prctl(PR_SET_NAME, "grace-check", 0, 0, 0);
	/* Never outlive the slurmstepd thread that waits for us. */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(1);
	memset(&dfl, 0, sizeof(dfl));
	dfl.sa_handler = SIG_DFL;
	for (sig = 1; sig < NSIG; sig++)
		sigaction(sig, &dfl, NULL); /* SIGKILL/SIGSTOP: EINVAL, harmless */
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	grace_close_others(keep, 4);

	memset(&out, 0, sizeof(out));
	out.rc = -1;
	if (!step->batch &&
	    (step->container == NULL ||
	     (step->container_kind != NULL && step->container_local)) &&
	    grace_cache_lookup(ctx, step, out.mode, sizeof(out.mode))) {
		snprintf(num, sizeof(num), "%.3f", grace_ms_since(started));
		grace_send(fd, 'H', out.mode);
		grace_send(fd, 'T', num);
		grace_send(fd, 'Z', NULL);
		_exit(0);
	}
	check = grace_python_load(ctx, out.err, sizeof(out.err));
	if (check != NULL) {
		struct grace_step mine = *step;

		mine.result = &out.result;
		out.rc = check(ctx, &mine, out.err, sizeof(out.err));
	}
	grace_send_list(fd, 'U', &out.result.user);
	grace_send_list(fd, 'X', &out.result.unset);
	grace_send_list(fd, 'S', &out.result.set);
	grace_send_list(fd, 'L', &out.result.log);
	if (out.result.cache)
		grace_send(fd, 'C', out.result.cache);
	if (out.result.done)
		grace_send(fd, 'D', NULL);
	if (out.result.oom)
		grace_send(fd, 'O', NULL);
	if (out.err[0])
		grace_send(fd, 'E', out.err);
	snprintf(num, sizeof(num), "%d", out.rc);
	grace_send(fd, 'R', num);
	grace_send(fd, 'Z', NULL);
	/* No Py_Finalize, no atexit handlers of slurmstepd: the process ends. */
	_exit(0);
}

/* ------------------------------------------------------------------------ */
/* The parent (slurmstepd, user_init)                                       */

static int grace_list_add(struct grace_strlist *l, const char *s, size_t len)
{
	char *copy;

	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 8;
		char **items = realloc(l->items, cap * sizeof(*items));

		if (items == NULL)
			return -1;
		l->items = items;
		l->cap = cap;
	}
	copy = strndup(s, len);
	if (copy == NULL)
		return -1;
	l->items[l->n++] = copy;
	return 0;
}

static void grace_list_free(struct grace_strlist *l)
{
	size_t i;

	for (i = 0; i < l->n; i++)
		free(l->items[i]);
	free(l->items);
	l->items = NULL;
	l->n = l->cap = 0;
}

void grace_outcome_free(struct grace_outcome *out)
{
	grace_list_free(&out->result.user);
	grace_list_free(&out->result.unset);
	grace_list_free(&out->result.set);
	grace_list_free(&out->result.log);
	free(out->result.cache);
	out->result.cache = NULL;
}

static void grace_copy(char *dst, size_t cap, const char *src, size_t len)
{
	if (len >= cap)
		len = cap - 1;
	memcpy(dst, src, len);
	dst[len] = '\0';
}

/* Decode the records; 0 if they end with 'Z', else -1 (err set). */
static int grace_decode(const char *buf, size_t n, struct grace_outcome *out)
{
	size_t off = 0;
	char num[64];
	struct grace_strlist *l;

	while (off + 5 <= n) {
		char kind = buf[off];
		uint32_t len;
		const char *text;

		memcpy(&len, buf + off + 1, sizeof(len));
		if (len > n - off - 5)
			break;
		text = buf + off + 5;
		off += 5 + len;
		l = NULL;
		switch (kind) {
		case 'U': l = &out->result.user; break;
		case 'X': l = &out->result.unset; break;
		case 'S': l = &out->result.set; break;
		case 'L': l = &out->result.log; break;
		case 'C':
			free(out->result.cache);
			out->result.cache = strndup(text, len);
			if (out->result.cache == NULL)
				out->result.oom = 1;
			break;
		case 'D': out->result.done = 1; break;
		case 'O': out->result.oom = 1; break;
		case 'E': grace_copy(out->err, sizeof(out->err), text, len); break;
		case 'H':
			out->hit = 1;
			out->rc = GRACE_RC_ALLOW;
			grace_copy(out->mode, sizeof(out->mode), text, len);
			break;
		case 'T':
			grace_copy(num, sizeof(num), text, len);
			out->hit_ms = strtod(num, NULL);
			break;
		case 'R':
			grace_copy(num, sizeof(num), text, len);
			out->rc = (int)strtol(num, NULL, 10);
			break;
		case 'Z':
			return 0;
		default:
			break;
		}
		if (l != NULL && grace_list_add(l, text, len) < 0)
			out->result.oom = 1;
	}
	snprintf(out->err, sizeof(out->err), "the check's helper process ended without an "
		 "answer");
	return -1;
}

static long grace_ms_left(const struct timespec *until)
{
	struct timespec now;
	long ms;

	clock_gettime(CLOCK_MONOTONIC, &now);
	ms = (long)(until->tv_sec - now.tv_sec) * 1000L + (until->tv_nsec - now.tv_nsec) / 1000000L;
	return ms < 0 ? 0 : ms;
}

/* A descriptor that polls readable when the helper has exited (pidfd,
 * Linux 5.3+), or -1: then grace_reap looks again every 0.2 ms. */
static int grace_pidfd(pid_t pid)
{
#ifdef SYS_pidfd_open
	return (int)syscall(SYS_pidfd_open, pid, 0);
#else
	(void)pid;
	return -1;
#endif
}

/* Reap the helper if it is gone by the deadline; else kill its group and
 * leave it (slurmstepd's own wait for its tasks, or init, reaps it later).
 * *status: its wait status, or -1 if it was not reaped here. */
static void grace_reap(pid_t pid, const struct timespec *until, int kill_now, int *status)
{
	int pidfd = -2;

	*status = -1;
	if (kill_now) {
		kill(-pid, SIGKILL);
		kill(pid, SIGKILL);
	}
	for (;;) {
		pid_t got = waitpid(pid, status, WNOHANG);
		long left;

		if (got == pid || (got < 0 && errno != EINTR))
			goto done; /* reaped (or reaped by slurmstepd: ECHILD) */
		if (got != 0)
			continue; /* EINTR */
		left = grace_ms_left(until);
		if (left == 0)
			break;
		if (pidfd == -2)
			pidfd = grace_pidfd(pid);
		if (pidfd >= 0) {
			struct pollfd p = { .fd = pidfd, .events = POLLIN };

			poll(&p, 1, (int)(left > 60000 ? 60000 : left));
		} else {
			struct timespec pause = { 0, 200000 }; /* 0.2 ms */

			nanosleep(&pause, NULL);
		}
	}
	*status = -1;
	kill(-pid, SIGKILL);
	kill(pid, SIGKILL);
	/* One last look: a helper that was only slow to exit is gone now. */
	if (waitpid(pid, status, WNOHANG) != pid)
		*status = -1;
done:
	if (pidfd >= 0)
		close(pidfd);
}

int grace_helper_run(const struct grace_context *ctx, const struct grace_step *step,
		     const struct timespec *started, unsigned int timeout_ms,
		     struct grace_outcome *out)
{
	struct timespec until;
	char *buf = NULL;
	size_t n = 0, cap = 0;
	int fds[2], timed_out = 0, rc, status;
	pid_t pid, self = getpid();

	memset(out, 0, sizeof(*out));
	out->rc = -1;
	until = *started;
	until.tv_sec += timeout_ms / 1000;
	until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec += 1;
		until.tv_nsec -= 1000000000L;
	}
	if (pipe2(fds, O_CLOEXEC) != 0) {
		snprintf(out->err, sizeof(out->err), "cannot start the check's helper: pipe: %s",
			 strerror(errno));
		return -2;
	}
	pid = fork();
	if (pid < 0) {
		snprintf(out->err, sizeof(out->err), "cannot start the check's helper: fork: %s",
			 strerror(errno));
		close(fds[0]);
		close(fds[1]);
		return -2;
	}
	if (pid == 0) {
		close(fds[0]);
		grace_child(ctx, step, started, fds[1], self);
		_exit(1); /* not reached */
	}
	close(fds[1]);
	setpgid(pid, pid); /* also in the child: whichever runs first */

	for (;;) {
		struct pollfd p = { .fd = fds[0], .events = POLLIN };
		long left = grace_ms_left(&until);
		ssize_t got;

		if (left == 0) {
			timed_out = 1;
			break;
		}
		rc = poll(&p, 1, (int)(left > 60000 ? 60000 : left));
		if (rc < 0 && errno == EINTR)
			continue;
		if (rc < 0) {
			snprintf(out->err, sizeof(out->err), "waiting for the check's helper: %s",
				 strerror(errno));
			break;
		}
		if (rc == 0)
			continue;
		if (n == cap) {
			size_t ncap = cap ? cap * 2 : 4096;
			char *nb;

			if (ncap > GRACE_RESULT_MAX) {
				snprintf(out->err, sizeof(out->err), "the check's helper sent more "
					 "than %u bytes", GRACE_RESULT_MAX);
				break;
			}
			nb = realloc(buf, ncap);
			if (nb == NULL) {
				snprintf(out->err, sizeof(out->err), "out of memory");
				break;
			}
			buf = nb;
			cap = ncap;
		}
		got = read(fds[0], buf + n, cap - n);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			break; /* EOF: the helper is done (or died) */
		n += (size_t)got;
	}
	close(fds[0]);
	if (timed_out) {
		grace_reap(pid, &until, 1, &status);
		free(buf);
		return -1;
	}
	/* It answered (or broke): give it until the deadline to exit. */
	grace_reap(pid, &until, out->err[0] != '\0', &status);
	if (out->err[0] == '\0' && grace_decode(buf, n, out) != 0 && status != -1) {
		size_t used = strlen(out->err);

		if (WIFSIGNALED(status))
			snprintf(out->err + used, sizeof(out->err) - used, " (killed by signal %d)",
				 WTERMSIG(status));
		else if (WIFEXITED(status))
			snprintf(out->err + used, sizeof(out->err) - used, " (exit status %d)",
				 WEXITSTATUS(status));
	}
	free(buf);
	return 0;
}
