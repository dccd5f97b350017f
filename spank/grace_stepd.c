/*
 * grace-policy: the remote side, inside slurmstepd.
 *
 * user_init (once per step and node, as the user, before tasks fork):
 *   gather argv/env/partition/ids; look the step up in the verdict cache
 *   (grace_cache.c) and on a hit write the audit line and stop there, without
 *   loading Python; on a miss dlopen the Python part (grace_policy_py.so) and
 *   run the check, both under one C deadline, store the entry of a clean
 *   allow,
 *   apply the env edits with spank_unsetenv/spank_setenv (so every task and
 *   slurmstepd's PATH lookup of argv[0] see them), print the user's lines,
 *   and keep the verdict in C memory.
 * task_init (per task, in the forked child, just before execve):
 *   no Python; return -1 if the step was rejected, which stops the exec.
 *
 * Why the verdict waits for task_init: Slurm 22.05 does not pass an error
 * from user_init on to srun (srun exits 0); an error from task_init makes the
 * task exit 1 before exec, so srun fails and a batch job ends FAILED without
 * draining the node (see docs/SPANK.md for what was observed).
 *
 * The C deadline: the Python core enforces deadline_ms itself, but an import
 * hung on a dead NFS mount or a read of a FIFO it failed to avoid would hang
 * slurmstepd. Signals (alarm) are not an option in slurmstepd: they belong to
 * slurmstepd and its threads. So the check runs in its own thread and we
 * wait for it with a timeout; if it does not come back we follow on_error
 * and leave the thread behind (it owns its memory and is ended with the
 * process). The tasks never call Python, so the stray thread cannot block
 * them.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <slurm/slurm.h> /* SLURM_BATCH_SCRIPT */

#include "grace.h"

/* One check in flight. Shared by the waiting slurmstepd thread and the
 * worker; whoever drops the last reference frees it. */
struct grace_job {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int refs;
	int finished;
	int rc;
	int hit;               /* the verdict cache answered: no Python */
	char mode[32];         /* the mode of that entry */
	double hit_ms;         /* user_init start to the end of the lookup */
	struct timespec started;
	const struct grace_context *ctx;
	struct grace_step step;
	struct grace_result result;
	char partition[256];
	char cwd[4096];
	char node[256];
	char container[400];
	struct grace_container box; /* grace_container.c: which container runs argv */
	char code[4096 + 16];
	char err[512];
	/* Our own copies of argv and env: slurmstepd frees and replaces its
	 * job->env as tasks exit, and a worker left behind by the timeout must
	 * never read freed memory. */
	char **argv;
	int argc;
	char **env;
	int envc;
};

static void grace_strv_free(char **v, int n)
{
	int i;

	if (v == NULL)
		return;
	for (i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

static char **grace_strv_dup(char **v, int n)
{
	char **out = calloc((size_t)n + 1, sizeof(*out));
	int i;

	if (out == NULL)
		return NULL;
	for (i = 0; i < n; i++) {
		out[i] = strdup(v[i] ? v[i] : "");
		if (out[i] == NULL) {
			grace_strv_free(out, i);
			return NULL;
		}
	}
	return out;
}

static void grace_strlist_free(struct grace_strlist *l)
{
	size_t i;

	for (i = 0; i < l->n; i++)
		free(l->items[i]);
	free(l->items);
	l->items = NULL;
	l->n = l->cap = 0;
}

static void grace_job_put(struct grace_job *job)
{
	int last;

	pthread_mutex_lock(&job->lock);
	last = --job->refs == 0;
	pthread_mutex_unlock(&job->lock);
	if (!last)
		return;
	grace_strlist_free(&job->result.user);
	grace_strlist_free(&job->result.unset);
	grace_strlist_free(&job->result.set);
	grace_strlist_free(&job->result.log);
	free(job->result.cache);
	grace_strv_free(job->argv, job->argc);
	grace_strv_free(job->env, job->envc);
	pthread_mutex_destroy(&job->lock);
	pthread_cond_destroy(&job->cond);
	free(job);
}

/*
 * The Python part, loaded on the first miss of this slurmstepd. RTLD_GLOBAL:
 * its libpython must be visible to the extension modules Python loads later
 * (grace_python.c also promotes libpython itself, RTLD_NOLOAD|RTLD_GLOBAL).
 * Slurm loaded this stub RTLD_LOCAL; the Python part never calls back into
 * it (grace_emit lives there), so nothing needs to resolve against us.
 */
static grace_python_check_fn grace_python_load(const struct grace_context *ctx, char *err,
					       size_t errlen)
{
	static grace_python_check_fn check;
	char path[sizeof(ctx->plugin_dir) + 64];
	void *handle;
	const char *why;

	if (check != NULL)
		return check;
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

static void *grace_worker(void *arg)
{
	struct grace_job *job = arg;
	grace_python_check_fn check;
	int rc = -1;

	/* The lookup stats the user's files: under the same deadline as the
	 * check, so a dead network mount cannot hold slurmstepd either. */
	if (!job->step.batch &&
	    (job->step.container == NULL ||
	     (job->step.container_kind != NULL && job->step.container_local)) &&
	    grace_cache_lookup(job->ctx, &job->step, job->mode, sizeof(job->mode))) {
		job->hit = 1;
		job->hit_ms = grace_ms_since(&job->started);
		rc = GRACE_RC_ALLOW;
	} else {
		check = grace_python_load(job->ctx, job->err, sizeof(job->err));
		if (check != NULL)
			rc = check(job->ctx, &job->step, job->err, sizeof(job->err));
	}

	pthread_mutex_lock(&job->lock);
	job->rc = rc;
	job->finished = 1;
	pthread_cond_signal(&job->cond);
	pthread_mutex_unlock(&job->lock);
	grace_job_put(job);
	return NULL;
}

/* Run the check in a thread: 0 if it finished in time, -1 if it did not (the
 * worker still owns job->err then), -2 if no thread could be started (err set). */
static int grace_run_with_deadline(struct grace_job *job, unsigned int timeout_ms)
{
	pthread_condattr_t attr;
	pthread_attr_t tattr;
	pthread_t tid;
	sigset_t all, old;
	struct timespec until;
	int finished, rc;

	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&job->cond, &attr);
	pthread_condattr_destroy(&attr);
	pthread_mutex_init(&job->lock, NULL);
	job->refs = 2;

	pthread_attr_init(&tattr);
	pthread_attr_setdetachstate(&tattr, PTHREAD_CREATE_DETACHED);
	/* Signals are slurmstepd's: the worker inherits a mask that blocks all
	 * of them, so none is ever delivered to (or run in) the check thread. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = pthread_create(&tid, &tattr, grace_worker, job);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_attr_destroy(&tattr);
	if (rc != 0) {
		job->refs = 1;
		snprintf(job->err, sizeof(job->err), "cannot start the check thread: %s",
			 strerror(rc));
		return -2;
	}

	clock_gettime(CLOCK_MONOTONIC, &until);
	until.tv_sec += timeout_ms / 1000;
	until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec += 1;
		until.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&job->lock);
	while (!job->finished) {
		if (pthread_cond_timedwait(&job->cond, &job->lock, &until) == ETIMEDOUT)
			break;
	}
	finished = job->finished;
	pthread_mutex_unlock(&job->lock);
	return finished ? 0 : -1;
}

static void grace_copy_env(spank_t sp, const char *name, char *buf, size_t len)
{
	buf[0] = '\0';
	if (spank_getenv(sp, name, buf, (int)len) != ESPANK_SUCCESS)
		buf[0] = '\0';
}

/*
 * Is this a container step, on the site's word rather than the user's? 22.05
 * has no SPANK item for --container or pyxis' --container-image (pyxis gets
 * its option through its own callback; for srun steps it is not in the step
 * environment at all), and every variable of the step environment can be
 * exported by the user. So only the variable the admin named with
 * container_env= counts, on the admin's promise that a plugin listed before
 * this one sets it in slurmstepd for container steps and removes it
 * otherwise (docs/SECURITY.md).
 */
static void grace_container(const struct grace_context *ctx, spank_t sp, char *buf, size_t len)
{
	char value[256];

	buf[0] = '\0';
	if (ctx->container_env == NULL)
		return;
	if (spank_getenv(sp, ctx->container_env, value, (int)sizeof(value)) == ESPANK_SUCCESS &&
	    value[0] != '\0')
		snprintf(buf, len, "container step (%s is set by the site): argv runs inside "
			 "the image", ctx->container_env);
}

static const char *grace_on_error_name(const struct grace_context *ctx)
{
	return ctx->on_error == GRACE_ON_ERROR_DENY ? "deny" : "allow";
}

/* The one slurmd-log line of a failed check, and what the user gets. */
static void grace_fail(struct grace_context *ctx, uint32_t job_id, uint32_t step_id,
		       const char *reason)
{
	int deny = ctx->on_error == GRACE_ON_ERROR_DENY;

	slurm_info(GRACE_PREFIX "error: job %u step %u: check failed: %s; on_error=%s: step %s",
		   job_id, step_id, reason, grace_on_error_name(ctx),
		   deny ? "refused" : "allowed unchecked");
	if (deny) {
		slurm_spank_log(GRACE_PREFIX "this step was refused: the site's launch check "
				"could not run and the site chose to refuse steps then "
				"(on_error=deny). Your administrator can find the reason in "
				"slurmd's log.");
		ctx->reject = 1;
	}
}

static void grace_apply_env(spank_t sp, const struct grace_result *r, uint32_t job_id,
			    uint32_t step_id)
{
	size_t i;

	for (i = 0; i < r->unset.n; i++) {
		spank_err_t rc = spank_unsetenv(sp, r->unset.items[i]);

		if (rc != ESPANK_SUCCESS)
			slurm_info(GRACE_PREFIX "error: job %u step %u: cannot unset %s: %s",
				   job_id, step_id, r->unset.items[i], spank_strerror(rc));
	}
	for (i = 0; i < r->set.n; i++) {
		char *kv = r->set.items[i];
		char *eq = strchr(kv, '=');
		spank_err_t rc;

		if (eq == NULL || eq == kv)
			continue;
		*eq = '\0';
		rc = spank_setenv(sp, kv, eq + 1, 1);
		if (rc != ESPANK_SUCCESS)
			slurm_info(GRACE_PREFIX "error: job %u step %u: cannot set %s: %s",
				   job_id, step_id, kv, spank_strerror(rc));
		*eq = '=';
	}
}

int grace_stepd_user_init(struct grace_context *ctx, spank_t sp)
{
	struct grace_job *job;
	uint32_t job_id = 0, step_id = 0;
	uid_t uid = (uid_t)-1;
	char **argv = NULL, **env = NULL;
	int argc = 0, envc = 0, rc;
	size_t i;
	const struct grace_result *r;

	ctx->reject = 0;
	spank_get_item(sp, S_JOB_ID, &job_id);
	spank_get_item(sp, S_JOB_STEPID, &step_id);
	spank_get_item(sp, S_JOB_UID, &uid);

	if (ctx->audit_error[0] != '\0')
		slurm_info(GRACE_PREFIX "error: job %u step %u: %s", job_id, step_id,
			   ctx->audit_error);
	if (ctx->cache_error[0] != '\0')
		slurm_info(GRACE_PREFIX "error: job %u step %u: %s", job_id, step_id,
			   ctx->cache_error);
	if (ctx->args_error[0] != '\0') {
		grace_fail(ctx, job_id, step_id, ctx->args_error);
		return 0;
	}
	if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_ENV, &env) != ESPANK_SUCCESS) {
		grace_fail(ctx, job_id, step_id, "cannot read the step's argv or environment");
		return 0;
	}
	for (envc = 0; env && env[envc]; envc++)
		;
	/* Never past a NULL: for an OCI step slurmstepd swaps in a 3-word argv
	 * but keeps the user's argc (grace_container.c). */
	for (i = 0; argv != NULL && i < (size_t)argc && argv[i] != NULL; i++)
		;
	argc = (int)i;

	job = calloc(1, sizeof(*job));
	if (job == NULL) {
		grace_fail(ctx, job_id, step_id, "out of memory");
		return 0;
	}
	job->ctx = ctx;
	job->argv = grace_strv_dup(argv, argc);
	job->env = grace_strv_dup(env, envc);
	if ((argc > 0 && job->argv == NULL) || (envc > 0 && job->env == NULL)) {
		grace_strv_free(job->argv, job->argv ? argc : 0);
		grace_strv_free(job->env, job->env ? envc : 0);
		free(job);
		grace_fail(ctx, job_id, step_id, "out of memory");
		return 0;
	}
	job->argc = argc;
	job->envc = envc;
	clock_gettime(CLOCK_MONOTONIC, &job->started);
	snprintf(job->code, sizeof(job->code), "%s|%s", ctx->plugin_dir,
		 ctx->python_path ? ctx->python_path : "-");
	grace_copy_env(sp, "SLURM_JOB_PARTITION", job->partition, sizeof(job->partition));
	/* 22.05 has no SPANK item for the cwd and slurmstepd changes into it only
	 * in the task child; srun and sbatch export it as PWD. */
	grace_copy_env(sp, "PWD", job->cwd, sizeof(job->cwd));
	if (gethostname(job->node, sizeof(job->node) - 1) != 0)
		job->node[0] = '\0';
	grace_container(ctx, sp, job->container, sizeof(job->container));
	grace_container_detect(sp, job->argv, argc, job->cwd, &job->box);
	if (job->box.kind[0] && !job->container[0])
		snprintf(job->container, sizeof(job->container), "%s", job->box.reason);
	job->step = (struct grace_step){
		.config = ctx->config,
		.on_error = grace_on_error_name(ctx),
		.partition = job->partition[0] ? job->partition : NULL,
		.cwd = job->cwd[0] ? job->cwd : NULL,
		.user_mode = ctx->user_mode[0] ? ctx->user_mode : NULL,
		.node = job->node,
		.argv = job->argv,
		.argc = argc,
		.env = job->env,
		.envc = envc,
		.job_id = job_id,
		.step_id = step_id,
		.uid = (unsigned int)uid,
		.batch = step_id == SLURM_BATCH_SCRIPT,
		.result = &job->result,
		.container = job->container[0] ? job->container : NULL,
		.audit_path = ctx->audit_path,
		.audit_fd = ctx->audit_fd,
		.code = job->code,
		.container_kind = job->box.kind[0] ? job->box.kind : NULL,
		.container_image = job->box.kind[0] ? job->box.image : NULL,
		.container_local = job->box.local,
		.container_args = job->box.args[0] ? job->box.args : NULL,
	};


	rc = grace_run_with_deadline(job, ctx->timeout_ms);
	if (rc < 0) {
		char reason[600];

		if (rc == -2)
			snprintf(reason, sizeof(reason), "%s", job->err);
		else
			snprintf(reason, sizeof(reason), "no verdict within timeout_ms=%u; the "
				 "check thread is left behind", ctx->timeout_ms);
		grace_fail(ctx, job_id, step_id, reason);
		grace_job_put(job);
		return 0;
	}

	rc = job->rc;
	r = &job->result;
	if (job->hit) {
		/* A clean allow replayed: nothing to tell the user, nothing to
		 * change, one audit line (written here, through root's fd). */
		const char *problem = grace_audit_hit(ctx, &job->step, job->mode, job->hit_ms,
						      job->err, sizeof(job->err));

		if (problem)
			slurm_info(GRACE_PREFIX "job %u step %u: %s", job_id, step_id, problem);
		goto out;
	}
	if (rc < 0 && job->err[0]) {
		grace_fail(ctx, job_id, step_id, job->err);
		goto out;
	}
	if (rc == GRACE_RC_ERROR || r->oom || !r->done ||
	    (rc != GRACE_RC_ALLOW && rc != GRACE_RC_WARN && rc != GRACE_RC_REJECT)) {
		char reason[1024];
		size_t used = 0;

		reason[0] = '\0';
		for (i = 0; i < r->log.n && used < sizeof(reason) - 1; i++)
			used += (size_t)snprintf(reason + used, sizeof(reason) - used, "%s%s",
						 i ? "; " : "", r->log.items[i]);
		if (reason[0] == '\0')
			snprintf(reason, sizeof(reason), "%s (code %d%s%s)",
				 rc == 0 ? "the embedded check did not run"
					 : "the embedded check gave no verdict",
				 rc, r->done ? "" : ", incomplete", r->oom ? ", out of memory" : "");
		grace_fail(ctx, job_id, step_id, reason);
		goto out;
	}

	/* A verdict. Log lines now are non-fatal problems (e.g. the audit log). */
	for (i = 0; i < r->log.n; i++)
		slurm_info(GRACE_PREFIX "job %u step %u: %s", job_id, step_id, r->log.items[i]);
	grace_apply_env(sp, r, job_id, step_id);
	if (r->cache != NULL && rc == GRACE_RC_ALLOW && r->user.n == 0 && r->unset.n == 0 &&
	    r->set.n == 0 && !job->step.batch) {
		char why[256];
		const char *problem = grace_cache_store(ctx, r->cache, why, sizeof(why));

		if (problem)
			slurm_info(GRACE_PREFIX "job %u step %u: %s", job_id, step_id, problem);
	}
	for (i = 0; i < r->user.n; i++)
		slurm_spank_log("%s", r->user.items[i]);
	if (rc == GRACE_RC_REJECT) {
		if (r->user.n == 0)
			slurm_spank_log(GRACE_PREFIX "this step was refused by the site's "
					"launch check.");
		ctx->reject = 1;
	}
out:
	grace_job_put(job);
	return 0;
}

int grace_stepd_task_init(struct grace_context *ctx, spank_t sp)
{
	char why[512];

	/* The user was told in user_init; failing here stops the exec. */
	if (ctx->reject)
		return -1;
	if (grace_container_task_init(sp, why, sizeof(why)) < 0) {
		slurm_spank_log("%s", why);
		return -1;
	}
	return 0;
}
