/*
 * grace-policy SPANK shim: what the C files share.
 *
 * One static context (in grace_spank.c) holds the plugstack arguments and the
 * verdict of the step; the other files get a pointer to it. The verdict lives
 * in C memory because Python runs once, in user_init, before tasks fork: the
 * forked task children (task_init) must never call into Python (field notes
 * §3: an interpreter in a forked child of a threaded process can hang).
 */
#ifndef GRACE_H
#define GRACE_H

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <slurm/spank.h>

/* Every line a user or an admin sees starts with this (team rule). */
#define GRACE_PREFIX "grace-policy: "

/*
 * The C <-> Python interface: grace_policy/contract.py, the one table both
 * sides are derived from. build/grace_contract.h (spank/gen_contract.py,
 * written by make before any C file is compiled) holds struct grace_step,
 * GRACE_RC_* (grace_py_decide's return codes; 0 is deliberately NOT a
 * success: cffi returns a zeroed result when its start-up failed, field
 * notes section 3, and an exception gives -1, def_extern error=-1; both land
 * in on_error), GRACE_EMIT_* (what Python hands back through grace_emit(),
 * one string at a time), GRACE_REC_* (the helpers' records), GRACE_FAIL_*
 * (the kinds of failure in the audit line), GRACE_LOG_AUDIT (a GRACE_EMIT_LOG
 * item that starts with it is the decision's audit line, which grace_stepd.c
 * writes once the verdict is applied, or its own failure line instead) and
 * the frame's field list. spank/build_plugin.py hands cffi the same struct.
 */
#include "grace_contract.h"

/* Room for grace_code()'s "<plugin dir>|<python_path>". */
#define GRACE_CODE_MAX (4096 + 4200)

/* Implemented in Python (grace_policy/slurm_bridge.py) through cffi. */
int grace_py_decide(const struct grace_step *step);
/* Implemented in C (grace_python.c, in the Python library); Python calls it
 * to hand back the result. */
void grace_emit(void *result, int kind, const char *text);

/* A growable list of strings owned by C. */
struct grace_strlist {
	char **items;
	size_t n;
	size_t cap;
};

/*
 * Append a copy of the first len bytes of s (up to a NUL): 0, or -1 when
 * memory ran out (the list is as it was). Inline here because both
 * libraries fill such lists: the Python one from grace_emit()
 * (grace_python.c), the plugin from a helper's records (grace_wire.c).
 */
static inline int grace_strlist_add(struct grace_strlist *l, const char *s, size_t len)
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

/* The result of one check, filled by grace_emit(). */
struct grace_result {
	struct grace_strlist user;
	struct grace_strlist unset;
	struct grace_strlist set;
	struct grace_strlist log;
	char *cache; /* the verdict-cache entry Python emitted, or NULL */
	char failure[16]; /* with GRACE_RC_ERROR: the kind Python named (GRACE_EMIT_FAIL), or "" */
	int done;
	int oom; /* an allocation failed: the result is incomplete */
	int pull; /* GRACE_EMIT_PULL: a registry image's manifest was judged; its files come */
};

enum grace_on_error { GRACE_ON_ERROR_ALLOW = 0, GRACE_ON_ERROR_DENY = 1 };

struct grace_context {
	/* plugstack.conf arguments */
	char *config;
	enum grace_on_error on_error;
	char *python_path; /* extra module dirs, ':'-separated, before the default */
	unsigned int timeout_ms;
	unsigned int max_memory; /* max_memory=MIB (0: no limit): set by the judging helper */
	char *container_env; /* container_env=NAME: set by an earlier plugin, or NULL */
	char *audit_path;  /* audit=PATH: opened as root in slurm_spank_init */
	int audit_fd;      /* -1 if not opened */
	char audit_error[512]; /* why audit_fd is -1 or unsafe (logged per step) */
	char *cache_dir;   /* cache_dir=DIR (default GRACE_CACHE_DIR); NULL: none */
	int cache_fd;      /* DIR/<uid>.v<version>, opened as root in slurm_spank_init, or -1 */
	int node_cache_fd; /* DIR/node.v<version>: entries every user may replay, or -1 */
	char cache_error[512]; /* why cache_fd is -1 (logged with each step) */
	char args_error[256]; /* non-empty: the arguments are unusable */
	char *test_fail_env; /* test builds only (GRACE_TEST_HOOKS): an env edit that fails */
	int prestart;        /* prestart=on: fork the checker in slurm_spank_init */
	char *test_prestart; /* test builds only: "die" or "hang" for the pre-started helper */
	/* the user's --grace-policy option (remote side: from the option callback) */
	char user_mode[16];
	/* the verdict of this step, kept for task_init */
	int reject;
	/* the directory this plugin was loaded from (to find its Python package) */
	char plugin_dir[4096];
	/* the pre-started helper's socket: preloading stops when it is readable */
	int preload_fd;
	/* checker=node|step: who runs a miss's check (docs/SPANK.md "The node checker") */
	int checker_node;
	char *checker_socket; /* checker_socket=PATH (default GRACE_CHECKER_SOCKET) */
	int checker_fd;       /* slurmstepd: connected in slurm_spank_init, or -1 */
	char *test_checker;   /* test builds only: "hang" for the node checker's children */
	char *test_afterpull; /* test builds only: "die" or "hang" for the after-pull helper */
};

/* The Python part: a library of its own that the stub dlopen()s only in
 * user_init on a cache miss, so srun/sbatch/salloc and cached steps never map
 * libpython (PREFIX/lib/grace-policy/, next to the python/ tree). */
#define GRACE_PY_LIBRARY "grace_policy_py.so"
#define GRACE_PY_SYMBOL "grace_python_check"
#define GRACE_CACHE_DIR "/run/grace-policy"
/* The node checker's socket; its directory is root's, mode 0700. */
#define GRACE_CHECKER_SOCKET "/run/grace-policy/checker/socket"

/* grace_container.c: which container runs the step (never the user's
 * environment alone; docs/SECURITY.md "Containers"). */
struct grace_container {
	char kind[16];     /* "pyxis", "oci", or "" (a host step) */
	char image[4096];  /* see grace_step.container_image */
	char name[256];    /* pyxis --container-name, or "" */
	int local;
	char reason[400];  /* for the audit line: which container, on whose word */
	char args[4096];   /* see grace_step.container_args */
};
/* user_init: fill c (kind "" for a host step). */
void grace_container_detect(spank_t sp, char **argv, int argc, const char *cwd,
			    struct grace_container *c);
/* task_init: -1 (and the user's line in why) if a container step would exec
 * on the host after all. */
int grace_container_task_init(spank_t sp, char *why, size_t len);
/* task_init_privileged (before every plugin's task_init): -1 for a refused
 * pyxis step, so pyxis never starts its container. */
int grace_container_task_init_privileged(int rejected);

/*
 * grace_helper.c: the check in a helper process (docs/SPANK.md "The
 * deadline"). Everything that touches a user's paths - the verdict-cache
 * lookup's stats, the Python part's imports and the check - runs in a child
 * forked by user_init, in a process group of its own, with no descriptor of
 * slurmstepd's but the result pipe, the audit and the cache files. No thread
 * of slurmstepd ever waits on a user's file system, so a hung mount cannot
 * block the credential changes glibc applies to every thread (field notes
 * §10). On timeout the helper is killed (SIGKILL to its group) and left to
 * die when its wait ends.
 */
struct grace_outcome {
	int rc;            /* GRACE_RC_*, or -1 with err set */
	int hit;           /* the verdict cache answered: no Python */
	int miss;          /* internal: the lookup missed, the pre-started helper decides */
	char mode[32];     /* the mode of that entry */
	double hit_ms;     /* user_init start to the end of the lookup */
	struct grace_result result; /* what Python emitted (owned; grace_outcome_free) */
	char err[512];
	const char *failure; /* with err: its kind (GRACE_FAIL_*), or NULL */
};

/* 0: the helper answered (out filled); -1: no answer within timeout_ms (the
 * helper was killed and abandoned); -2: no helper could be started (err). */
int grace_helper_run(struct grace_context *ctx, const struct grace_step *step,
		     const struct timespec *started, unsigned int timeout_ms,
		     struct grace_outcome *out);
void grace_outcome_free(struct grace_outcome *out);
/* slurm_spank_init (remote, root): fork the helper that starts the
 * interpreter while slurmstepd sets the step up (grace_helper.c). */
void grace_helper_prestart(const struct grace_context *ctx);

/*
 * The node checker (checker=node): one interpreter per node, started from
 * slurmd, that forks a child per miss (grace_node.c, grace_policy/nodecheck.py).
 */
/* slurmd's slurm_spank_init: start the server (never waited for). */
void grace_node_start(const struct grace_context *ctx);
/* slurm_spank_slurmd_exit: close its life pipe; it ends by itself. */
void grace_node_stop(void);
/* slurmstepd's slurm_spank_init (root): connect, check it is root's, keep
 * the descriptor for user_init; if it cannot, say so once per server. */
void grace_node_connect(struct grace_context *ctx, spank_t sp);

/* 1 when pyxis is loaded, and before us (plugstack.conf's order): only
 * then can a step's files come from a pull we judge in task_init. */
int grace_container_pyxis_first(void);

/* user_init: 1 and container_args plus the after_pull lines in buf when
 * pyxis (listed before us) will import this step's image from a registry in
 * its task_init, so its files can only be judged there; else 0. */
int grace_container_after_pull(const struct grace_container *c, unsigned int job_id,
			       unsigned int step_id, char *buf, size_t len);

/*
 * grace_afterpull.c: what pyxis unpacked, judged before the first task runs
 * (issue 25 item 2). prepare (user_init, after the step's check): the shared
 * verdict page and the helper, for a step grace_container_after_pull
 * selects; 0, or -1 and why (on_error then). post_fork/exit: slurmstepd
 * closes its end of the helper's socket. task: 0 or -1 (refused), each task.
 */
/* slurm_spank_init (slurmstepd, root, after grace_node_connect): the node
 * checker's second connection, for the after-pull judgement, when pyxis
 * runs before us (options are not readable yet: whether this step pulls is
 * known in user_init, which closes it otherwise). */
void grace_afterpull_early(const struct grace_context *ctx);
int grace_afterpull_prepare(const struct grace_context *ctx, const struct grace_step *step,
			    const struct grace_container *box, char *err, size_t errlen);
void grace_afterpull_post_fork(spank_t sp);
void grace_afterpull_exit(void);
int grace_afterpull_task(const struct grace_context *ctx, spank_t sp);
/* grace_helper.c: fork the after-pull helper (its socket in *sock, CLOEXEC),
 * and ask it: 0 answered (out filled), -1 no answer by the deadline, 1 gone. */
int grace_afterpull_fork(const struct grace_context *ctx, const struct grace_step *step,
			 int *sock, char *err, size_t errlen);
int grace_afterpull_ask(int sock, const struct timespec *started, unsigned int timeout_ms,
			struct grace_outcome *out);
/* until = started + timeout_ms (any clock). */
void grace_deadline(const struct timespec *started, unsigned int timeout_ms,
		    struct timespec *until);
/* The same judgement by the node checker (checker=node), whose interpreter
 * is already warm: a connection of its own, dialed in slurm_spank_init while
 * slurmstepd is root (-1: it could not be made); the request
 * (grace_wire.h grace_node_req, made in user_init) goes on it from the
 * first task. */
int grace_afterpull_dial(const struct grace_context *ctx);

/* grace_stepd.c: the remote (slurmstepd) side. */
int grace_stepd_user_init(struct grace_context *ctx, spank_t sp);
int grace_stepd_task_init(struct grace_context *ctx, spank_t sp);

/*
 * grace_python.c (compiled inside the cffi-generated file): start an isolated
 * interpreter and run one check. Returns a GRACE_RC_* code, or -1 with the
 * reason in err. Never exits the process.
 */
int grace_python_check(const struct grace_context *ctx, const struct grace_step *step,
		       char *err, size_t errlen);
typedef int (*grace_python_check_fn)(const struct grace_context *, const struct grace_step *,
				     char *, size_t);

/*
 * grace_cache.c: clean verdicts replayed without Python (see
 * grace_policy/verdict_cache.py for the format and docs/SECURITY.md).
 */
/* slurm_spank_init, remote, as root: create/check DIR and open the user's
 * file and the node-wide one. */
void grace_cache_open(struct grace_context *ctx, spank_t sp);
/* user_init, as the user: 1 and the mode if a stored entry matches this step
 * and every recorded filesystem answer is still true, else 0. */
int grace_cache_lookup(const struct grace_context *ctx, const struct grace_step *step,
		       char *mode, size_t modelen);
/* Append one entry Python emitted (one write; an entry marked "O scope node"
 * to the node-wide file, any other to the user's); NULL or a reason to log. */
const char *grace_cache_store(const struct grace_context *ctx, const char *entry,
			      char *err, size_t errlen);
/* The audit line of a cache hit, through root's descriptor; NULL or a reason. */
const char *grace_audit_hit(const struct grace_context *ctx, const struct grace_step *step,
			    const char *mode, double elapsed_ms, char *err, size_t errlen);
/* The decision line Python rendered (one JSON line, newline included),
 * through root's descriptor; NULL or a reason. */
const char *grace_audit_verdict(const struct grace_context *ctx, const char *line,
				char *err, size_t errlen);
/* The audit line of an outcome C decided by on_error (the check could not
 * give a verdict): action is what on_error did ("allow" or "reject"),
 * failure the kind of failure (GRACE_FAIL_*), reason the slurmd.log text. */
const char *grace_audit_failure(const struct grace_context *ctx,
				const struct grace_step *step, const char *action,
				const char *failure, const char *reason, double elapsed_ms,
				char *err, size_t errlen);
/* The same with the line's "phase" (NULL: none; "after_pull": the second
 * judgement of a registry image's step, grace_afterpull.c). */
const char *grace_audit_failure_phase(const struct grace_context *ctx,
				      const struct grace_step *step, const char *action,
				      const char *failure, const char *reason, double elapsed_ms,
				      const char *phase, char *err, size_t errlen);

/*
 * grace_contract.c: what C and Python must spell alike (grace_policy/contract.py).
 */
/* "<plugin dir>|<python_path or ->": which install runs a check. 0, or -1
 * if it does not fit. */
int grace_code(const char *plugin_dir, const char *python_path, char *buf, size_t len);
/* "<egid>:<sorted unique groups>": the rights a check runs with. */
int grace_creds_format(unsigned int egid, const unsigned int *groups, size_t n, char *buf,
		       size_t len);
/* 1 if argv[0] runs an image named later in argv (apptainer exec IMG). */
int grace_wraps_an_image(const char *argv0);
/* The GRACE_FAIL_* constant Python named with GRACE_EMIT_FAIL, or NULL. */
const char *grace_python_failure(const char *name);

#endif
