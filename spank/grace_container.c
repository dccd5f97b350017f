/*
 * grace-policy: which container, if any, runs this step's argv (issue 15).
 *
 * Nothing here trusts the step environment alone: every variable in it can be
 * exported by the user. What counts (docs/SECURITY.md "Containers"):
 *
 * pyxis (NVIDIA/pyxis 0.24.0, read in its args.c and pyxis_slurmstepd.c):
 *   - a plugin whose exported plugin_name is "pyxis" is loaded in this
 *     slurmstepd (dl_iterate_phdr + dlsym on the already loaded objects:
 *     only the admin's plugstack.conf loads plugins);
 *   - its --container-image / --container-name, read with
 *     spank_option_getopt by option name. Slurm's option cache is looked up
 *     by name only (src/common/spank.c _opt_by_name), so the value is the
 *     one pyxis registered and got; we call it only when pyxis is loaded,
 *     otherwise the call would add an option of our own to the cache. This
 *     is an implementation detail of Slurm, not a documented API;
 *   - without the option, PYXIS_CONTAINER_IMAGE / PYXIS_CONTAINER_NAME of the
 *     step environment, which pyxis itself takes as the default (args.c
 *     pyxis_args_check_environment_variables, remote side, spank_getenv):
 *     the user's word, but the same word pyxis acts on.
 *   A local image is one whose string starts with '.' or '/' (pyxis:
 *   strspn(image, "./") > 0), relative to the job's cwd.
 *   pyxis imports, creates and starts the container in its own task_init
 *   (0.8+). If it is listed before us, our task_init runs inside the
 *   container's mount namespace; if it is `optional` and failed, the task
 *   would exec on the host: task_init refuses then (the host step was never
 *   judged). Listed after us, we cannot tell (config check warns).
 *
 * Slurm's own OCI containers (srun --container=BUNDLE, 22.05 slurmstepd.c
 * setup_container, container.c): before any plugin is loaded slurmstepd
 * writes the bundle's config.json, with process.args = the user's argv,
 * process.env and root.path made absolute, into
 * <SlurmdSpoolDir>/oci-job%05u-%05u/config.json (root-owned, O_EXCL, 0750),
 * and replaces the step's argv with a canary
 *   /bin/sh -c "echo 'this should never execute with a container'; exit 1"
 * (seen through S_JOB_ARGV cut to the user's argc: grace_is_oci_canary).
 * So: argv equal to the canary *and* that root-owned file in the spool dir
 * (found from slurmstepd's own socket there) is an OCI step, judged from
 * that file. ContainerPath= in oci.conf moves the copy elsewhere: such a
 * step is judged as a host step (the canary, a harmless /bin/sh).
 * SLURM_CONTAINER is never asked: srun leaves a user's value alone. A
 * user who runs the canary by hand on the host runs a harmless echo, which
 * is judged as any host step.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include <slurm/slurm.h> /* SLURM_BATCH_SCRIPT */

#include "grace.h"

#define GRACE_OCI_CANARY "echo 'this should never execute with a container'; exit 1"

static struct {
	int pyxis;           /* a pyxis step: pyxis starts the container in task_init */
	int pyxis_before_us; /* pyxis was loaded (listed) before this plugin */
	int batch;           /* the batch step: refused in task_init only (as host steps) */
	char mntns[64];      /* our mount namespace in user_init */
} state;

struct grace_find_pyxis {
	const char *self_name; /* this plugin's file, as the loader names it */
	int seen_self;
	int found;
	int before_us;
};

static int grace_is_pyxis(const char *path)
{
	void *h;
	const char *name;
	int yes = 0;

	if (path == NULL || path[0] != '/')
		return 0;
	/* RTLD_NOLOAD: never loads anything, only names what is mapped. */
	h = dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
	if (h == NULL)
		return 0;
	name = dlsym(h, "plugin_name");
	if (name != NULL && strcmp(name, "pyxis") == 0) {
		const char *type = dlsym(h, "plugin_type");

		yes = type != NULL && strcmp(type, "spank") == 0;
	}
	dlclose(h);
	return yes;
}

static int grace_phdr_cb(struct dl_phdr_info *info, size_t size, void *data)
{
	struct grace_find_pyxis *f = data;

	(void)size;
	if (f->self_name != NULL && info->dlpi_name != NULL &&
	    strcmp(f->self_name, info->dlpi_name) == 0) {
		f->seen_self = 1;
		return 0;
	}
	if (grace_is_pyxis(info->dlpi_name)) {
		f->found = 1;
		/* Objects are listed in load order; Slurm loads plugstack.conf's
		 * plugins in file order, so this says who comes first. */
		f->before_us = !f->seen_self;
		return 1; /* the walk ends here */
	}
	return 0;
}

/* Where pyxis is, found once per slurmstepd: the plugins are loaded before
 * any of ours is called and stay, and the walk (a dladdr and a
 * dlopen(RTLD_NOLOAD) per loaded object) is not free. */
static const struct grace_find_pyxis *grace_where_pyxis(void)
{
	static struct grace_find_pyxis f;
	static int done;

	if (!done) {
		Dl_info self;

		memset(&f, 0, sizeof(f));
		if (dladdr((void *)&state, &self) != 0)
			f.self_name = self.dli_fname;
		dl_iterate_phdr(grace_phdr_cb, &f);
		done = 1;
	}
	return &f;
}

static void grace_mntns(char *buf, size_t len)
{
	ssize_t n = readlink("/proc/self/ns/mnt", buf, len - 1);

	buf[n > 0 ? n : 0] = '\0';
}

/* spank_option_getopt of pyxis' option by name; 1 and the value if given. */
static int grace_pyxis_opt(spank_t sp, const char *name, char *out, size_t len)
{
	struct spank_option opt = { (char *)name, "", "", 1, 0, NULL };
	char *arg = NULL;

	if (spank_option_getopt(sp, &opt, &arg) != ESPANK_SUCCESS || arg == NULL ||
	    arg[0] == '\0')
		return 0;
	snprintf(out, len, "%s", arg);
	return 1;
}

static int grace_env(spank_t sp, const char *name, char *out, size_t len)
{
	if (spank_getenv(sp, name, out, (int)len) != ESPANK_SUCCESS || out[0] == '\0')
		return 0;
	return 1;
}

/* One pyxis option's value, option first, then pyxis' own environment
 * default: 1 and the value, 0 if not given, -1 if longer than len (it cannot
 * be carried whole). */
static int grace_pyxis_value(spank_t sp, const char *opt_name, const char *env_name, char *out,
			     size_t len)
{
	struct spank_option opt = { (char *)opt_name, "", "", 1, 0, NULL };
	char *arg = NULL;
	spank_err_t rc;

	if (spank_option_getopt(sp, &opt, &arg) == ESPANK_SUCCESS && arg != NULL &&
	    arg[0] != '\0')
		return snprintf(out, len, "%s", arg) < (int)len ? 1 : -1;
	rc = spank_getenv(sp, env_name, out, (int)len);
	if (rc == ESPANK_NOSPACE)
		return -1;
	return rc == ESPANK_SUCCESS && out[0] != '\0' ? 1 : 0;
}

/* "key=VALUE\n" with '%' and newlines of VALUE as %25 / %0A (container/plan.py
 * decodes them): a value is carried whole or not at all. */
static int grace_args_put(char *buf, size_t len, size_t *used, const char *key,
			  const char *value)
{
	size_t n = *used;
	int w = snprintf(buf + n, len - n, "%s=", key);
	const char *p;

	/* room for "key=", then the closing "\n\0" even when VALUE is empty */
	if (w < 0 || (size_t)w + 2 > len - n)
		return -1;
	n += (size_t)w;
	for (p = value; *p; p++) {
		if (n + 4 >= len)
			return -1;
		if (*p == '%' || *p == '\n') {
			snprintf(buf + n, len - n, "%%%02X", (unsigned char)*p);
			n += 3;
		} else {
			buf[n++] = *p;
		}
	}
	buf[n++] = '\n';
	buf[n] = '\0';
	*used = n;
	return 0;
}

/* The pyxis options that change what argv finds in the container, as
 * "key=value" lines: where host directories are mounted and where the task
 * starts. One that cannot be carried whole (too long) leaves the single line
 * "uncarried=1": the check then does not judge the step against a guess
 * (container/plan.py), and the step is never a cache entry. */
static void grace_pyxis_args(spank_t sp, struct grace_container *c)
{
	static const char *const opts[][3] = {
		{ "container-mounts", "PYXIS_CONTAINER_MOUNTS", "mounts" },
		{ "container-workdir", "PYXIS_CONTAINER_WORKDIR", "workdir" },
	};
	char value[sizeof(c->args)];
	size_t used = 0, i;
	int got;

	c->args[0] = '\0';
	for (i = 0; i < sizeof(opts) / sizeof(opts[0]); i++) {
		got = grace_pyxis_value(sp, opts[i][0], opts[i][1], value, sizeof(value));
		if (got == 0)
			continue;
		if (got < 0 || grace_args_put(c->args, sizeof(c->args), &used, opts[i][2], value) < 0)
			goto uncarried;
	}
	{
		/* --container-mount-home is a flag: no argument */
		struct spank_option flag = { (char *)"container-mount-home", NULL, "", 0, 0, NULL };

		struct spank_option no = { (char *)"no-container-mount-home", NULL, "", 0, 0, NULL };

		if (spank_option_getopt(sp, &flag, NULL) == ESPANK_SUCCESS)
			got = grace_args_put(c->args, sizeof(c->args), &used, "mount_home", "1");
		else if (spank_option_getopt(sp, &no, NULL) == ESPANK_SUCCESS)
			got = grace_args_put(c->args, sizeof(c->args), &used, "mount_home", "0");
		else
			got = 0;
		if (got < 0)
			goto uncarried;
	}
	return;
uncarried:
	snprintf(c->args, sizeof(c->args), "uncarried=1\n");
}

/* The job id and the slurm.conf this slurmstepd runs with (SLURM_CONF of
 * its own environment, which slurmd sets for -f and configless: the
 * admin's, never the job's): what Python needs to name pyxis' container. */
static int grace_args_job(char *buf, size_t len, size_t *used, uint32_t job_id)
{
	const char *conf = getenv("SLURM_CONF");
	char job[16];

	if (conf == NULL || conf[0] != '/')
		conf = "";
	snprintf(job, sizeof(job), "%u", job_id);
	if (grace_args_put(buf, len, used, "job", job) < 0)
		return -1;
	return grace_args_put(buf, len, used, "slurm_conf", conf);
}

static void grace_pyxis(spank_t sp, const char *cwd, struct grace_container *c)
{
	const struct grace_find_pyxis *f = grace_where_pyxis();
	char image[4096] = "", name[256] = "";

	if (!f->found)
		return;
	if (!grace_pyxis_opt(sp, "container-image", image, sizeof(image)))
		grace_env(sp, "PYXIS_CONTAINER_IMAGE", image, sizeof(image));
	if (!grace_pyxis_opt(sp, "container-name", name, sizeof(name)))
		grace_env(sp, "PYXIS_CONTAINER_NAME", name, sizeof(name));
	if (image[0] == '\0' && name[0] == '\0')
		return;

	grace_pyxis_args(sp, c);
	state.pyxis = 1;
	state.pyxis_before_us = f->before_us;
	{
		uint32_t step_id = 0;

		spank_get_item(sp, S_JOB_STEPID, &step_id);
		state.batch = step_id == SLURM_BATCH_SCRIPT;
	}
	grace_mntns(state.mntns, sizeof(state.mntns));
	snprintf(c->kind, sizeof(c->kind), "pyxis");
	snprintf(c->name, sizeof(c->name), "%s", name);
	if (name[0] != '\0') {
		/* --container-name: pyxis reuses the container if it exists, as
		 * the user may have changed it (grace_policy/container/named.py).
		 * Python gets the raw NAME[:FLAG], the job id and the slurm.conf
		 * this slurmstepd runs with (SLURM_CONF of its own environment,
		 * which slurmd sets for -f and configless: the admin's, never the
		 * job's), whose plugstack.conf has pyxis' container_scope. A name
		 * that does not fit is left out and the step is skipped (not a
		 * local image). */
		uint32_t job_id = 0;
		size_t used = strlen(c->args), before = used;

		spank_get_item(sp, S_JOB_ID, &job_id);
		/* Encoded as every value is (grace_args_put); all three or none. */
		if (grace_args_put(c->args, sizeof(c->args), &used, "name", name) < 0 ||
		    grace_args_job(c->args, sizeof(c->args), &used, job_id) < 0)
			c->args[before] = '\0';
	}
	if (image[0] != '\0' && strspn(image, "./") > 0) {
		/* pyxis hands the string to enroot, run in the job's cwd. */
		const char *rel = image;

		while (rel[0] == '.' && rel[1] == '/')
			for (rel += 2; rel[0] == '/'; rel++)
				;
		if (image[0] == '/' || cwd == NULL || cwd[0] == '\0')
			snprintf(c->image, sizeof(c->image), "%s", image);
		else
			snprintf(c->image, sizeof(c->image), "%s/%s", cwd, rel);
		/* A named step's verdict rests on the container's root, which no
		 * cache entry keys on: never "local", so never cached or replayed
		 * (grace_replayable, slurm_bridge._cache_entry). */
		c->local = name[0] == '\0';
		if (name[0] != '\0')
			snprintf(c->reason, sizeof(c->reason),
				 "pyxis container step (container name %.80s, image %.250s)", name,
				 image);
		else
			snprintf(c->reason, sizeof(c->reason), "pyxis container step (image %.300s)",
				 image);
	} else {
		snprintf(c->image, sizeof(c->image), "%s", image);
		if (name[0] != '\0' && image[0] != '\0')
			snprintf(c->reason, sizeof(c->reason),
				 "pyxis container step (container name %.80s, image %.250s)", name,
				 image);
		else
			snprintf(c->reason, sizeof(c->reason), "pyxis container step (%s %.300s)",
				 image[0] ? "image" : "container name", image[0] ? image : name);
	}
}

/*
 * The canary, as S_JOB_ARGV shows it: slurmstepd replaces job->argv but
 * leaves job->argc at the user's count, so a plugin sees the first argc
 * words of the canary (argc 1: "/bin/sh" alone), NULL after the third
 * (grace_stepd.c stops at that NULL). The root-owned config.json decides.
 */
static int grace_is_oci_canary(char **argv, int argc)
{
	static const char *const canary[] = { "/bin/sh", "-c", GRACE_OCI_CANARY };
	int i;

	if (argv == NULL || argc < 1)
		return 0;
	for (i = 0; i < argc && i < 3; i++) {
		if (argv[i] == NULL || strcmp(argv[i], canary[i]) != 0)
			return 0;
	}
	return 1;
}

/*
 * SlurmdSpoolDir, from slurmstepd's own listening socket
 * <spool>/<node>_<job>.<step>: the unix socket among our descriptors whose
 * path ends in _<job>.<step> (its inode matched against /proc/net/unix, so
 * a socket of the same name made by anyone else does not count).
 */
static int grace_spool_dir(uint32_t job_id, uint32_t step_id, char *out, size_t len)
{
	unsigned long inodes[64];
	size_t n = 0;
	char suffix[64], line[4096 + 128], link[64], fdpath[64];
	int fd, found = 0;
	FILE *f;

	for (fd = 0; fd < 1024 && n < sizeof(inodes) / sizeof(inodes[0]); fd++) {
		ssize_t k;

		snprintf(fdpath, sizeof(fdpath), "/proc/self/fd/%d", fd);
		k = readlink(fdpath, link, sizeof(link) - 1);
		if (k <= 0)
			continue;
		link[k] = '\0';
		if (sscanf(link, "socket:[%lu]", &inodes[n]) == 1)
			n++;
	}
	snprintf(suffix, sizeof(suffix), "_%u.%u", job_id, step_id);
	f = fopen("/proc/net/unix", "re");
	if (f == NULL)
		return 0;
	while (!found && fgets(line, sizeof(line), f) != NULL) {
		unsigned long ino;
		char *path = NULL, *slash;
		size_t i, plen, slen = strlen(suffix);
		int field = 0;
		char *tok, *save = NULL;

		line[strcspn(line, "\n")] = '\0';
		ino = 0;
		for (tok = strtok_r(line, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
			if (field == 6)
				ino = strtoul(tok, NULL, 10);
			else if (field == 7)
				path = tok;
			field++;
		}
		if (path == NULL || path[0] != '/')
			continue;
		plen = strlen(path);
		if (plen <= slen || strcmp(path + plen - slen, suffix) != 0)
			continue;
		for (i = 0; i < n; i++) {
			if (inodes[i] != ino)
				continue;
			slash = strrchr(path, '/');
			if (slash != NULL && slash != path) {
				*slash = '\0';
				snprintf(out, len, "%s", path);
				found = 1;
			}
			break;
		}
	}
	fclose(f);
	return found;
}

/*
 * Newer Slurm (seen: 26.05, container.c setup_container) moves argv into
 * config.json only in each task (container_run), after task_init: at
 * user_init S_JOB_ARGV is the user's argv and no copy is written yet, but
 * slurmstepd has created the step's spool directory oci-job<J>-<S> in the
 * root-owned SlurmdSpoolDir, which no user can do. That says "OCI step";
 * which bundle, only srun's SLURM_CONTAINER says (the user's word: a false
 * one can only make the user's own bundle be judged as another; a host step
 * never has that directory, so it is never skipped).
 */
static void grace_oci_late(spank_t sp, const char *spool, uint32_t job_id, uint32_t step_id,
			   struct grace_container *c)
{
	char path[4096], bundle[4096];
	struct stat st;

	if (lstat(spool, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != 0 ||
	    (st.st_mode & 0022) != 0)
		return;
	if (step_id == SLURM_BATCH_SCRIPT)
		snprintf(path, sizeof(path), "%s/oci-job%u-batch", spool, job_id);
	else
		snprintf(path, sizeof(path), "%s/oci-job%u-%u", spool, job_id, step_id);
	if (lstat(path, &st) != 0 || !S_ISDIR(st.st_mode))
		return;
	if (!grace_env(sp, "SLURM_CONTAINER", bundle, sizeof(bundle)) || bundle[0] != '/')
		return;
	snprintf(c->kind, sizeof(c->kind), "oci-bundle");
	snprintf(c->image, sizeof(c->image), "%s", bundle);
	c->local = 1;
	snprintf(c->reason, sizeof(c->reason), "Slurm OCI container step (bundle %.300s)",
		 bundle);
}

static void grace_oci(spank_t sp, char **argv, int argc, struct grace_container *c)
{
	uint32_t job_id = 0, step_id = 0;
	char cwd[2048], path[4096];
	struct stat st;

	int canary = grace_is_oci_canary(argv, argc);

	/* A host step pays nothing here: neither the canary nor srun's variable
	 * (a false SLURM_CONTAINER costs its sender one lookup, nothing more). */
	if (!canary && !grace_env(sp, "SLURM_CONTAINER", path, sizeof(path)))
		return;
	spank_get_item(sp, S_JOB_ID, &job_id);
	spank_get_item(sp, S_JOB_STEPID, &step_id);
	if (!grace_spool_dir(job_id, step_id, cwd, sizeof(cwd)))
		return;
	if (!canary) {
		grace_oci_late(sp, cwd, job_id, step_id, c);
		return;
	}
	if (step_id == SLURM_BATCH_SCRIPT)
		snprintf(path, sizeof(path), "%s/oci-job%05u-batch/config.json", cwd, job_id);
	else
		snprintf(path, sizeof(path), "%s/oci-job%05u-%05u/config.json", cwd, job_id,
			 step_id);
	/* Written by slurmstepd as root, O_EXCL, before any plugin ran. */
	if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != 0)
		return;
	snprintf(c->kind, sizeof(c->kind), "oci");
	snprintf(c->image, sizeof(c->image), "%s", path);
	c->local = 1;
	snprintf(c->reason, sizeof(c->reason), "Slurm OCI container step (%.300s)", path);
}

void grace_container_detect(spank_t sp, char **argv, int argc, const char *cwd,
			    struct grace_container *c)
{
	memset(c, 0, sizeof(*c));
	memset(&state, 0, sizeof(state));
	grace_pyxis(sp, cwd, c);
	if (c->kind[0] == '\0')
		grace_oci(sp, argv, argc, c);
}

int grace_container_pyxis_first(void)
{
	const struct grace_find_pyxis *f = grace_where_pyxis();

	return f->found && f->before_us;
}

int grace_container_after_pull(const struct grace_container *c, unsigned int job_id,
			       unsigned int step_id, char *buf, size_t len)
{
	char num[16];
	size_t used;

	/* Listed after us, pyxis has not made the container when our
	 * task_init runs (the config check warns); a local image was judged
	 * whole in user_init. */
	if (!state.pyxis || !state.pyxis_before_us || strcmp(c->kind, "pyxis") != 0 ||
	    c->image[0] == '\0' || strspn(c->image, "./") > 0 ||
	    strstr(c->args, "uncarried=1\n") != NULL)
		return 0;
	if (snprintf(buf, len, "%s", c->args) >= (int)len)
		return 0;
	used = strlen(buf);
	snprintf(num, sizeof(num), "%u", step_id);
	if (grace_args_put(buf, len, &used, "after_pull", "1") < 0 ||
	    grace_args_put(buf, len, &used, "step", num) < 0)
		return 0;
	/* A named step's args have them already: the same values again. */
	return grace_args_job(buf, len, &used, job_id) < 0 ? 0 : 1;
}

int grace_container_task_init(spank_t sp, char *why, size_t len)
{
	char now[64];

	(void)sp;
	if (!state.pyxis || !state.pyxis_before_us)
		return 0;
	grace_mntns(now, sizeof(now));
	if (now[0] == '\0' || state.mntns[0] == '\0' || strcmp(now, state.mntns) != 0)
		return 0;
	/* pyxis ran its task_init before ours and we are still in the host's
	 * mount namespace: pyxis (optional, failed) did not start the container,
	 * and the task would exec the step's argv on the host, unjudged. */
	snprintf(why, len, GRACE_PREFIX "this step was refused: it asked for a pyxis container, "
		 "but the container was not started, so the program would run on the "
		 "node itself, where it was not checked. See pyxis' error above.");
	return -1;
}

int grace_container_task_init_privileged(int rejected)
{
	/* Seen on 22.05 for srun steps: exit 1, our lines already shown, pyxis
	 * only logs that it had no container to remove. Batch steps keep the
	 * task_init refusal whose outcome is known (FAILED, node idle). */
	return rejected && state.pyxis && !state.batch ? -1 : 0;
}
