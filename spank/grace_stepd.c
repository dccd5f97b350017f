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
 *   slurmstepd's PATH lookup of argv[0] see them), write the step's one
 *   audit line (the verdict's, which Python rendered, or grace_fail's),
 *   print the user's lines, and keep the verdict in C memory.
 * task_init (per task, in the forked child, just before execve):
 *   no Python; return -1 if the step was rejected, which stops the exec.
 *
 * Why the verdict waits for task_init: Slurm 22.05 does not pass an error
 * from user_init on to srun (srun exits 0); an error from task_init makes the
 * task exit 1 before exec, so srun fails and a batch job ends FAILED without
 * draining the node (see docs/SPANK.md for what was observed).
 *
 * The C deadline: the Python core enforces deadline_ms itself, but an import
 * hung on a dead network mount or a read of a FIFO it failed to avoid would
 * hang slurmstepd. A thread is not enough: a thread stuck in an
 * uninterruptible file-system wait blocks glibc's credential changes for the
 * whole process (field notes §10), and slurmstepd changes credentials right
 * after user_init. So the lookup and the check run in a helper process
 * (grace_helper.c) that sends the result back through a pipe; on timeout it
 * is killed and abandoned, and we follow on_error. No thread of slurmstepd
 * touches a user's path.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <slurm/slurm.h> /* SLURM_BATCH_SCRIPT */

#include "grace.h"

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

/* What user_init gathers about the step, and the buffers it points into.
 * argv and env point into slurmstepd's own arrays: only the helper process
 * reads them while it runs (its copy of memory is its own), so nothing left
 * behind by a timeout can read them after slurmstepd frees them. */
struct grace_stepd {
	struct grace_step step;
	struct timespec started;
	char partition[256];
	char cwd[4096];
	char node[256];
	char container[400];
	struct grace_container box; /* grace_container.c: which container runs argv */
	char code[GRACE_CODE_MAX];
};

static double grace_elapsed_ms(const struct timespec *t0)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(now.tv_sec - t0->tv_sec) * 1000.0 +
	       (double)(now.tv_nsec - t0->tv_nsec) / 1e6;
}

/*
 * A check that gave no verdict: one slurmd-log line, one audit line (with
 * the kind of failure, for grace-policy report), and what on_error says
 * (deny: the user is told, the tasks are refused in task_init).
 */
static void grace_fail(struct grace_context *ctx, const struct grace_stepd *s,
		       const char *failure, const char *reason)
{
	int deny = ctx->on_error == GRACE_ON_ERROR_DENY;
	char why[256];
	const char *problem;

	slurm_info(GRACE_PREFIX "error: job %u step %u: check failed: %s; on_error=%s: step %s",
		   s->step.job_id, s->step.step_id, reason, grace_on_error_name(ctx),
		   deny ? "refused" : "allowed unchecked");
	problem = grace_audit_failure(ctx, &s->step, deny ? "reject" : "allow", failure, reason,
				      grace_elapsed_ms(&s->started), why, sizeof(why));
	if (problem)
		slurm_info(GRACE_PREFIX "job %u step %u: %s", s->step.job_id, s->step.step_id,
			   problem);
	if (deny) {
		slurm_spank_log(GRACE_PREFIX "this step was refused: the site's launch check "
				"could not run and the site chose to refuse steps then "
				"(on_error=deny). Your administrator can find the reason in "
				"slurmd's log.");
		ctx->reject = 1;
	}
}

#ifdef GRACE_TEST_HOOKS
/* Test builds only (make plugin-testhooks): the edit of this one variable
 * fails as spank_setenv/unsetenv would, without being made, so the failure
 * path below can be tested on a real slurmstepd. 22.05's own functions fail
 * only for a NULL argument or outside remote context, which this code never
 * produces. */
#define GRACE_ENV_EDIT(ctx, name, call)                                               \
	((ctx)->test_fail_env != NULL && strcmp((ctx)->test_fail_env, (name)) == 0 \
		 ? ESPANK_ERROR                                                       \
		 : (call))
#else
#define GRACE_ENV_EDIT(ctx, name, call) ((void)(ctx), (call))
#endif

static void grace_add(char *buf, size_t len, const char *name)
{
	size_t used = strlen(buf);

	if (used < len - 1)
		snprintf(buf + used, len - used, "%s%s", used ? ", " : "", name);
}

/*
 * Apply the env edits of a verdict. 0 if all were made; else -1, with the
 * first failure in why and the names of the edits that were made in done
 * (so the user is told only what happened).
 */
static int grace_apply_env(const struct grace_context *ctx, spank_t sp,
			   const struct grace_result *r, char *why, size_t whylen, char *done,
			   size_t donelen)
{
	size_t i;
	int failed = 0;

	why[0] = done[0] = '\0';
	for (i = 0; i < r->unset.n; i++) {
		const char *name = r->unset.items[i];
		spank_err_t rc = GRACE_ENV_EDIT(ctx, name, spank_unsetenv(sp, name));

		if (rc == ESPANK_SUCCESS) {
			grace_add(done, donelen, name);
		} else if (!failed++) {
			snprintf(why, whylen, "cannot remove %s from the step's environment: %s",
				 name, spank_strerror(rc));
		}
	}
	for (i = 0; i < r->set.n; i++) {
		char *kv = r->set.items[i];
		char *eq = strchr(kv, '=');
		spank_err_t rc;

		if (eq == NULL || eq == kv)
			continue;
		*eq = '\0';
		rc = GRACE_ENV_EDIT(ctx, kv, spank_setenv(sp, kv, eq + 1, 1));
		if (rc == ESPANK_SUCCESS) {
			grace_add(done, donelen, kv);
		} else if (!failed++) {
			snprintf(why, whylen, "cannot set %s in the step's environment: %s", kv,
				 spank_strerror(rc));
		}
		*eq = '=';
	}
	return failed ? -1 : 0;
}

/* Take the decision's audit line (GRACE_LOG_AUDIT) out of the log items:
 * the caller owns it (free), and the log items left are log lines only. */
static char *grace_take_audit(struct grace_result *r)
{
	size_t i;

	for (i = 0; i < r->log.n; i++) {
		char *item = r->log.items[i];

		if (item[0] == GRACE_LOG_AUDIT) {
			memmove(&r->log.items[i], &r->log.items[i + 1],
				(r->log.n - i - 1) * sizeof(r->log.items[0]));
			r->log.n--;
			memmove(item, item + 1, strlen(item)); /* the mark off, NUL kept */
			return item;
		}
	}
	return NULL;
}

/* Write the verdict's audit line (NULL: none, no audit=), logging why not. */
static void grace_audit_verdict_line(const struct grace_context *ctx,
				     const struct grace_stepd *s, const char *line)
{
	char why[256];
	const char *problem;

	if (line == NULL)
		return;
	problem = grace_audit_verdict(ctx, line, why, sizeof(why));
	if (problem)
		slurm_info(GRACE_PREFIX "job %u step %u: %s", s->step.job_id, s->step.step_id,
			   problem);
}

/* Apply a verdict, or follow on_error for a failure (audit: the verdict's
 * line, written only if the verdict is applied). */
static void grace_apply(struct grace_context *ctx, spank_t sp, const struct grace_stepd *s,
			struct grace_outcome *out, const char *audit)
{
	const struct grace_result *r = &out->result;
	uint32_t job_id = s->step.job_id, step_id = s->step.step_id;
	int rc = out->rc;
	size_t i;

	if (out->hit) {
		/* A clean allow replayed: nothing to tell the user, nothing to
		 * change, one audit line (written here, through root's fd). Its
		 * time is what user_init spent, the helper's fork and exit
		 * included (out->hit_ms is the lookup's end, in the helper). */
		const char *problem = grace_audit_hit(ctx, &s->step, out->mode,
						      grace_elapsed_ms(&s->started), out->err,
						      sizeof(out->err));

		if (problem)
			slurm_info(GRACE_PREFIX "job %u step %u: %s", job_id, step_id, problem);
		return;
	}
	if (rc < 0 && out->err[0]) {
		/* The Python part could not be loaded or started, or the helper
		 * died without an answer (a crash of the check). */
		grace_fail(ctx, s, out->failure ? out->failure : GRACE_FAIL_CHECK, out->err);
		return;
	}
	if (rc == GRACE_RC_ERROR || r->oom || !r->done ||
	    (rc != GRACE_RC_ALLOW && rc != GRACE_RC_WARN && rc != GRACE_RC_REJECT)) {
		char reason[1024];
		size_t used = 0;
		/* The kind Python named (GRACE_EMIT_FAIL), never read from its text. */
		const char *kind = grace_python_failure(r->failure);

		reason[0] = '\0';
		for (i = 0; i < r->log.n && used < sizeof(reason) - 1; i++)
			used += (size_t)snprintf(reason + used, sizeof(reason) - used, "%s%s",
						 i ? "; " : "", r->log.items[i]);
		if (reason[0] == '\0')
			snprintf(reason, sizeof(reason), "%s (code %d%s%s)",
				 rc == 0 ? "the embedded check did not run"
					 : "the embedded check gave no verdict",
				 rc, r->done ? "" : ", incomplete", r->oom ? ", out of memory" : "");
		if (rc == 0)
			kind = GRACE_FAIL_PYTHON;
		else if (kind == NULL)
			kind = GRACE_FAIL_CHECK;
		grace_fail(ctx, s, kind, reason);
		return;
	}

	/* A verdict. Log lines now are non-fatal problems (e.g. the audit log). */
	for (i = 0; i < r->log.n; i++)
		slurm_info(GRACE_PREFIX "job %u step %u: %s", job_id, step_id, r->log.items[i]);
	if (rc == GRACE_RC_REJECT) {
		/* The tasks never run: their environment does not matter. */
		for (i = 0; i < r->user.n; i++)
			slurm_spank_log("%s", r->user.items[i]);
		if (r->user.n == 0)
			slurm_spank_log(GRACE_PREFIX "this step was refused by the site's "
					"launch check.");
		ctx->reject = 1;
		grace_audit_verdict_line(ctx, s, audit);
		return;
	}
	if (r->unset.n || r->set.n) {
		char why[600], done[1024];

		if (grace_apply_env(ctx, sp, r, why, sizeof(why), done, sizeof(done)) != 0) {
			/* The verdict's lines say the variables were changed: not
			 * true any more. Tell the user what was done instead. */
			grace_fail(ctx, s, GRACE_FAIL_ENV, why);
			if (ctx->on_error != GRACE_ON_ERROR_DENY)
				slurm_spank_log(GRACE_PREFIX "this step runs without all of the "
						"environment changes the site's launch check asked "
						"for: %s. Changed: %s. The site lets steps run when "
						"the check fails (on_error=allow); your administrator "
						"can find the details in slurmd's log.",
						why, done[0] ? done : "nothing");
			return;
		}
	}
	grace_audit_verdict_line(ctx, s, audit);
	if (r->cache != NULL && rc == GRACE_RC_ALLOW && r->user.n == 0 && r->unset.n == 0 &&
	    r->set.n == 0 && !s->step.batch) {
		char why[256];
		const char *problem = grace_cache_store(ctx, r->cache, why, sizeof(why));

		if (problem)
			slurm_info(GRACE_PREFIX "job %u step %u: %s", job_id, step_id, problem);
	}
	for (i = 0; i < r->user.n; i++)
		slurm_spank_log("%s", r->user.items[i]);
}

/* The result of the helper: a verdict to apply, or a failure for on_error.
 * Exactly one audit line either way: the verdict's (Python rendered it, C
 * writes it once applied) or grace_fail's. */
static void grace_finish(struct grace_context *ctx, spank_t sp, const struct grace_stepd *s,
			 struct grace_outcome *out)
{
	char *audit = grace_take_audit(&out->result);

	grace_apply(ctx, sp, s, out, audit);
	free(audit);
}

int grace_stepd_user_init(struct grace_context *ctx, spank_t sp)
{
	static struct grace_stepd s; /* ~9 KiB: off slurmstepd's stack */
	struct grace_outcome out;
	uint32_t job_id = 0, step_id = 0;
	uid_t uid = (uid_t)-1;
	char **argv = NULL, **env = NULL;
	int argc = 0, envc = 0, rc, code_ok, whole;

	memset(&s, 0, sizeof(s));
	clock_gettime(CLOCK_MONOTONIC, &s.started);
	ctx->reject = 0;
	spank_get_item(sp, S_JOB_ID, &job_id);
	spank_get_item(sp, S_JOB_STEPID, &step_id);
	spank_get_item(sp, S_JOB_UID, &uid);
	/* Too long to fit (no real install): NULL, and no entry is written for it. */
	code_ok = grace_code(ctx->plugin_dir, ctx->python_path, s.code, sizeof(s.code)) == 0;
	grace_copy_env(sp, "SLURM_JOB_PARTITION", s.partition, sizeof(s.partition));
	/* No SPANK item names the step's cwd, but slurmstepd changes into it
	 * (or, failing that, /tmp, where the tasks go too) right before
	 * spank_user() (mgr.c _fork_all_tasks, 22.05 to 26.05). PWD in the step
	 * environment is the submitting shell's: srun --chdir does not change
	 * it, and is not taken: where getcwd fails, the directory was removed
	 * after slurmstepd entered it (no relative name resolves there any more,
	 * and no path names it) or its path is longer than any buffer here, so
	 * PWD cannot name it either. The cwd is then unknown (NULL): the check
	 * resolves relative names against "/" (the bridge's default), and no
	 * entry is cached for the step (slurm_bridge._cache_entry). */
	if (getcwd(s.cwd, sizeof(s.cwd)) == NULL || s.cwd[0] != '/')
		s.cwd[0] = '\0';
	if (gethostname(s.node, sizeof(s.node) - 1) != 0)
		s.node[0] = '\0';
	s.step = (struct grace_step){
		.config = ctx->config,
		.on_error = grace_on_error_name(ctx),
		.partition = s.partition[0] ? s.partition : NULL,
		.cwd = s.cwd[0] ? s.cwd : NULL,
		.user_mode = ctx->user_mode[0] ? ctx->user_mode : NULL,
		.node = s.node,
		.job_id = job_id,
		.step_id = step_id,
		.uid = (unsigned int)uid,
		.batch = step_id == SLURM_BATCH_SCRIPT,
		.audit_path = ctx->audit_path,
		.audit_fd = ctx->audit_fd,
		.max_memory = ctx->max_memory,
		.code = code_ok ? s.code : NULL,
	};

	if (ctx->audit_error[0] != '\0')
		slurm_info(GRACE_PREFIX "error: job %u step %u: %s", job_id, step_id,
			   ctx->audit_error);
	if (ctx->cache_error[0] != '\0')
		slurm_info(GRACE_PREFIX "error: job %u step %u: %s", job_id, step_id,
			   ctx->cache_error);
	if (ctx->args_error[0] != '\0') {
		grace_fail(ctx, &s, GRACE_FAIL_ARGS, ctx->args_error);
		return 0;
	}
	if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_ENV, &env) != ESPANK_SUCCESS) {
		grace_fail(ctx, &s, GRACE_FAIL_INTERNAL,
			   "cannot read the step's argv or environment");
		return 0;
	}
	for (envc = 0; env && env[envc]; envc++)
		;
	/* Never past a NULL: for an OCI step slurmstepd swaps in a 3-word argv
	 * but keeps the user's argc (grace_container.c). */
	{
		int i;

		for (i = 0; argv != NULL && i < argc && argv[i] != NULL; i++)
			;
		argc = i;
	}
	s.step.argv = argv;
	s.step.argc = argc;
	s.step.env = env;
	s.step.envc = envc;
	grace_container(ctx, sp, s.container, sizeof(s.container));
	grace_container_detect(sp, argv, argc, s.cwd, &s.box);
	if (s.box.kind[0] && !s.container[0])
		snprintf(s.container, sizeof(s.container), "%s", s.box.reason);
	s.step.container = s.container[0] ? s.container : NULL;
	s.step.container_kind = s.box.kind[0] ? s.box.kind : NULL;
	s.step.container_image = s.box.kind[0] ? s.box.image : NULL;
	s.step.container_local = s.box.local;
	s.step.container_args = s.box.args[0] ? s.box.args : NULL;

	rc = grace_helper_run(ctx, &s.step, &s.started, ctx->timeout_ms, &out);
	/* Python judged the files themselves (a reused --container-name
	 * container): nothing for task_init to judge again. No verdict (a
	 * failure, on_error): the root pyxis makes is still judged. */
	whole = rc == 0 && out.err[0] == '\0' && out.result.done && !out.result.pull &&
		(out.rc == GRACE_RC_ALLOW || out.rc == GRACE_RC_WARN);
	if (rc == -2) {
		grace_fail(ctx, &s, GRACE_FAIL_INTERNAL, out.err);
	} else if (rc == -1) {
		char reason[160];

		snprintf(reason, sizeof(reason), "no verdict within timeout_ms=%u; the check's "
			 "helper process was killed and left to end", ctx->timeout_ms);
		grace_fail(ctx, &s, GRACE_FAIL_TIMEOUT, reason);
	} else {
		grace_finish(ctx, sp, &s, &out);
	}
	grace_outcome_free(&out);
	if (!ctx->reject && !whole) {
		/* A registry image: its files are judged once pyxis has made the
		 * container, in task_init (grace_afterpull.c). */
		char why[512];

		if (grace_afterpull_prepare(ctx, &s.step, &s.box, why, sizeof(why)) != 0)
			grace_fail(ctx, &s, GRACE_FAIL_INTERNAL, why);
	} else {
		grace_afterpull_exit(); /* not needed: the node checker's connection goes */
	}
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
	return grace_afterpull_task(ctx, sp);
}
