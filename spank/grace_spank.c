/*
 * grace-policy SPANK plugin: entry points and plugstack.conf arguments.
 *
 *   required /usr/local/lib/slurm/spank_grace_policy.so config=FILE \
 *            [on_error=allow|deny] [python_path=DIR[:DIR]] [timeout_ms=N] \
 *            [audit=FILE] [container_env=NAME] [cache_dir=DIR|none] \
 *            [prestart=on|off] [checker=node|step] [checker_socket=PATH] \
 *            [max_memory=MIB]
 *
 * This file, grace_stepd.c and grace_cache.c make the plugin Slurm loads
 * everywhere; it has no DT_NEEDED on libpython. The embedded interpreter
 * lives in a second library (PREFIX/lib/grace-policy/grace_policy_py.so) that
 * slurmstepd dlopen()s in user_init only when the verdict cache has no
 * answer. cache_dir=DIR (default /run/grace-policy) holds one root-owned
 * file of clean verdicts per user, opened here as root (docs/SECURITY.md).
 *
 * audit=FILE is opened here, as root, in slurm_spank_init (remote context),
 * and the descriptor is handed to Python, which runs as the job's user: the
 * file can be root-owned 0640 and users can neither write nor forge lines.
 * container_env=NAME: the step-env variable that marks a container step. Off
 * by default: 22.05 has no SPANK item for it and the user can export any
 * variable, so the admin names one only if a plugin listed *before* this one
 * sets it in slurmstepd for container steps and removes it otherwise
 * (docs/SECURITY.md). Nothing from the user's environment alone skips a check.
 *
 * Only the remote context (slurmstepd) does any work, and only from
 * user_init on. srun, sbatch and salloc load this file to register the
 * --grace-policy option and never start Python: whatever is broken in a
 * user's login environment must not break their submission commands.
 *
 * No entry point ever returns an error from init/init_post_opt: in remote
 * context that happens before the step's I/O exists (the user sees only
 * "launch failed") and for a batch job it can drain the node. Problems are
 * logged once to slurmd's log and handled in user_init/task_init.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <slurm/slurm.h> /* SLURM_EXTERN_CONT */
#include <sys/stat.h>
#include <unistd.h>

#include "grace.h"

SPANK_PLUGIN(grace_policy, 1);

#if SLURM_VERSION_NUMBER >= SLURM_VERSION_NUM(25, 5, 0)
/* 25.05+ reads this to decide what a failing slurm_spank_init costs: the
 * default (ESPANK_NODE_FAILURE) drains the node. Our init never returns an
 * error, but if Slurm ever sees one from us it must fail the job, not take
 * the node away from everyone (field notes §2, docs/SPANK.md). */
int slurm_spank_init_failure_mode = ESPANK_JOB_FAILURE;
#endif

/* A backstop above the core's own deadline_ms (default 500 ms): only a hung
 * import or a hung read gets this far. */
#define GRACE_DEFAULT_TIMEOUT_MS 10000
/* MiB a check may allocate beyond what its helper already has (plugstack.py
 * DEFAULT_MAX_MEMORY; grace_policy/checker/confine.py sets it). */
#define GRACE_DEFAULT_MAX_MEMORY 512

static struct grace_context context = {
	.on_error = GRACE_ON_ERROR_ALLOW,
	.timeout_ms = GRACE_DEFAULT_TIMEOUT_MS,
	.max_memory = GRACE_DEFAULT_MAX_MEMORY,
	.audit_fd = -1,
	.cache_fd = -1,
	.node_cache_fd = -1,
	.preload_fd = -1,
	.checker_fd = -1,
	/* checker=node unless checker=step: every failure to use it falls back
	 * to checker=step (docs/SPANK.md "The node checker"). */
	.checker_node = 1,
};

static int grace_option_cb(int val, const char *optarg, int remote);

static struct spank_option grace_option = {
	"grace-policy",
	"MODE",
	"Lower grace-policy's launch check for this job to 'warn' or 'off' "
	"(only on partitions where the site allows it).",
	1, 0, grace_option_cb,
};

static int grace_option_cb(int val, const char *optarg, int remote)
{
	(void)val;
	if (optarg == NULL || (strcmp(optarg, "warn") != 0 && strcmp(optarg, "off") != 0 &&
			       strcmp(optarg, "enforce") != 0)) {
		/* Local context: srun/sbatch reject the option with this text. */
		if (!remote)
			slurm_error(GRACE_PREFIX "--grace-policy takes warn, off or enforce, not '%s'",
				    optarg ? optarg : "");
		return -1;
	}
	snprintf(context.user_mode, sizeof(context.user_mode), "%s", optarg);
	return 0;
}

static int grace_has_relative_entry(const char *list)
{
	const char *p = list;

	while (*p) {
		if (*p != '/')
			return 1;
		p = strchr(p, ':');
		if (p == NULL)
			break;
		p++;
	}
	return list[0] == '\0' ? 0 : (list[strlen(list) - 1] == ':');
}

static void grace_set_args_error(const char *fmt, const char *what)
{
	if (context.args_error[0] == '\0')
		snprintf(context.args_error, sizeof(context.args_error), fmt, what);
}

static void grace_parse_args(int ac, char **av)
{
	int i;

	for (i = 0; i < ac; i++) {
		const char *arg = av[i];
		const char *eq = strchr(arg, '=');
		size_t keylen = eq ? (size_t)(eq - arg) : strlen(arg);
		const char *val = eq ? eq + 1 : "";

		if (eq == NULL) {
			grace_set_args_error("plugstack argument '%s' is not key=value", arg);
		} else if (keylen == 6 && strncmp(arg, "config", 6) == 0) {
			free(context.config);
			context.config = strdup(val);
		} else if (keylen == 8 && strncmp(arg, "on_error", 8) == 0) {
			if (strcmp(val, "allow") == 0)
				context.on_error = GRACE_ON_ERROR_ALLOW;
			else if (strcmp(val, "deny") == 0)
				context.on_error = GRACE_ON_ERROR_DENY;
			else
				grace_set_args_error("on_error must be allow or deny, not '%s' "
						     "(using allow)", val);
		} else if (keylen == 11 && strncmp(arg, "python_path", 11) == 0) {
			free(context.python_path);
			context.python_path = strdup(val);
			/* A relative entry would be resolved against the job's cwd,
			 * where the user could plant modules imported by a process
			 * that can still regain root. */
			if (context.python_path && grace_has_relative_entry(context.python_path))
				grace_set_args_error("python_path entries must be absolute, not "
						     "'%s'", val);
		} else if (keylen == 10 && strncmp(arg, "timeout_ms", 10) == 0) {
			char *end = NULL;
			unsigned long ms;

			errno = 0;
			ms = strtoul(val, &end, 10);
			if (errno || end == val || *end != '\0' || ms < 10 || ms > 600000)
				grace_set_args_error("timeout_ms must be 10..600000, not '%s'", val);
			else
				context.timeout_ms = (unsigned int)ms;
		} else if (keylen == 10 && strncmp(arg, "max_memory", 10) == 0) {
			char *end = NULL;
			unsigned long mib;

			errno = 0;
			mib = strtoul(val, &end, 10);
			if (errno || end == val || *end != '\0' || val[0] == '-' ||
			    (mib != 0 && (mib < 16 || mib > (1ul << 20))))
				grace_set_args_error("max_memory must be 0 or 16..1048576 (MiB), "
						     "not '%s'", val);
			else
				context.max_memory = (unsigned int)mib;
		} else if (keylen == 5 && strncmp(arg, "audit", 5) == 0) {
			free(context.audit_path);
			context.audit_path = val[0] ? strdup(val) : NULL;
		} else if (keylen == 9 && strncmp(arg, "cache_dir", 9) == 0) {
			free(context.cache_dir);
			context.cache_dir = strdup(val[0] ? val : "none");
		} else if (keylen == 8 && strncmp(arg, "prestart", 8) == 0) {
			if (strcmp(val, "on") == 0 || strcmp(val, "off") == 0)
				context.prestart = strcmp(val, "on") == 0;
			else
				grace_set_args_error("prestart must be on or off, not '%s'", val);
		} else if (keylen == 7 && strncmp(arg, "checker", 7) == 0) {
			if (strcmp(val, "node") == 0 || strcmp(val, "step") == 0)
				context.checker_node = strcmp(val, "node") == 0;
			else
				grace_set_args_error("checker must be node or step, not '%s'", val);
		} else if (keylen == 14 && strncmp(arg, "checker_socket", 14) == 0) {
			free(context.checker_socket);
			context.checker_socket = strdup(val);
			if (context.checker_socket && context.checker_socket[0] != '/')
				grace_set_args_error("checker_socket must be an absolute path, "
						     "not '%s'", val);
		} else if (keylen == 13 && strncmp(arg, "container_env", 13) == 0) {
			free(context.container_env);
			context.container_env = val[0] ? strdup(val) : NULL;
#ifdef GRACE_TEST_HOOKS
		} else if (keylen == 13 && strncmp(arg, "test_fail_env", 13) == 0) {
			/* Test builds only: see GRACE_ENV_EDIT in grace_stepd.c. */
			free(context.test_fail_env);
			context.test_fail_env = strdup(val);
		} else if (keylen == 13 && strncmp(arg, "test_prestart", 13) == 0) {
			/* Test builds only: see grace_prestart_main in grace_helper.c. */
			free(context.test_prestart);
			context.test_prestart = strdup(val);
		} else if (keylen == 12 && strncmp(arg, "test_checker", 12) == 0) {
			/* Test builds only: handed to grace_policy/nodecheck.py. */
			free(context.test_checker);
			context.test_checker = strdup(val);
		} else if (keylen == 14 && strncmp(arg, "test_afterpull", 14) == 0) {
			/* Test builds only: see grace_afterpull_main in grace_helper.c. */
			free(context.test_afterpull);
			context.test_afterpull = strdup(val);
#endif
		} else {
			grace_set_args_error("unknown plugstack argument '%s' (known: config, "
					     "on_error, python_path, timeout_ms, audit, container_env, "
					     "cache_dir, prestart, checker, checker_socket, "
					     "max_memory)",
					     arg);
		}
	}
	if (context.config == NULL || context.config[0] == '\0')
		grace_set_args_error("%s", "no config=FILE in plugstack.conf");
	if (context.checker_socket == NULL)
		context.checker_socket = strdup(GRACE_CHECKER_SOCKET);
	if (context.cache_dir == NULL) {
		context.cache_dir = strdup(GRACE_CACHE_DIR);
	} else if (strcmp(context.cache_dir, "none") == 0) {
		free(context.cache_dir);
		context.cache_dir = NULL;
	}
}

/* Where this file was loaded from: the installed Python package is found
 * relative to it (PREFIX/lib/slurm/../grace-policy/python), so the plugin
 * needs no environment variable and survives DESTDIR packaging. */
static void grace_find_plugin_dir(void)
{
	Dl_info info;
	char buf[sizeof(context.plugin_dir)];

	if (dladdr((void *)&context, &info) == 0 || info.dli_fname == NULL ||
	    strlen(info.dli_fname) >= sizeof(buf))
		return;
	strcpy(buf, info.dli_fname);
	snprintf(context.plugin_dir, sizeof(context.plugin_dir), "%s", dirname(buf));
}

/*
 * Open audit=FILE as root (remote init runs before slurmstepd drops
 * privileges). O_NOFOLLOW and the regular-file test keep a symlink or a FIFO
 * planted in a badly chosen directory from turning root's append into a write
 * somewhere else; O_CLOEXEC keeps it out of the tasks. Never fails the init:
 * the reason is logged with each step and the verdicts are unaffected.
 */
static void grace_open_audit(void)
{
	struct stat st;
	int fd;

	if (context.audit_path == NULL)
		return;
	fd = open(context.audit_path,
		  O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0640);
	if (fd < 0) {
		snprintf(context.audit_error, sizeof(context.audit_error),
			 "audit log %s: cannot open as root: %s", context.audit_path,
			 strerror(errno));
		return;
	}
	/* A second hard link could be any root file a user got linked into a
	 * writable directory: appending to it as root is not ours to do. */
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1) {
		snprintf(context.audit_error, sizeof(context.audit_error),
			 "audit log %s: not a regular file with one link; not written",
			 context.audit_path);
		close(fd);
		return;
	}
	if (st.st_uid != 0 || (st.st_mode & 0022) != 0)
		snprintf(context.audit_error, sizeof(context.audit_error),
			 "audit log %s: owned by uid %u with mode %04o: users may be able to "
			 "write it (make it root-owned 0640)", context.audit_path,
			 (unsigned int)st.st_uid, (unsigned int)(st.st_mode & 07777));
	context.audit_fd = fd;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	spank_context_t where = spank_context();

	if (where == S_CTX_LOCAL || where == S_CTX_REMOTE || where == S_CTX_ALLOCATOR) {
		spank_err_t rc = spank_option_register(sp, &grace_option);

		if (rc != ESPANK_SUCCESS && where == S_CTX_REMOTE)
			slurm_info(GRACE_PREFIX "cannot register --grace-policy: %s",
				   spank_strerror(rc));
	}
	if (where == S_CTX_SLURMD) {
		/* slurmd's own start (once, before it daemonizes): the node
		 * checker, if configured and the arguments are usable. */
		grace_parse_args(ac, av);
		grace_find_plugin_dir();
		if (context.checker_node && context.args_error[0] == '\0')
			grace_node_start(&context);
		else if (context.args_error[0] != '\0')
			slurm_error(GRACE_PREFIX "plugstack.conf: %s", context.args_error);
	}
	if (where == S_CTX_REMOTE) {
		grace_parse_args(ac, av);
		grace_find_plugin_dir();
		grace_open_audit();
		if (context.args_error[0] == '\0') {
			uint32_t step_id = 0;

			int checked;

			grace_cache_open(&context, sp);
			/* The extern step runs no user command: no check to start. */
			checked = spank_get_item(sp, S_JOB_STEPID, &step_id) != ESPANK_SUCCESS ||
				  step_id != SLURM_EXTERN_CONT;
			if (checked && context.checker_node) {
				grace_node_connect(&context, sp);
				/* and, beside pyxis, one for the after-pull judgement */
				grace_afterpull_early(&context);
			}
			/* prestart=on beside checker=node: only if the node
			 * checker cannot be reached (it has the interpreter). */
			if (checked && context.prestart && context.checker_fd < 0)
				grace_helper_prestart(&context);
		}
	}
	return 0;
}

/* slurmd is shutting down: the node checker ends when its pipe closes. */
int slurm_spank_slurmd_exit(spank_t sp, int ac, char **av)
{
	(void)sp;
	(void)ac;
	(void)av;
	grace_node_stop();
	return 0;
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (!spank_remote(sp))
		return 0;
	/* Always 0: on 22.05 an error here is not passed on to srun (field
	 * notes §2); the verdict is kept and task_init refuses the task. */
	grace_stepd_user_init(&context, sp);
	return 0;
}

/* Before any plugin's task_init: a refused container step stops here, so
 * pyxis never imports, unpacks and starts an image that cannot run
 * (grace_container.c). Host steps keep being refused in task_init. */
int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (!spank_remote(sp))
		return 0;
	return grace_container_task_init_privileged(context.reject);
}

/* slurmstepd, after each task's fork: its end of the after-pull helper's
 * socket goes once every task has its own (grace_afterpull.c). */
int slurm_spank_task_post_fork(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (spank_remote(sp))
		grace_afterpull_post_fork(sp);
	return 0;
}

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (spank_remote(sp))
		grace_afterpull_exit();
	return 0;
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (!spank_remote(sp))
		return 0;
	return grace_stepd_task_init(&context, sp);
}

