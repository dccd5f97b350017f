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
#include <time.h>
#include <slurm/spank.h>

/* Every line a user or an admin sees starts with this (team rule). */
#define GRACE_PREFIX "grace-policy: "

/*
 * The C <-> Python interface. Declared again, word for word, in the cdef of
 * spank/build_plugin.py: cffi checks the layout when the plugin is compiled.
 *
 * Return codes of grace_py_decide. 0 is deliberately NOT a success: cffi
 * returns a zeroed result when its start-up failed (field notes §3), and an
 * exception gives -1 (def_extern error=-1). Both land in on_error.
 */
#define GRACE_RC_ALLOW 1
#define GRACE_RC_WARN 2
#define GRACE_RC_REJECT 3
#define GRACE_RC_ERROR 4   /* the bridge caught a failure and emitted the reason */

/* What Python hands back through grace_emit(), one string at a time. */
#define GRACE_EMIT_USER 1  /* a line for the user ("grace-policy: ...") */
#define GRACE_EMIT_UNSET 2 /* a variable name to remove from the step env */
#define GRACE_EMIT_SET 3   /* "NAME=VALUE" to set in the step env */
#define GRACE_EMIT_LOG 4   /* a line for slurmd's log only (error reasons) */
#define GRACE_EMIT_DONE 5  /* the bridge reached its end: the result is complete */
#define GRACE_EMIT_CACHE 6 /* a verdict-cache entry (grace_policy/verdict_cache.py format) */
/* A GRACE_EMIT_LOG item that starts with this is not a log line but the
 * decision's audit line (slurm_bridge.AUDIT_MARK): grace_stepd.c writes it
 * once the verdict is applied, or its own failure line instead, so each
 * step writes exactly one audit line. */
#define GRACE_LOG_AUDIT '\x1e'

struct grace_step {
	const char *config;    /* config=FILE from plugstack.conf, or NULL */
	const char *on_error;  /* "allow" | "deny" (C applies it; for the audit) */
	const char *partition; /* SLURM_JOB_PARTITION of the step, or NULL */
	const char *cwd;       /* the step's working directory, or NULL */
	const char *user_mode; /* --grace-policy=MODE given by the user, or NULL */
	const char *node;      /* this node's name */
	char **argv;           /* S_JOB_ARGV */
	int argc;
	char **env;            /* S_JOB_ENV, "NAME=VALUE" */
	int envc;
	unsigned int job_id;
	unsigned int step_id;
	unsigned int uid;
	int batch;             /* 1: the batch step (argv[0] is the stored script) */
	void *result;          /* opaque, handed back to grace_emit() */
	const char *container; /* why this is a container step (decided in C), or NULL */
	const char *audit_path; /* audit=PATH from plugstack.conf, or NULL */
	int audit_fd;          /* that file, opened by root in slurm_spank_init, or -1 */
	const char *code;      /* which install runs the check: "<plugin dir>|<python_path>" */
	/* The container runtime that runs argv (grace_container.c), or NULL:
	 * "pyxis" (image: the absolute path of a local .sqsh, or pyxis' image
	 * string / container name when not local) or "oci" (image: the
	 * config.json slurmstepd wrote for the bundle). */
	const char *container_kind;
	const char *container_image;
	int container_local;   /* 1: container_image is a file on this node */
	const char *container_args; /* the runtime's own options, "key=value" lines
	                             * (pyxis: mounts, workdir, mount_home), or NULL */
};

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

/* The result of one check, filled by grace_emit(). */
struct grace_result {
	struct grace_strlist user;
	struct grace_strlist unset;
	struct grace_strlist set;
	struct grace_strlist log;
	char *cache; /* the verdict-cache entry Python emitted, or NULL */
	int done;
	int oom; /* an allocation failed: the result is incomplete */
};

enum grace_on_error { GRACE_ON_ERROR_ALLOW = 0, GRACE_ON_ERROR_DENY = 1 };

struct grace_context {
	/* plugstack.conf arguments */
	char *config;
	enum grace_on_error on_error;
	char *python_path; /* extra module dirs, ':'-separated, before the default */
	unsigned int timeout_ms;
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

/* The kinds of failure C records ("failure" in the audit line; counted apart
 * by grace-policy report). */
#define GRACE_FAIL_ARGS "plugstack"   /* plugstack.conf arguments unusable */
#define GRACE_FAIL_TIMEOUT "timeout"  /* no verdict within timeout_ms */
#define GRACE_FAIL_PYTHON "python"    /* the Python part cannot be loaded or started */
#define GRACE_FAIL_CONFIG "config"    /* the config cannot be read or is invalid */
#define GRACE_FAIL_CHECK "check"      /* the check failed in another way */
#define GRACE_FAIL_ENV "env"          /* an env edit the verdict needs failed */
#define GRACE_FAIL_INTERNAL "internal" /* out of memory, no helper process, ... */
#define GRACE_FAIL_CHECKER "checker"  /* the node checker was unusable: checked in slurmstepd */

#endif
