/*
 * grace-policy: the node checker's start and stop, in slurmd (checker=node;
 * docs/SPANK.md "The node checker", docs/SECURITY.md).
 *
 * Slurm 22.05 calls slurm_spank_init in slurmd's own context
 * (S_CTX_SLURMD) once, from main() in _slurmd_init(), before slurmd
 * daemonizes (xdaemon forks and the first process exits), and
 * slurm_spank_slurmd_exit from _slurmd_fini() at shutdown. So the server
 * must not die with the process or thread that started it
 * (PR_SET_PDEATHSIG would fire at the daemonize fork); it lives as long as
 * the write end of a pipe that only slurmd holds (O_CLOEXEC: no slurmstepd,
 * prolog or script keeps it across its exec). When slurmd exits, crashes or
 * is killed, the pipe reads EOF and the server ends (grace_policy/nodecheck.py).
 *
 * slurmd may already run threads: between fork and exec the children call
 * nothing but system calls (raw clone, dup2, setsid, sigaction, execve), all
 * arguments built before the fork. The server is a grandchild (the middle
 * child exits at once and slurmd reaps it right away), so slurmd never
 * waits for it and never finds an unknown child of its own.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "grace.h"

#ifndef GRACE_PY_EXE
#error "GRACE_PY_EXE (the embedded interpreter's executable) must be defined by the build"
#endif

/* The write end of the server's life pipe (slurmd only), or -1. */
static int grace_node_life = -1;

/* The server's start: the Python part's own module directories, in the
 * embedded interpreter's order (python_path, then the package dir), then
 * the checker's entry (contract.CHECKER_MODULE). -I -S: no PYTHON*
 * variable, no site, no user site-packages; -B: the install dir is not
 * written. */
static const char grace_node_boot[] =
	"import sys;sys.path.extend(p for p in sys.argv[2].split(':')+[sys.argv[1]] if p);"
	"from " GRACE_CHECKER_MODULE " import " GRACE_CHECKER_FUNCTION ";"
	"sys.exit(" GRACE_CHECKER_FUNCTION "(sys.argv[3:]))";

/* fork() without glibc's atfork handlers (slurmd's threads may hold their
 * locks): the child only makes system calls before it execs or exits. */
static pid_t grace_raw_fork(void)
{
	return (pid_t)syscall(SYS_clone, (unsigned long)SIGCHLD, 0UL, 0UL, 0UL, 0UL);
}

void grace_node_start(const struct grace_context *ctx)
{
	char pkgdir[sizeof(ctx->plugin_dir) + 32], code[GRACE_CODE_MAX];
	char *argv[24];
	char *envp[] = { "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C.UTF-8", NULL };
	struct sigaction dfl;
	sigset_t none;
	int life[2], n = 0, status, sig, null;
	pid_t pid;

	if (grace_node_life >= 0 || ctx->plugin_dir[0] == '\0' || ctx->checker_socket == NULL)
		return;
	snprintf(pkgdir, sizeof(pkgdir), "%s/../grace-policy/python", ctx->plugin_dir);
	/* As grace_stepd.c names the install of each step: the server judges
	 * only steps of the install it loaded. */
	if (grace_code(ctx->plugin_dir, ctx->python_path, code, sizeof(code)) != 0)
		return; /* no step could match it: every miss is checked by slurmstepd */
	argv[n++] = GRACE_PY_EXE;
	argv[n++] = "-I";
	argv[n++] = "-S";
	argv[n++] = "-B";
	argv[n++] = "-X";
	argv[n++] = "utf8";
	argv[n++] = "-c";
	argv[n++] = (char *)grace_node_boot;
	argv[n++] = pkgdir;
	argv[n++] = ctx->python_path ? ctx->python_path : "";
	argv[n++] = "--socket";
	argv[n++] = ctx->checker_socket;
	argv[n++] = "--code";
	argv[n++] = code;
	argv[n++] = "--life";
	argv[n++] = "3";
	if (ctx->cache_dir != NULL && ctx->cache_dir[0] == '/') {
		/* where it publishes the node's GPU facts for the cache (nodegpus.py) */
		argv[n++] = "--cache-dir";
		argv[n++] = ctx->cache_dir;
	}
#ifdef GRACE_TEST_HOOKS
	if (ctx->test_checker != NULL) {
		argv[n++] = "--test";
		argv[n++] = ctx->test_checker;
	}
#endif
	argv[n] = NULL;
	memset(&dfl, 0, sizeof(dfl));
	dfl.sa_handler = SIG_DFL;
	sigemptyset(&none);

	if (pipe2(life, O_CLOEXEC) != 0) {
		slurm_error(GRACE_PREFIX "node checker not started: pipe: %s (steps use "
			    "checker=step)", strerror(errno));
		return;
	}
	pid = grace_raw_fork();
	if (pid < 0) {
		slurm_error(GRACE_PREFIX "node checker not started: fork: %s (steps use "
			    "checker=step)", strerror(errno));
		close(life[0]);
		close(life[1]);
		return;
	}
	if (pid == 0) {
		/* The middle child: only system calls from here to execve. */
		if (grace_raw_fork() != 0)
			_exit(0);
		setsid();
		if (life[0] == 3)
			fcntl(3, F_SETFD, 0);
		else if (dup2(life[0], 3) != 3) /* also drops the write end if it was 3 */
			_exit(126);
		null = open("/dev/null", O_RDWR);
		if (null >= 0) {
			dup2(null, 0);
			dup2(null, 1);
			dup2(null, 2);
		}
#ifdef SYS_close_range
		syscall(SYS_close_range, 4U, ~0U, 0U);
#else
		for (sig = 4; sig < 65536; sig++)
			close(sig);
#endif
		for (sig = 1; sig < NSIG; sig++)
			sigaction(sig, &dfl, NULL);
		sigprocmask(SIG_SETMASK, &none, NULL);
		execve(GRACE_PY_EXE, argv, envp);
		_exit(127);
	}
	close(life[0]);
	/* The middle child exits at once; the server is init's (or the
	 * subreaper's) from then on. */
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	grace_node_life = life[1];
	slurm_info(GRACE_PREFIX "node checker starting (%s, socket %s)", GRACE_PY_EXE,
		   ctx->checker_socket);
}

/* slurmd is going: the server reads EOF on its pipe and ends. Not waited for. */
void grace_node_stop(void)
{
	if (grace_node_life >= 0) {
		close(grace_node_life);
		grace_node_life = -1;
	}
}
