/*
 * grace-policy: what pyxis unpacked, judged before the first task runs
 * (issue 25 item 2; docs/SPANK.md "Container steps").
 *
 * For a registry image, user_init can only read the manifest: the files
 * exist once pyxis' task_init has imported and created the container (first
 * task of the node, under pyxis' shared-memory mutex; its root is
 * $ENROOT_DATA_PATH/<the name pyxis gave it>). An index can say amd64 while
 * the programs are aarch64; only the files tell. So, for such a step, with
 * pyxis listed before us:
 *
 *   slurm_spank_init (slurmstepd, root; checker=node and pyxis before us):
 *   a second connection to the node checker, beside the one for the step's
 *   own check. Options cannot be read yet (spank_option_getopt is for
 *   user_init on), so a step that turns out not to pull closes it in
 *   user_init and the server, reading EOF, forks nothing. It is made here
 *   because the server takes only root's connections and slurmstepd's
 *   euid is the user's from user_init on.
 *
 *   user_init (slurmstepd, after the step's own check): one shared page
 *   (MAP_SHARED|MAP_ANONYMOUS, inherited by every task child forked later)
 *   with a process-shared robust mutex and the verdict; and the request
 *   for the node checker, encoded now (grace_node_req: slurmstepd's ids
 *   and PATH, the step's frame - a task may find the step's arrays moved
 *   by another plugin's spank_setenv). Without that connection, a helper
 *   forked like checker=step's (grace_helper.c grace_afterpull_fork) that
 *   preloads the interpreter during the pull: a second interpreter per
 *   step, 100-150 ms on a 2-core node (docs/PERFORMANCE.md), which the
 *   node checker's warm one saves. Either socket is CLOEXEC: it never
 *   reaches the user's program; every task closes it in task_init, and
 *   slurmstepd once the last task is forked.
 *
 *   task_init (each task child, after pyxis' task_init made the container):
 *   the first task to take the mutex asks the node checker, or the helper
 *   (Python never runs in a task child), waits for its records within
 *   timeout_ms, prints what the
 *   user must see once, writes the audit line and stores the verdict and
 *   any environment edits in the page; the others wait on the mutex, then
 *   read it. Enforce: every task refuses (-1); warn: every task runs. No
 *   verdict (the node checker gone or stale, the helper died, either timed
 *   out, the page or helper could not be made): on_error, said once. The
 *   node checker is not replaced by a helper then: a task child cannot
 *   start one (Python never runs in it).
 *
 * The verdict is never cached: container_local stays 0 for the request
 * (slurm_bridge._cache_entry), and nothing here calls grace_cache_store.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "grace.h"
#include "grace_wire.h"

enum { GRACE_AP_NONE = 0, GRACE_AP_ASKING, GRACE_AP_DONE };

/* Room for the verdict's environment edits: "U NAME\0" / "S NAME=VALUE\0". */
#define GRACE_AP_ENV 16384

struct grace_ap_shared {
	pthread_mutex_t lock;
	int state;
	int refuse;
	size_t env_len;
	char env[GRACE_AP_ENV];
};

static struct {
	struct grace_ap_shared *shared;
	int sock;
	int node_sock; /* dialed in slurm_spank_init; ap.sock once prepare takes it */
	int by_node;   /* ap.sock is the node checker's: ask with req */
	struct grace_node_req req;
	unsigned int forked; /* tasks forked so far (slurmstepd) */
	struct grace_step step;
	char args[4096 + 512];
	char reason[512];
} ap = { .sock = -1, .node_sock = -1 };

static const char *grace_ap_on_error(const struct grace_context *ctx)
{
	return ctx->on_error == GRACE_ON_ERROR_DENY ? "deny" : "allow";
}

static double grace_ap_ms(const struct timespec *t0)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(now.tv_sec - t0->tv_sec) * 1000.0 +
	       (double)(now.tv_nsec - t0->tv_nsec) / 1e6;
}

void grace_afterpull_early(const struct grace_context *ctx)
{
	if (ap.node_sock < 0 && ctx->checker_node && ctx->checker_fd >= 0 &&
	    grace_container_pyxis_first())
		ap.node_sock = grace_afterpull_dial(ctx);
}

static void grace_ap_drop_node(void)
{
	if (ap.node_sock >= 0)
		close(ap.node_sock);
	ap.node_sock = -1;
}

int grace_afterpull_prepare(const struct grace_context *ctx, const struct grace_step *step,
			    const struct grace_container *box, char *err, size_t errlen)
{
	pthread_mutexattr_t attr;
	struct grace_ap_shared *sh;

	err[0] = '\0';
	if (ap.shared != NULL)
		return 0; /* one step per slurmstepd */
	if (!grace_container_after_pull(box, step->job_id, step->step_id, ap.args,
					sizeof(ap.args))) {
		grace_ap_drop_node(); /* the server reads EOF: nothing forked */
		return 0;
	}
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED) {
		snprintf(err, errlen, "cannot map the after-pull verdict page: %s",
			 strerror(errno));
		return -1;
	}
	memset(sh, 0, sizeof(*sh));
	if (pthread_mutexattr_init(&attr) != 0 ||
	    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED) != 0 ||
	    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST) != 0 ||
	    pthread_mutex_init(&sh->lock, &attr) != 0) {
		snprintf(err, errlen, "cannot make the after-pull lock");
		munmap(sh, sizeof(*sh));
		return -1;
	}
	pthread_mutexattr_destroy(&attr);
	snprintf(ap.reason, sizeof(ap.reason), "%.440s, as pyxis unpacked it",
		 step->container ? step->container : "pyxis container step");
	ap.step = *step;
	ap.step.container = ap.reason;
	ap.step.container_args = ap.args;
	ap.step.container_local = 0; /* never a cache entry */
	ap.step.result = NULL;
	/* The node checker's warm interpreter if it was there at slurm_spank_init;
	 * else a helper of our own, which starts its interpreter while pyxis
	 * pulls. */
	if (ap.node_sock >= 0 && grace_node_req_make(&ap.req, &ap.step) == 0) {
		ap.sock = ap.node_sock;
		ap.node_sock = -1;
		ap.by_node = 1;
	} else {
		grace_ap_drop_node();
		if (grace_afterpull_fork(ctx, &ap.step, &ap.sock, err, errlen) != 0) {
			pthread_mutex_destroy(&sh->lock);
			munmap(sh, sizeof(*sh));
			return -1;
		}
	}
	ap.shared = sh;
	return 0;
}

void grace_afterpull_post_fork(spank_t sp)
{
	uint32_t tasks = 0;

	grace_ap_drop_node(); /* a step user_init never came to: not used */
	if (ap.sock < 0)
		return;
	ap.forked++;
	if (spank_get_item(sp, S_JOB_LOCAL_TASK_COUNT, &tasks) != ESPANK_SUCCESS ||
	    ap.forked >= tasks) {
		close(ap.sock); /* the tasks hold theirs; the helper sees EOF once all are gone */
		ap.sock = -1;
	}
}

void grace_afterpull_exit(void)
{
	if (ap.sock >= 0)
		close(ap.sock);
	ap.sock = -1;
	grace_ap_drop_node();
	if (ap.by_node)
		grace_node_req_free(&ap.req);
	ap.by_node = 0;
}

/* No verdict: one slurmd-log line, one audit line, on_error's outcome
 * (the user is told only when the step is refused). */
static void grace_ap_fail(const struct grace_context *ctx, struct grace_ap_shared *sh,
			  const struct timespec *t0, const char *failure, const char *reason)
{
	int deny = ctx->on_error == GRACE_ON_ERROR_DENY;
	char why[256];
	const char *problem;

	slurm_info(GRACE_PREFIX "error: job %u step %u: the check of the container pyxis "
		   "unpacked failed: %s; on_error=%s: step %s", ap.step.job_id, ap.step.step_id,
		   reason, grace_ap_on_error(ctx), deny ? "refused" : "allowed unchecked");
	problem = grace_audit_failure_phase(ctx, &ap.step, deny ? "reject" : "allow", failure,
					    reason, grace_ap_ms(t0), "after_pull", why, sizeof(why));
	if (problem)
		slurm_info(GRACE_PREFIX "job %u step %u: %s", ap.step.job_id, ap.step.step_id,
			   problem);
	if (deny) {
		slurm_spank_log(GRACE_PREFIX "this step was refused: the site's launch check "
				"could not judge the container pyxis unpacked and the site chose "
				"to refuse steps then (on_error=deny). Your administrator can find "
				"the reason in slurmd's log.");
		sh->refuse = 1;
	}
}

static int grace_ap_env_add(struct grace_ap_shared *sh, char op, const char *text)
{
	size_t len = strlen(text) + 3;

	if (sh->env_len + len > sizeof(sh->env))
		return -1;
	sh->env[sh->env_len] = op;
	sh->env[sh->env_len + 1] = ' ';
	memcpy(sh->env + sh->env_len + 2, text, len - 2); /* NUL included */
	sh->env_len += len;
	return 0;
}

/* The first task: ask the helper and put the verdict in the page. */
static void grace_ap_judge(const struct grace_context *ctx, struct grace_ap_shared *sh)
{
	struct grace_outcome out;
	struct grace_result *r = &out.result;
	struct timespec t0;
	char *audit = NULL, why[256];
	const char *problem;
	size_t i;
	int rc;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	rc = ap.by_node ? grace_afterpull_ask_node(ap.sock, &ap.req, &t0, ctx->timeout_ms, &out)
			: grace_afterpull_ask(ap.sock, &t0, ctx->timeout_ms, &out);
	for (i = 0; i < r->log.n; i++) {
		if (r->log.items[i][0] == GRACE_LOG_AUDIT && audit == NULL)
			audit = r->log.items[i] + 1;
	}
	if (rc == -1) {
		char reason[160];

		snprintf(reason, sizeof(reason), "no verdict within timeout_ms=%u; %s",
			 ctx->timeout_ms, ap.by_node ? "the node checker's child stops itself"
						     : "the after-pull helper was abandoned");
		grace_ap_fail(ctx, sh, &t0, GRACE_FAIL_TIMEOUT, reason);
	} else if (out.err[0] != '\0') {
		grace_ap_fail(ctx, sh, &t0, out.failure ? out.failure : GRACE_FAIL_CHECK, out.err);
	} else if (out.rc == GRACE_RC_ERROR || r->oom || !r->done ||
		   (out.rc != GRACE_RC_ALLOW && out.rc != GRACE_RC_WARN &&
		    out.rc != GRACE_RC_REJECT)) {
		const char *kind = grace_python_failure(r->failure);
		char reason[1024];
		size_t used = 0;

		reason[0] = '\0';
		for (i = 0; i < r->log.n && used < sizeof(reason) - 1; i++)
			if (r->log.items[i][0] != GRACE_LOG_AUDIT)
				used += (size_t)snprintf(reason + used, sizeof(reason) - used, "%s%s",
							 used ? "; " : "", r->log.items[i]);
		if (reason[0] == '\0')
			snprintf(reason, sizeof(reason), "the embedded check gave no verdict (code %d)",
				 out.rc);
		grace_ap_fail(ctx, sh, &t0, out.rc == 0 ? GRACE_FAIL_PYTHON
						      : (kind ? kind : GRACE_FAIL_CHECK), reason);
	} else {
		int bad = 0;

		for (i = 0; i < r->log.n; i++)
			if (r->log.items[i][0] != GRACE_LOG_AUDIT)
				slurm_info(GRACE_PREFIX "job %u step %u: %s", ap.step.job_id,
					   ap.step.step_id, r->log.items[i]);
		if (out.rc != GRACE_RC_REJECT) {
			for (i = 0; i < r->unset.n && !bad; i++)
				bad = grace_ap_env_add(sh, 'U', r->unset.items[i]);
			for (i = 0; i < r->set.n && !bad; i++)
				bad = grace_ap_env_add(sh, 'S', r->set.items[i]);
		}
		if (bad) {
			sh->env_len = 0;
			grace_ap_fail(ctx, sh, &t0, GRACE_FAIL_ENV, "the verdict's environment "
				      "changes do not fit the after-pull page");
		} else {
			for (i = 0; i < r->user.n; i++)
				slurm_spank_log("%s", r->user.items[i]);
			if (out.rc == GRACE_RC_REJECT) {
				if (r->user.n == 0)
					slurm_spank_log(GRACE_PREFIX "this step was refused by the "
							"site's launch check.");
				sh->refuse = 1;
			}
			if (audit != NULL) {
				problem = grace_audit_verdict(ctx, audit, why, sizeof(why));
				if (problem)
					slurm_info(GRACE_PREFIX "job %u step %u: %s", ap.step.job_id,
						   ap.step.step_id, problem);
			}
		}
	}
	grace_outcome_free(&out);
}

/* Every task: the verdict's environment edits, in this task's environment. */
static int grace_ap_env_apply(spank_t sp, const struct grace_ap_shared *sh)
{
	size_t at = 0;

	while (at < sh->env_len) {
		char item[GRACE_AP_ENV];
		const char *text = sh->env + at + 2;
		size_t len = strlen(text);
		char *eq;
		spank_err_t rc;

		snprintf(item, sizeof(item), "%s", text);
		if (sh->env[at] == 'U') {
			rc = spank_unsetenv(sp, item);
		} else {
			eq = strchr(item, '=');
			if (eq == NULL)
				return -1;
			*eq = '\0';
			rc = spank_setenv(sp, item, eq + 1, 1);
		}
		if (rc != ESPANK_SUCCESS)
			return -1;
		at += len + 3;
	}
	return 0;
}

int grace_afterpull_task(const struct grace_context *ctx, spank_t sp)
{
	struct grace_ap_shared *sh = ap.shared;
	struct timespec now, until;
	int rc, refuse;

	if (sh == NULL)
		return 0;
	/* The judging task holds the lock for at most timeout_ms (plus the
	 * audit write); a waiter gives up a little later and follows on_error. */
	clock_gettime(CLOCK_REALTIME, &now);
	grace_deadline(&now, ctx->timeout_ms + 5000, &until);
	do
		rc = pthread_mutex_timedlock(&sh->lock, &until);
	while (rc == EINTR);
	if (rc == EOWNERDEAD) {
		/* The judging task died holding it: no verdict. */
		pthread_mutex_consistent(&sh->lock);
		if (sh->state == GRACE_AP_ASKING) {
			struct timespec t0;

			clock_gettime(CLOCK_MONOTONIC, &t0);
			sh->state = GRACE_AP_DONE;
			sh->env_len = 0;
			grace_ap_fail(ctx, sh, &t0, GRACE_FAIL_INTERNAL,
				      "the task judging the container ended before the verdict");
		}
	} else if (rc != 0) {
		slurm_info(GRACE_PREFIX "error: job %u step %u: a task waited in vain for the "
			   "verdict on the container pyxis unpacked (%s); on_error=%s",
			   ap.step.job_id, ap.step.step_id, strerror(rc), grace_ap_on_error(ctx));
		close(ap.sock);
		ap.sock = -1;
		return ctx->on_error == GRACE_ON_ERROR_DENY ? -1 : 0;
	}
	if (sh->state == GRACE_AP_NONE) {
		sh->state = GRACE_AP_ASKING;
		grace_ap_judge(ctx, sh);
		sh->state = GRACE_AP_DONE;
	}
	refuse = sh->refuse;
	if (!refuse && sh->env_len && grace_ap_env_apply(sp, sh) != 0)
		refuse = ctx->on_error == GRACE_ON_ERROR_DENY;
	pthread_mutex_unlock(&sh->lock);
	close(ap.sock);
	ap.sock = -1;
	return refuse ? -1 : 0;
}
