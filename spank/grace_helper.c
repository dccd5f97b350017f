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
 * could read. It keeps three descriptors: the result pipe and the two
 * verdict-cache files (the user's and the node-wide one, opened by root in
 * slurm_spank_init), and closes those two once the lookup is over, before
 * Python starts; all others are closed at once, so it never holds the
 * step's I/O, the audit file or slurmstepd's sockets open. The check
 * confines itself before it reads the policy (grace_policy/checker/
 * confine.py, from slurm_bridge), and its standing before the OOM killer
 * is reset here (grace_fair_oom). It dies with the thread that forked it
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
#include <grp.h>
#include <sys/fsuid.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "grace.h"
#include "grace_wire.h"

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

/* Stand before the OOM killer as any process (0), not as slurmstepd, which
 * many sites run at -1000 and every child inherits (pyxis resets enroot's
 * the same way): a check that grows is then a candidate like the job's own
 * processes, not the last thing the kernel would kill. The file is root's
 * once the credentials changed, so it is opened with root's file-system
 * uid (the real uid is root's; setfsuid is per thread, and this process
 * has one) and the user's is back before anything else is opened. */
static void grace_fair_oom(void)
{
	uid_t fsuid = (uid_t)setfsuid((uid_t)-1); /* -1 changes nothing: the current one */
	int fd;

	if (fsuid != 0)
		setfsuid(0);
	fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
	if (fsuid != 0)
		setfsuid(fsuid);
	if (fd >= 0) {
		if (write(fd, "0\n", 2) != 2) {
			/* left as it was: the data limit still bounds the check */
		}
		close(fd);
	}
}

/* What every helper does first: its own process group and name, death with
 * the thread that forked it, default signals, only keep[] left open. */
static void grace_child_detach(const int *keep, size_t nkeep, pid_t parent)
{
	struct sigaction dfl;
	sigset_t none;
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
	grace_close_others(keep, nkeep);
	grace_fair_oom();
}

/* The check's result as records, ending with GRACE_REC_END. */
static void grace_send_outcome(int fd, const struct grace_outcome *out)
{
	char num[64];

	grace_send_list(fd, GRACE_REC_USER, &out->result.user);
	grace_send_list(fd, GRACE_REC_UNSET, &out->result.unset);
	grace_send_list(fd, GRACE_REC_SET, &out->result.set);
	grace_send_list(fd, GRACE_REC_LOG, &out->result.log);
	if (out->result.cache)
		grace_send(fd, GRACE_REC_CACHE, out->result.cache);
	if (out->result.pull)
		grace_send(fd, GRACE_REC_PULL, NULL);
	if (out->result.done)
		grace_send(fd, GRACE_REC_DONE, NULL);
	if (out->result.failure[0])
		grace_send(fd, GRACE_REC_FAIL, out->result.failure);
	if (out->result.oom)
		grace_send(fd, GRACE_REC_OOM, NULL);
	if (out->err[0])
		grace_send(fd, GRACE_REC_ERROR, out->err);
	snprintf(num, sizeof(num), "%d", out->rc);
	grace_send(fd, GRACE_REC_RC, num);
	grace_send(fd, GRACE_REC_END, NULL);
}

/* lookup_only: the pre-started helper has the step; on a miss say so ('M')
 * and end instead of starting Python here. */
static void grace_child(const struct grace_context *ctx, const struct grace_step *step,
			const struct timespec *started, int fd, pid_t parent, int lookup_only)
{
	struct grace_outcome out;
	grace_python_check_fn check;
	int keep[3] = { fd, ctx->cache_fd, ctx->node_cache_fd };
	char num[64];

	grace_child_detach(keep, 3, parent);
	memset(&out, 0, sizeof(out));
	out.rc = -1;
	if (grace_cache_lookup(ctx, step, out.mode, sizeof(out.mode))) {
		snprintf(num, sizeof(num), "%.3f", grace_ms_since(started));
		grace_send(fd, GRACE_REC_HIT, out.mode);
		grace_send(fd, GRACE_REC_HIT_MS, num);
		grace_send(fd, GRACE_REC_END, NULL);
		_exit(0);
	}
	if (lookup_only) {
		grace_send(fd, GRACE_REC_MISS, NULL);
		grace_send(fd, GRACE_REC_END, NULL);
		_exit(0);
	}
	/* The lookup is over: the check that parses the user's files must not
	 * hold the verdict caches (the node-wide one is replayed for every
	 * user) open for writing. slurmstepd appends the entry it returns. */
	if (ctx->cache_fd >= 0)
		close(ctx->cache_fd);
	if (ctx->node_cache_fd >= 0)
		close(ctx->node_cache_fd);
	check = grace_python_load(ctx, out.err, sizeof(out.err));
	if (check != NULL) {
		struct grace_step mine = *step;

		mine.result = &out.result;
		out.rc = check(ctx, &mine, out.err, sizeof(out.err));
	}
	grace_send_outcome(fd, &out);
	/* No Py_Finalize, no atexit handlers of slurmstepd: the process ends. */
	_exit(0);
}

/* ------------------------------------------------------------------------ */
/* The parent (slurmstepd, user_init)                                       */

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

/* Read the helper's records from fd until EOF, an error or the deadline.
 * 1: the deadline passed; 0 otherwise (out->err set on an error). */
static int grace_read_records(int fd, const struct timespec *until, char **bufp, size_t *np,
			      struct grace_outcome *out)
{
	char *buf = NULL;
	size_t n = 0, cap = 0;
	int rc, timed_out = 0;

	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		long left = grace_ms_left(until);
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
			out->failure = GRACE_FAIL_INTERNAL;
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
				out->failure = GRACE_FAIL_CHECK;
				break;
			}
			nb = realloc(buf, ncap);
			if (nb == NULL) {
				snprintf(out->err, sizeof(out->err), "out of memory");
				out->failure = GRACE_FAIL_INTERNAL;
				break;
			}
			buf = nb;
			cap = ncap;
		}
		got = read(fd, buf + n, cap - n);
		if (got < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (got <= 0)
			break; /* EOF: the helper is done (or died) */
		n += (size_t)got;
	}
	*bufp = buf;
	*np = n;
	return timed_out;
}

/* Decode what an ended helper sent; say how it ended if it sent no 'Z'. */
static void grace_decode_ended(const char *buf, size_t n, int status, struct grace_outcome *out)
{
	size_t used;

	if (out->err[0] != '\0' || grace_decode(buf, n, out) == 0 || status == -1)
		return;
	used = strlen(out->err);
	if (WIFSIGNALED(status))
		snprintf(out->err + used, sizeof(out->err) - used, " (killed by signal %d)",
			 WTERMSIG(status));
	else if (WIFEXITED(status))
		snprintf(out->err + used, sizeof(out->err) - used, " (exit status %d)",
			 WEXITSTATUS(status));
}

void grace_deadline(const struct timespec *started, unsigned int timeout_ms,
		    struct timespec *until)
{
	*until = *started;
	until->tv_sec += timeout_ms / 1000;
	until->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (until->tv_nsec >= 1000000000L) {
		until->tv_sec += 1;
		until->tv_nsec -= 1000000000L;
	}
}

/* ------------------------------------------------------------------------ */
/* The pre-started helper                                                   */
/*
 * Forked in slurm_spank_init (remote context, as root, before slurmstepd
 * sets the step up), it loads the Python part, starts the interpreter and
 * imports what a miss needs, all from root-owned install paths, while
 * slurmstepd does its own work. Then it blocks on its socket. In user_init
 * slurmstepd sends two frames (a u32 length, then the bytes): first its
 * credentials at that moment (the user's euid/egid/groups, root's real and
 * saved ids), which the helper takes - setgroups, setresgid, setresuid; it is
 * single-threaded, so that is safe - before it reads the second frame, the
 * step. A cache hit is still answered by the lookup child forked in
 * user_init (which then kills this helper): a hit never waits for Python.
 * On a miss the parent waits for this helper's records, under the same
 * deadline. A helper that is gone before it took the step ('A' is its first
 * record) is replaced by today's path: a fresh child that does it all.
 */

/* The pre-started helper's nice value until the step comes. */
#define GRACE_PRESTART_NICE 10
/* How long a hit waits for the dismissed helper to be gone (SIGKILL of a
 * running process takes microseconds); then slurmstepd or init reaps it. */
#define GRACE_DISMISS_MS 500

static pid_t grace_pre_pid = -1;
static int grace_pre_sock = -1;

static int grace_read_all(int fd, void *data, size_t len)
{
	char *p = data;

	while (len > 0) {
		ssize_t n = read(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* One frame (allocated), or NULL at EOF or on a bad length. */
static char *grace_read_frame(int fd, size_t *len)
{
	uint32_t n;
	char *frame;

	if (grace_read_all(fd, &n, sizeof(n)) != 0 || n > GRACE_FRAME_MAX)
		return NULL;
	frame = malloc(n ? n : 1);
	if (frame != NULL && grace_read_all(fd, frame, n) != 0) {
		free(frame);
		frame = NULL;
	}
	*len = n;
	return frame;
}

/* Become what slurmstepd was at user_init: groups, then gids, then uids
 * (the last while still root). 0 only if all of it took. */
static int grace_take_creds(const char *frame, size_t len)
{
	struct grace_cursor c = { frame, len, 0 };
	struct grace_creds cr;
	uid_t ru2, eu2, su2;
	int rc = -1;

	if (grace_get_creds(&c, &cr) == 0 && setgroups(cr.ngroups, cr.groups) == 0 &&
	    setresgid(cr.rgid, cr.egid, cr.sgid) == 0 && setresuid(cr.ruid, cr.euid, cr.suid) == 0 &&
	    getresuid(&ru2, &eu2, &su2) == 0 && ru2 == cr.ruid && eu2 == cr.euid &&
	    su2 == cr.suid && getegid() == cr.egid)
		rc = 0;
	free(cr.groups);
	return rc;
}

static void grace_prestart_main(const struct grace_context *ctx, int sock, pid_t parent)
{
	struct grace_context mine;
	struct grace_outcome out;
	struct grace_step step;
	grace_python_check_fn check;
	int keep[1] = { sock };
	char scratch[512];
	char *frame, *creds;
	size_t len;

	grace_child_detach(keep, 1, parent);
#ifdef GRACE_TEST_HOOKS
	if (ctx->test_prestart != NULL && strcmp(ctx->test_prestart, "die") == 0)
		_exit(3);
	while (ctx->test_prestart != NULL && strcmp(ctx->test_prestart, "hang") == 0)
		pause(); /* as an interpreter start hung on a dead file system */
#endif
	memset(&out, 0, sizeof(out));
	out.rc = -1;
	mine = *ctx;
	mine.preload_fd = sock;
	ctx = &mine;
	/* Behind slurmstepd's own set-up, which is the launch's critical path. */
	setpriority(PRIO_PROCESS, 0, GRACE_PRESTART_NICE);
	check = grace_python_load(ctx, out.err, sizeof(out.err));
	if (check != NULL)
		check(ctx, NULL, scratch, sizeof(scratch)); /* start + preload only */
	creds = grace_read_frame(sock, &len);
	/* A miss waits for us now: full priority (still root), then the user. */
	setpriority(PRIO_PROCESS, 0, 0);
	if (creds == NULL || grace_take_creds(creds, len) != 0)
		_exit(1);
	free(creds);
	frame = grace_read_frame(sock, &len);
	if (frame == NULL)
		_exit(0);
	{
		struct grace_cursor c = { frame, len, 0 };

		if (grace_get_step(&c, &step) != 0)
			_exit(1);
	}
	grace_send(sock, GRACE_REC_ACCEPTED, NULL);
	if (check != NULL) {
		step.result = &out.result;
		out.rc = check(ctx, &step, out.err, sizeof(out.err));
	}
	grace_send_outcome(sock, &out);
	_exit(0);
}

void grace_helper_prestart(const struct grace_context *ctx)
{
	int sv[2], big = 4 << 20;
	pid_t pid, self = getpid();

	if (grace_pre_pid > 0)
		return;
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
		return; /* user_init takes today's path */
	pid = fork();
	if (pid < 0) {
		close(sv[0]);
		close(sv[1]);
		return;
	}
	if (pid == 0) {
		close(sv[0]);
		grace_prestart_main(ctx, sv[1], self);
		_exit(1); /* not reached */
	}
	close(sv[1]);
	setpgid(pid, pid);
	/* The step frame must fit at once: user_init never waits to send. */
	if (setsockopt(sv[0], SOL_SOCKET, SO_SNDBUFFORCE, &big, sizeof(big)) != 0)
		setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
	fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
	grace_pre_pid = pid;
	grace_pre_sock = sv[0];
}

/* Kill the pre-started helper (not needed, or not usable), reap it (a
 * child left over makes the step's end wait: measured +100 ms) and forget
 * it. The wait is bounded: one stuck in the kernel is left to slurmstepd. */
static void grace_pre_dismiss(void)
{
	struct timespec until;
	int status;

	if (grace_pre_pid <= 0)
		return;
	close(grace_pre_sock);
	clock_gettime(CLOCK_MONOTONIC, &until);
	until.tv_nsec += GRACE_DISMISS_MS * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec += 1;
		until.tv_nsec -= 1000000000L;
	}
	grace_reap(grace_pre_pid, &until, 1, &status);
	grace_pre_pid = -1;
	grace_pre_sock = -1;
}

/* Hand the step to the pre-started helper: 1 if it has it, else 0 (and
 * the helper is gone). Never blocks: it all fits in the socket buffer. */
static int grace_pre_hand(const struct grace_step *step)
{
	struct grace_wbuf b = { 0 };
	size_t at, off = 0;
	int ok = 0;

	if (grace_pre_pid <= 0)
		return 0;
	at = grace_begin_frame(&b);
	if (grace_put_creds(&b) == 0) {
		grace_end_frame(&b, at);
		at = grace_begin_frame(&b);
		grace_put_step(&b, step);
		grace_end_frame(&b, at);
		ok = !b.oom;
	}
	while (ok && off < b.n) {
		ssize_t sent = send(grace_pre_sock, b.p + off, b.n - off, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (sent < 0 && errno == EINTR)
			continue;
		if (sent <= 0)
			ok = 0; /* gone (EPIPE) or full (EAGAIN): not worth waiting for */
		else
			off += (size_t)sent;
	}
	free(b.p);
	if (!ok)
		grace_pre_dismiss();
	return ok;
}

/* The pre-started helper's answer. 0: out filled; -1: no answer by the
 * deadline (killed); 1: it was gone before it took the step. */
static int grace_pre_wait(const struct timespec *until, struct grace_outcome *out)
{
	char *buf = NULL;
	size_t n = 0;
	int status, timed_out;
	pid_t pid = grace_pre_pid;

	timed_out = grace_read_records(grace_pre_sock, until, &buf, &n, out);
	close(grace_pre_sock);
	grace_pre_sock = -1;
	grace_pre_pid = -1;
	if (timed_out) {
		grace_reap(pid, until, 1, &status);
		free(buf);
		return -1;
	}
	grace_reap(pid, until, out->err[0] != '\0', &status);
	if (out->err[0] == '\0' && (n < 5 || buf[0] != GRACE_REC_ACCEPTED)) {
		free(buf);
		return 1;
	}
	grace_decode_ended(buf, n, status, out);
	free(buf);
	return 0;
}


/* ------------------------------------------------------------------------ */
/* The node checker's client (checker=node; grace_node.c starts the server) */
/*
 * slurm_spank_init (root) connects to the server's socket and checks that
 * root is at the other end (SO_PEERCRED: the socket lives in a root-only
 * directory, but that is the server's promise, not ours). The server only
 * holds the connection until we write or close it: on a miss it hands it
 * to a child it forked ahead of time (or forks one then), which has read
 * nothing of any step. On a miss, user_init sends two frames: first the
 * credentials slurmstepd has now (the user's euid/egid/groups, root's real
 * and saved ids, as grace_put_creds), the time left and the install that
 * sends it ('code', as the step's), and no descriptor (slurmstepd writes the
 * audit line itself); the child takes the credentials, then reads the second
 * frame, the step, and answers with the same records as the helper forked
 * here ('A' first, 'Z' last). 'V' first: the server runs another install;
 * EOF before 'A': it is gone. Both mean today's path, under the same
 * deadline. A hit, or any end of user_init, just closes the connection:
 * the server reads EOF and forks nothing.
 */

/* Create the once-per-server marker; 1 if this call created it. */
static int grace_node_once(const struct grace_context *ctx)
{
	char path[4200], dir[4200], *slash;
	int fd;

	snprintf(path, sizeof(path), "%s.down", ctx->checker_socket);
	snprintf(dir, sizeof(dir), "%s", ctx->checker_socket);
	slash = strrchr(dir, '/');
	if (slash != NULL && slash != dir) {
		*slash = '\0';
		if (mkdir(dir, 0700) != 0 && errno != EEXIST)
			return 1; /* no place to remember it: say it every time */
	}
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return errno == EEXIST ? 0 : 1;
	close(fd);
	return 1;
}

/* A connection to the node checker at path (non-blocking, CLOEXEC, its peer
 * checked to be root's). 0: *fdp; 1: its backlog is full (busy, not dead);
 * -1: why says what failed. Made while slurmstepd is still root: the
 * server takes only root's connections (SO_PEERCRED is the connect()er's). */
static int grace_node_dial(const char *path, int *fdp, char *why, size_t whylen)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	struct ucred peer;
	socklen_t len = sizeof(peer);
	int fd, big = 4 << 20;

	if (path == NULL || strlen(path) >= sizeof(addr.sun_path)) {
		snprintf(why, whylen, "the socket path is too long");
		return -1;
	}
	strcpy(addr.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		snprintf(why, whylen, "%s", strerror(errno));
		return -1;
	}
	if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
		int busy = errno == EAGAIN;

		snprintf(why, whylen, "connect: %s", strerror(errno));
		close(fd);
		return busy ? 1 : -1;
	}
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 || peer.uid != 0) {
		snprintf(why, whylen, "the process at the socket is not root's");
		close(fd);
		return -1;
	}
	if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &big, sizeof(big)) != 0)
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
	*fdp = fd;
	return 0;
}

void grace_node_connect(struct grace_context *ctx, spank_t sp)
{
	char why[256];
	uint32_t job_id = 0;
	int rc;

	rc = grace_node_dial(ctx->checker_socket, &ctx->checker_fd, why, sizeof(why));
	/* Busy (more steps starting at once than it has accepted yet): this
	 * step is checked by a helper of its own, and nothing is marked, so
	 * the server's real death is still said when it comes. */
	if (rc >= 0 || !grace_node_once(ctx))
		return;
	spank_get_item(sp, S_JOB_ID, &job_id);
	slurm_info(GRACE_PREFIX "error: job %u: node checker at %s not reachable (%s): cold "
		   "steps are checked by a helper of slurmstepd (checker=step) until slurmd "
		   "restarts the checker; said once until then (failure %s)", job_id,
		   ctx->checker_socket, why, GRACE_FAIL_CHECKER);
}

int grace_afterpull_dial(const struct grace_context *ctx)
{
	char why[256];
	int fd = -1;

	return grace_node_dial(ctx->checker_socket, &fd, why, sizeof(why)) == 0 ? fd : -1;
}

static void grace_node_close(struct grace_context *ctx)
{
	if (ctx->checker_fd >= 0)
		close(ctx->checker_fd);
	ctx->checker_fd = -1;
}

/* Send b whole by the deadline. No descriptor goes with it: the audit
 * file is written by slurmstepd alone, so the process that parses the
 * user's files never holds it (the frame's audit_fd only says it is open). */
static int grace_node_send(int sock, const struct grace_wbuf *b, const struct timespec *until)
{
	size_t off = 0;

	while (off < b->n) {
		struct iovec iov = { b->p + off, b->n - off };
		struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
		struct pollfd p = { .fd = sock, .events = POLLOUT };
		ssize_t sent;

		sent = sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (sent > 0) {
			off += (size_t)sent;
			continue;
		}
		if (sent < 0 && errno == EINTR)
			continue;
		if (sent < 0 && errno == EAGAIN && grace_ms_left(until) > 0) {
			poll(&p, 1, (int)grace_ms_left(until));
			continue;
		}
		return -1;
	}
	return 0;
}

int grace_node_req_make(struct grace_node_req *r, const struct grace_step *step)
{
	const char *path = getenv("PATH");
	size_t at;

	memset(r, 0, sizeof(*r));
	r->code = step->code;
	/* slurmstepd's own PATH, which its children (pyxis' enroot) search and
	 * the forked helper of checker=step inherits; the node checker started
	 * with a fixed one. */
	r->path = path ? strdup(path) : NULL;
	at = grace_begin_frame(&r->step);
	grace_put_step(&r->step, step);
	grace_end_frame(&r->step, at);
	if ((path && r->path == NULL) || r->step.oom || grace_put_creds(&r->creds) != 0) {
		grace_node_req_free(r);
		return -1;
	}
	return 0;
}

void grace_node_req_free(struct grace_node_req *r)
{
	free(r->creds.p);
	free(r->step.p);
	free(r->path);
	memset(r, 0, sizeof(*r));
}

/* One request on sock: the credentials frame (slurmstepd's ids, then the
 * deadline, the install's code and PATH), the step's frame, then the
 * records until the child closes. 0: answered (out filled); -1: no answer
 * by the deadline; 1: the server could not take the step (out->err says
 * why). */
static int grace_node_exchange(int sock, const struct grace_node_req *r,
			       const struct timespec *until, struct grace_outcome *out)
{
	struct grace_wbuf b = { 0 };
	size_t at, n = 0;
	char *buf = NULL;
	int timed_out, rc = 1;

	at = grace_begin_frame(&b);
	grace_put(&b, r->creds.p, r->creds.n);
	grace_put_request_tail(&b, (uint32_t)grace_ms_left(until), r->code, r->path);
	grace_end_frame(&b, at);
	grace_put(&b, r->step.p, r->step.n);
	if (b.oom || grace_node_send(sock, &b, until) != 0) {
		free(b.p);
		snprintf(out->err, sizeof(out->err), "the node checker did not take the step "
			 "(%s)", b.oom ? "out of memory" : "it is gone");
		return 1;
	}
	free(b.p);
	timed_out = grace_read_records(sock, until, &buf, &n, out);
	if (timed_out) {
		/* Its child stops itself at the same deadline (its own timer). */
		rc = -1;
	} else if (out->err[0] == '\0' && n >= 5 && buf[0] == GRACE_REC_ACCEPTED) {
		grace_decode_ended(buf, n, -1, out);
		rc = 0;
	} else if (n >= 5 && buf[0] == GRACE_REC_STALE) {
		uint32_t len;

		memcpy(&len, buf + 1, sizeof(len));
		snprintf(out->err, sizeof(out->err), "the node checker is stale: %.*s",
			 (int)(len < n - 5 ? len : n - 5), buf + 5);
	} else if (out->err[0] == '\0') {
		snprintf(out->err, sizeof(out->err), "the node checker ended before it took "
			 "the step");
	}
	free(buf);
	return rc;
}

static int grace_node_run(struct grace_context *ctx, const struct grace_step *step,
			  const struct timespec *until, struct grace_outcome *out)
{
	struct grace_node_req r;
	int rc;

	if (grace_node_req_make(&r, step) != 0) {
		snprintf(out->err, sizeof(out->err), "cannot read slurmstepd's credentials "
			 "or encode the step");
		grace_node_close(ctx);
		return 1;
	}
	rc = grace_node_exchange(ctx->checker_fd, &r, until, out);
	grace_node_req_free(&r);
	grace_node_close(ctx);
	return rc;
}

/* ------------------------------------------------------------------------ */
/* user_init                                                                */

/* Fork a child that looks the step up in the cache and, unless lookup_only,
 * runs the check on a miss. 0: out filled; -1: timed out; -2: no child. */
static int grace_fork_child(const struct grace_context *ctx, const struct grace_step *step,
			    const struct timespec *started, const struct timespec *until,
			    int lookup_only, struct grace_outcome *out)
{
	char *buf = NULL;
	size_t n = 0;
	int fds[2], timed_out, status;
	pid_t pid, self = getpid();

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
		grace_child(ctx, step, started, fds[1], self, lookup_only);
		_exit(1); /* not reached */
	}
	close(fds[1]);
	setpgid(pid, pid); /* also in the child: whichever runs first */
	timed_out = grace_read_records(fds[0], until, &buf, &n, out);
	close(fds[0]);
	if (timed_out) {
		grace_reap(pid, until, 1, &status);
		free(buf);
		return -1;
	}
	/* It answered (or broke): give it until the deadline to exit. */
	grace_reap(pid, until, out->err[0] != '\0', &status);
	grace_decode_ended(buf, n, status, out);
	free(buf);
	return 0;
}

int grace_helper_run(struct grace_context *ctx, const struct grace_step *step,
		     const struct timespec *started, unsigned int timeout_ms,
		     struct grace_outcome *out)
{
	struct timespec until;
	int pre, rc;

	memset(out, 0, sizeof(*out));
	out->rc = -1;
	grace_deadline(started, timeout_ms, &until);
	/* A hit is answered by the lookup child alone, as without a pre-started
	 * helper; only a miss hands the step over (and the helper, which never
	 * saw it, is killed otherwise). */
	pre = grace_pre_pid > 0 || ctx->checker_fd >= 0;
	if (pre && ctx->cache_fd < 0) {
		/* No cache to look in (cache_dir=none, or it could not be
		 * opened; grace_cache_lookup would say miss): no lookup child. */
		out->miss = 1;
		rc = 0;
	} else {
		rc = grace_fork_child(ctx, step, started, &until, pre, out);
	}
	if (rc != 0 || !out->miss) {
		grace_pre_dismiss();
		grace_node_close(ctx);
		return rc;
	}
	if (ctx->checker_fd >= 0) {
		memset(out, 0, sizeof(*out));
		out->rc = -1;
		rc = grace_node_run(ctx, step, &until, out);
		if (rc != 1) {
			grace_pre_dismiss();
			return rc;
		}
		/* Said with this step: the checker was there at slurm_spank_init. */
		slurm_info(GRACE_PREFIX "error: job %u step %u: %s: checked by a helper of "
			   "slurmstepd instead (failure %s)", step->job_id, step->step_id, out->err,
			   GRACE_FAIL_CHECKER);
	}
	memset(out, 0, sizeof(*out));
	out->rc = -1;
	rc = grace_pre_hand(step) ? grace_pre_wait(&until, out) : 1;
	if (rc != 1)
		return rc;
	/* The pre-started helper was gone before it took the step: today's path. */
	memset(out, 0, sizeof(*out));
	out->rc = -1;
	return grace_fork_child(ctx, step, started, &until, 0, out);
}

/* ------------------------------------------------------------------------ */
/* The after-pull helper (grace_afterpull.c)                                */
/*
 * Forked in user_init exactly as the helper above (same credentials, same
 * detach, only its socket kept), for a pyxis step whose image pyxis pulls
 * in its task_init. It starts the interpreter and preloads while pyxis
 * pulls, then blocks until the first task sends one byte: the container's
 * root exists now. It runs the check of the step it was forked with (the
 * after_pull line in container_args makes Python judge that root) and
 * answers with the same records, then ends. EOF instead of the byte (no
 * task asked: pyxis failed, or every task has exec'd and slurmstepd closed
 * its copy) ends it at once. A task cannot signal it (its real and saved
 * uids are root's); a task that stops waiting just closes its end, and the
 * helper's next write fails and ends it.
 */
static void grace_afterpull_main(const struct grace_context *ctx, const struct grace_step *step,
				 int sock, pid_t parent)
{
	struct grace_context mine = *ctx;
	struct grace_outcome out;
	grace_python_check_fn check;
	int keep[1] = { sock };
	char scratch[512], go;
	ssize_t n;

	grace_child_detach(keep, 1, parent);
	memset(&out, 0, sizeof(out));
	out.rc = -1;
	mine.preload_fd = sock; /* the preload stops when a task asks */
	check = grace_python_load(&mine, out.err, sizeof(out.err));
	if (check != NULL)
		check(&mine, NULL, scratch, sizeof(scratch));
	do
		n = read(sock, &go, 1);
	while (n < 0 && errno == EINTR);
	if (n != 1)
		_exit(0);
#ifdef GRACE_TEST_HOOKS
	/* Test builds only: a helper that crashes, or hangs on a dead mount,
	 * once a task has asked. */
	if (ctx->test_afterpull != NULL && strcmp(ctx->test_afterpull, "die") == 0)
		_exit(3);
	while (ctx->test_afterpull != NULL && strcmp(ctx->test_afterpull, "hang") == 0)
		pause();
#endif
	mine.preload_fd = -1;
	if (check != NULL) {
		struct grace_step st = *step;

		st.result = &out.result;
		out.rc = check(&mine, &st, out.err, sizeof(out.err));
	}
	grace_send_outcome(sock, &out);
	_exit(0);
}

int grace_afterpull_fork(const struct grace_context *ctx, const struct grace_step *step,
			 int *sock, char *err, size_t errlen)
{
	int sv[2];
	pid_t pid, self = getpid();

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
		snprintf(err, errlen, "cannot start the after-pull helper: socketpair: %s",
			 strerror(errno));
		return -1;
	}
	pid = fork();
	if (pid < 0) {
		snprintf(err, errlen, "cannot start the after-pull helper: fork: %s",
			 strerror(errno));
		close(sv[0]);
		close(sv[1]);
		return -1;
	}
	if (pid == 0) {
		close(sv[0]);
		grace_afterpull_main(ctx, step, sv[1], self);
		_exit(1); /* not reached */
	}
	close(sv[1]);
	setpgid(pid, pid);
	*sock = sv[0];
	return 0;
}

int grace_afterpull_ask(int sock, const struct timespec *started, unsigned int timeout_ms,
			struct grace_outcome *out)
{
	struct timespec until;
	char *buf = NULL;
	size_t n = 0;
	ssize_t sent;
	int timed_out;

	memset(out, 0, sizeof(*out));
	out->rc = -1;
	grace_deadline(started, timeout_ms, &until);
	do
		sent = send(sock, "!", 1, MSG_NOSIGNAL);
	while (sent < 0 && errno == EINTR);
	if (sent != 1) {
		snprintf(out->err, sizeof(out->err), "the after-pull helper is gone (%s)",
			 sent < 0 ? strerror(errno) : "no byte sent");
		out->failure = GRACE_FAIL_CHECK;
		return 1;
	}
	timed_out = grace_read_records(sock, &until, &buf, &n, out);
	if (timed_out) {
		free(buf);
		return -1;
	}
	grace_decode_ended(buf, n, -1, out);
	free(buf);
	return 0;
}

int grace_afterpull_ask_node(int sock, const struct grace_node_req *r,
			     const struct timespec *started, unsigned int timeout_ms,
			     struct grace_outcome *out)
{
	struct timespec until;
	int rc;

	memset(out, 0, sizeof(*out));
	out->rc = -1;
	grace_deadline(started, timeout_ms, &until);
	rc = grace_node_exchange(sock, r, &until, out);
	if (rc == 1 && out->failure == NULL)
		out->failure = GRACE_FAIL_CHECKER;
	return rc;
}
