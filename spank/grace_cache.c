/*
 * grace-policy: the verdict cache, read and written in C.
 *
 * Most steps run the same few programs again and again, and their check is
 * a clean allow every time. When Python judges a step clean it also hands C
 * an entry (grace_policy/verdict_cache.py has the format): the step's inputs,
 * the mode, and every filesystem question the check asked with the answer it
 * got (grace_policy/fsprobe.py). The next identical step is judged here, in
 * C, without starting Python or even loading libpython:
 *
 *   - the file is DIR/<uid>.v<version>, opened by root in slurm_spank_init
 *     (before privileges drop) in a root-owned directory nobody else can
 *     write; users cannot write it, so every entry was written by the check;
 *   - beside it DIR/node.v<version>, read for every user's step: entries of
 *     steps whose every recorded answer no user can change (root's files
 *     in directories no user can write; grace_policy/nodeowned.py), marked
 *     "O scope node" by the check and without the user's groups;
 *   - an entry is trusted only when every input equals the step's and every
 *     recorded question, asked again now *with the user's rights* (user_init
 *     runs as the user), gets the recorded answer. Any difference is a miss
 *     and the full check runs. A miss is always safe; a hit only ever
 *     replays a clean allow.
 *
 * Keep the answer strings in step with fsprobe.signature() and the parser
 * with verdict_cache.parse(): tests/slurm/test_cache.py holds the two sides
 * together on the real cluster.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "grace.h"

#ifndef GRACE_VERSION
#error "GRACE_VERSION (grace_policy.__version__) must be defined by the build"
#endif

#define GRACE_CACHE_TRIM (1024 * 1024)     /* start over when the file grows past this */
#define GRACE_CACHE_ENTRY_MAX (256 * 1024) /* verdict_cache.MAX_ENTRY */
/* The whole file, at most: what trimming leaves plus one entry. */
#define GRACE_CACHE_READ_MAX (GRACE_CACHE_TRIM + GRACE_CACHE_ENTRY_MAX)

/* ------------------------------------------------------------------------ */
/* Opening (root, slurm_spank_init)                                          */

/* The node's GPU facts as the node checker published them (DIR/gpus.v<version>,
 * grace_policy/cuda/nodegpus.py), read here as root: the "gpus" input of an
 * entry judged on NVML's answer matches only this text. Empty: no trusted
 * file, and no such entry matches. One per slurmstepd, like the cache fds;
 * the lookup child inherits it. */
#define GRACE_GPU_FACTS_MAX 1024 /* nodegpus.FACTS_MAX + 1 */
static char grace_gpu_facts[GRACE_GPU_FACTS_MAX];

static void grace_gpu_facts_read(const struct grace_context *ctx)
{
	char path[4096];
	struct stat st;
	ssize_t n;
	size_t i;
	int fd;

	grace_gpu_facts[0] = '\0';
	if ((size_t)snprintf(path, sizeof(path), "%s/gpus.v%s", ctx->cache_dir, GRACE_VERSION) >=
	    sizeof(path))
		return;
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0)
		return; /* no checker published facts: such entries are misses */
	/* As the cache files: only root could have written it. */
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != 0 ||
	    (st.st_mode & 0022) != 0 || st.st_nlink != 1) {
		close(fd);
		return;
	}
	n = read(fd, grace_gpu_facts, sizeof(grace_gpu_facts));
	close(fd);
	if (n <= 0 || (size_t)n >= sizeof(grace_gpu_facts)) {
		grace_gpu_facts[0] = '\0';
		return;
	}
	for (i = 0; i < (size_t)n; i++) {
		/* nodegpus.facts_text(): printable ASCII on one line */
		if (grace_gpu_facts[i] < 0x20 || grace_gpu_facts[i] > 0x7e) {
			grace_gpu_facts[0] = '\0';
			return;
		}
	}
	grace_gpu_facts[n] = '\0';
}

/* Open (creating) one cache file DIR/NAME.v<version> as root; -1 with the
 * reason in ctx->cache_error. */
static int grace_cache_file(struct grace_context *ctx, const char *name, const char *what)
{
	char path[4096];
	struct stat st;
	int fd;

	if ((size_t)snprintf(path, sizeof(path), "%s/%s.v%s", ctx->cache_dir, name,
			     GRACE_VERSION) >= sizeof(path)) {
		snprintf(ctx->cache_error, sizeof(ctx->cache_error),
			 "%s off: cache_dir is too long", what);
		return -1;
	}
	fd = open(path, O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
	if (fd < 0) {
		snprintf(ctx->cache_error, sizeof(ctx->cache_error),
			 "%s off: cannot open %.400s as root: %s", what, path, strerror(errno));
		return -1;
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != 0 ||
	    (st.st_mode & 0022) != 0 || st.st_nlink != 1) {
		snprintf(ctx->cache_error, sizeof(ctx->cache_error),
			 "%s off: %.400s must be a regular file owned by root, with one "
			 "link and not group/other-writable (uid %u, mode %04o)", what, path,
			 (unsigned int)st.st_uid, (unsigned int)(st.st_mode & 07777));
		close(fd);
		return -1;
	}
	return fd;
}

void grace_cache_open(struct grace_context *ctx, spank_t sp)
{
	char name[32];
	struct stat st;
	uid_t uid = (uid_t)-1;

	ctx->cache_fd = -1;
	ctx->node_cache_fd = -1;
	if (ctx->cache_dir == NULL)
		return; /* cache_dir=none */
	if (ctx->cache_dir[0] != '/') {
		snprintf(ctx->cache_error, sizeof(ctx->cache_error),
			 "verdict cache off: cache_dir=%s is not an absolute path", ctx->cache_dir);
		return;
	}
	if (spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS || uid == (uid_t)-1) {
		snprintf(ctx->cache_error, sizeof(ctx->cache_error),
			 "verdict cache off: the step's uid is unknown in slurm_spank_init");
		return;
	}
	if (mkdir(ctx->cache_dir, 0700) != 0 && errno != EEXIST) {
		snprintf(ctx->cache_error, sizeof(ctx->cache_error),
			 "verdict cache off: cannot create %s: %s", ctx->cache_dir, strerror(errno));
		return;
	}
	/* lstat: a symlink is refused, whatever it points to. */
	if (lstat(ctx->cache_dir, &st) != 0) {
		snprintf(ctx->cache_error, sizeof(ctx->cache_error),
			 "verdict cache off: %s: %s", ctx->cache_dir, strerror(errno));
		return;
	}
	if (!S_ISDIR(st.st_mode) || st.st_uid != 0 || (st.st_mode & 0022) != 0) {
		snprintf(ctx->cache_error, sizeof(ctx->cache_error),
			 "verdict cache off: %s must be a directory owned by root and not "
			 "group/other-writable (it is %s, uid %u, mode %04o)", ctx->cache_dir,
			 S_ISDIR(st.st_mode) ? "a directory" : S_ISLNK(st.st_mode) ? "a symlink"
								  : "not a directory",
			 (unsigned int)st.st_uid, (unsigned int)(st.st_mode & 07777));
		return;
	}
	snprintf(name, sizeof(name), "%u", (unsigned int)uid);
	ctx->cache_fd = grace_cache_file(ctx, name, "verdict cache");
	if (ctx->cache_fd < 0)
		return;
	grace_gpu_facts_read(ctx);
	/* The node-wide file: read by every user's step, written only here, by
	 * root, with entries whose every answer no user can change (the bridge's
	 * grace_policy.nodeowned); docs/SECURITY.md. Without it the user's file
	 * still works. */
	ctx->node_cache_fd = grace_cache_file(ctx, "node", "node-wide verdict cache");
}

/* ------------------------------------------------------------------------ */
/* Tokens: fsprobe.encode() / verdict_cache.decode()                          */

static int grace_plain(unsigned char b)
{
	return b >= 0x21 && b <= 0x7e && b != '%';
}

/* Is tok[0..len) exactly fsprobe.encode(raw)? Compared byte by byte, so a
 * 100 KiB PATH needs no buffer. */
static int grace_enc_equal(const char *tok, size_t len, const char *raw)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t i = 0;
	const unsigned char *p;

	for (p = (const unsigned char *)raw; *p; p++) {
		if (grace_plain(*p)) {
			if (i >= len || tok[i] != (char)*p)
				return 0;
			i++;
		} else {
			if (i + 3 > len || tok[i] != '%' || tok[i + 1] != hex[*p >> 4] ||
			    tok[i + 2] != hex[*p & 15])
				return 0;
			i += 3;
		}
	}
	return i == len;
}

static int grace_hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* verdict_cache.decode into out (NUL-terminated). -1: too long, bad %XX, or
 * a NUL byte (no path or name can hold one: never a match). */
static int grace_dec(const char *tok, size_t len, char *out, size_t cap)
{
	size_t i = 0, n = 0;

	while (i < len) {
		int c;

		if (tok[i] == '%' && i + 3 <= len) {
			int hi = grace_hexval(tok[i + 1]), lo = grace_hexval(tok[i + 2]);

			if (hi < 0 || lo < 0)
				return -1;
			c = hi * 16 + lo;
			i += 3;
		} else {
			c = (unsigned char)tok[i++];
		}
		if (c == 0 || n + 1 >= cap)
			return -1;
		out[n++] = (char)c;
	}
	out[n] = '\0';
	return (int)n;
}

/* ------------------------------------------------------------------------ */
/* The step's inputs, as C hands them to Python                              */

/* The value of NAME in the step env as Python reads it (first definition). */
static const char *grace_env_value(const struct grace_step *step, const char *name)
{
	size_t nlen = strlen(name);
	int i;

	for (i = 0; i < step->envc && step->env && step->env[i]; i++) {
		if (strncmp(step->env[i], name, nlen) == 0 && step->env[i][nlen] == '=')
			return step->env[i] + nlen + 1;
	}
	return NULL;
}

/* slurm_bridge.credentials(): "<egid>:<sorted unique supplementary gids>"
 * (grace_creds_format, grace_contract.c). */
static int grace_creds(char *buf, size_t len)
{
	gid_t groups[1024];
	unsigned int ids[1024];
	int n, i;

	n = getgroups(1024, groups);
	if (n < 0)
		return -1;
	for (i = 0; i < n; i++)
		ids[i] = (unsigned int)groups[i];
	return grace_creds_format((unsigned int)getegid(), ids, (size_t)n, buf, len);
}

/* What a lookup compares besides the step: computed once per lookup. */
struct grace_now {
	char creds[8192];
	char host[512];
};

/* verdict_cache.host_profile(): machine, page size, kernel release, glibc
 * ("x86_64 4096 6.1.0-18-amd64 glibc 2.36"). An entry made before a reboot
 * into a 64 KiB kernel, or before a glibc upgrade, is never replayed. */
static int grace_host(char *buf, size_t len)
{
	struct utsname uts;
	char libc[128];
	size_t n;

	if (uname(&uts) != 0)
		return -1;
	n = confstr(_CS_GNU_LIBC_VERSION, libc, sizeof(libc));
	if (n == 0 || n > sizeof(libc))
		snprintf(libc, sizeof(libc), "-");
	return (size_t)snprintf(buf, len, "%s %ld %s %s", uts.machine, sysconf(_SC_PAGESIZE),
				uts.release, libc) < len ? 0 : -1;
}

/* Does the "I NAME VALUE" value token equal the step's input? */
static int grace_input_matches(const struct grace_step *step, const struct grace_now *now,
			       const char *name, size_t nlen, const char *val, size_t vlen)
{
	char decoded[1024];
	const char *have;

	if (nlen == 5 && memcmp(name, "argv0", 5) == 0) {
		if (step->argc < 1 || step->argv == NULL || step->argv[0] == NULL)
			return 0;
		have = step->argv[0];
	} else if (nlen == 3 && memcmp(name, "cwd", 3) == 0) {
		have = step->cwd;
	} else if (nlen == 9 && memcmp(name, "partition", 9) == 0) {
		have = step->partition;
	} else if (nlen == 9 && memcmp(name, "user_mode", 9) == 0) {
		have = step->user_mode;
	} else if (nlen == 6 && memcmp(name, "config", 6) == 0) {
		have = step->config;
	} else if (nlen == 4 && memcmp(name, "code", 4) == 0) {
		have = step->code;
	} else if (nlen == 5 && memcmp(name, "creds", 5) == 0) {
		have = now->creds;
	} else if (nlen == 4 && memcmp(name, "host", 4) == 0) {
		have = now->host;
	} else if (nlen == 4 && memcmp(name, "gpus", 4) == 0) {
		/* the published GPU facts; none: never a match, not even "-" */
		if (grace_gpu_facts[0] == '\0')
			return 0;
		have = grace_gpu_facts;
	} else if (nlen == 6 && memcmp(name, "argmin", 6) == 0) {
		/* at least N words: a Python step's arguments after its script,
		 * -c or -m operand are not part of the key */
		char num[16];
		char *endp;
		long min;

		if (vlen < 2 || vlen > 10 || val[0] != '=')
			return 0;
		memcpy(num, val + 1, vlen - 1);
		num[vlen - 1] = '\0';
		min = strtol(num, &endp, 10);
		if (*endp != '\0' || num[0] < '0' || num[0] > '9')
			return 0;
		return step->argc >= min;
	} else if (nlen == 4 && memcmp(name, "node", 4) == 0) {
		have = step->node;
	} else if (nlen == 4 && memcmp(name, "argc", 4) == 0) {
		snprintf(decoded, sizeof(decoded), "%d", step->argc);
		have = decoded;
	} else if (nlen > 5 && nlen < 16 && memcmp(name, "argv:", 5) == 0) {
		/* an argument a Python step's check read: "argv:N", N decimal */
		char num[16];
		char *endp;
		long idx;

		memcpy(num, name + 5, nlen - 5);
		num[nlen - 5] = '\0';
		idx = strtol(num, &endp, 10);
		if (*endp != '\0' || num[0] < '0' || num[0] > '9' || idx < 0 ||
		    step->argv == NULL)
			return 0;
		have = idx < step->argc ? step->argv[idx] : NULL;
	} else if (nlen == 9 && memcmp(name, "container", 9) == 0) {
		/* the container the step runs in (grace_container.c), "KIND:IMAGE" */
		if (step->container_kind == NULL || step->container_image == NULL)
			have = NULL;
		else if (snprintf(decoded, sizeof(decoded), "%s:%s", step->container_kind,
				  step->container_image) >= (int)sizeof(decoded))
			return 0;
		else
			have = decoded;
	} else if (nlen == 5 && memcmp(name, "cargs", 5) == 0) {
		/* the runtime's own options that change what argv finds (pyxis'
		 * mounts, workdir, home mount: grace_container.c), exactly */
		have = step->container_kind != NULL ? step->container_args : NULL;
	} else if (nlen > 4 && memcmp(name, "env:", 4) == 0) {
		if (grace_dec(name + 4, nlen - 4, decoded, sizeof(decoded)) <= 0)
			return 0;
		have = grace_env_value(step, decoded);
	} else {
		return 0; /* an input this plugin does not know: never a match */
	}
	if (have == NULL)
		return vlen == 1 && val[0] == '-';
	return vlen >= 1 && val[0] == '=' && grace_enc_equal(val + 1, vlen - 1, have);
}

/* ------------------------------------------------------------------------ */
/* Filesystem answers: fsprobe.signature() / fsprobe.answer()                */

static void grace_signature(const struct stat *st, int err, int lstat_op, char *buf, size_t len)
{
	if (st == NULL) {
		if (err == ENOENT || err == ENOTDIR)
			snprintf(buf, len, "n");
		else
			snprintf(buf, len, "e%d", err);
	} else if (lstat_op && S_ISLNK(st->st_mode)) {
		snprintf(buf, len, "L");
	} else if (S_ISDIR(st->st_mode)) {
		snprintf(buf, len, "d");
	} else if (S_ISREG(st->st_mode)) {
		snprintf(buf, len, "f%llu:%llu:%lld:%lld:%lld:%o",
			 (unsigned long long)st->st_dev, (unsigned long long)st->st_ino,
			 (long long)st->st_size,
			 (long long)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec,
			 (long long)st->st_ctim.tv_sec * 1000000000LL + st->st_ctim.tv_nsec,
			 (unsigned int)(st->st_mode & 07777));
	} else {
		snprintf(buf, len, "o%o", (unsigned int)(st->st_mode & S_IFMT));
	}
}

/* Ask "P OP PATH ANSWER" again, now, with this process' (the user's) rights. */
static int grace_probe_matches(const char *op, size_t oplen, const char *path_tok,
			       size_t plen, const char *ans, size_t alen)
{
	char path[PATH_MAX + 1];
	char sig[160];
	struct stat st;
	int rc;

	if (oplen != 1 || grace_dec(path_tok, plen, path, sizeof(path)) <= 0 || path[0] != '/')
		return 0;
	if (op[0] == 'r') {
		char *real = realpath(path, NULL);
		int same;

		/* os.path.realpath() answers for missing paths too, realpath(3)
		 * does not: such an entry is a miss, never a wrong hit. */
		if (real == NULL)
			return 0;
		same = grace_enc_equal(ans, alen, real);
		free(real);
		return same;
	}
	if (op[0] == 'D') {
		/* a directory the check listed: fsprobe.dir_signature() */
		rc = stat(path, &st);
		if (rc == 0 && S_ISDIR(st.st_mode)) {
			snprintf(sig, sizeof(sig), "D%llu:%llu:%lld:%lld",
				 (unsigned long long)st.st_dev, (unsigned long long)st.st_ino,
				 (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec,
				 (long long)st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec);
			return grace_enc_equal(ans, alen, sig);
		}
		grace_signature(rc == 0 ? &st : NULL, rc == 0 ? 0 : errno, 0, sig, sizeof(sig));
		return grace_enc_equal(ans, alen, sig);
	}
	if (op[0] == 's')
		rc = stat(path, &st);
	else if (op[0] == 'l')
		rc = lstat(path, &st);
	else
		return 0;
	grace_signature(rc == 0 ? &st : NULL, rc == 0 ? 0 : errno, op[0] == 'l', sig, sizeof(sig));
	return grace_enc_equal(ans, alen, sig);
}

/* ------------------------------------------------------------------------ */
/* Entries                                                                   */

/* Split line [p, end) into up to 4 space-separated tokens; returns the count
 * (5 if there are more). */
static int grace_tokens(const char *p, const char *end, const char **tok, size_t *len)
{
	int n = 0;

	while (p <= end) {
		const char *sp = memchr(p, ' ', (size_t)(end - p));
		const char *stop = sp ? sp : end;

		if (n == 4)
			return 5;
		tok[n] = p;
		len[n] = (size_t)(stop - p);
		n++;
		if (sp == NULL)
			break;
		p = sp + 1;
	}
	return n;
}

/* The inputs every entry the bridge writes has; a block without all of them
 * is not ours (or torn) and never matches, so a block of only "O"/"P" lines
 * cannot stand for every step. A node-wide entry has no "creds" (every user
 * gets the same answers) and no "cwd" when nothing was resolved against it
 * (verdict_cache.node_wide). */
static const char *const grace_required[] = {"argv0", "partition", "user_mode", "config",
					     "code", "node", "host", "env:PATH", "cwd", "creds"};
#define GRACE_REQUIRED_N (sizeof(grace_required) / sizeof(grace_required[0]))
#define GRACE_REQUIRED_ALL ((1u << GRACE_REQUIRED_N) - 1)
#define GRACE_REQUIRED_NODE ((1u << (GRACE_REQUIRED_N - 2)) - 1)

static unsigned int grace_required_bit(const char *name, size_t nlen)
{
	size_t i;

	for (i = 0; i < GRACE_REQUIRED_N; i++)
		if (strlen(grace_required[i]) == nlen && memcmp(grace_required[i], name, nlen) == 0)
			return 1u << i;
	return 0;
}

/* One block (the lines between "GPC1" and "."): 1 and the mode if it holds.
 * Inputs first (cheap), filesystem questions only for a block whose inputs
 * all match. A malformed line makes the block a miss, as verdict_cache.parse
 * skips it. */
static int grace_block_matches(const struct grace_step *step, const struct grace_now *now,
			       int node_file, const char *start, const char *end, char *mode,
			       size_t modelen)
{
	const char *tok[4];
	size_t len[4];
	const char *p;
	int pass, have_mode = 0, have_container = 0, have_cargs = 0, node_scope = 0;
	unsigned int seen = 0;

	for (pass = 0; pass < 2; pass++) {
		for (p = start; p < end;) {
			const char *nl = memchr(p, '\n', (size_t)(end - p));
			const char *eol = nl ? nl : end;
			int n = grace_tokens(p, eol, tok, len);

			if (n >= 1 && len[0] == 1 && tok[0][0] == 'I' && n == 3) {
				if (pass == 0 && !grace_input_matches(step, now, tok[1], len[1],
								      tok[2], len[2]))
					return 0;
				if (pass == 0)
					seen |= grace_required_bit(tok[1], len[1]);
				if (pass == 0 && len[1] == 9 && memcmp(tok[1], "container", 9) == 0)
					have_container = 1;
				if (pass == 0 && len[1] == 5 && memcmp(tok[1], "cargs", 5) == 0)
					have_cargs = 1;
			} else if (n == 3 && len[0] == 1 && tok[0][0] == 'O' && len[1] == 4 &&
				   memcmp(tok[1], "mode", 4) == 0) {
				if (pass == 0) {
					if (grace_dec(tok[2], len[2], mode, modelen) <= 0)
						return 0;
					have_mode = 1;
				}
			} else if (n == 3 && len[0] == 1 && tok[0][0] == 'O' && len[1] == 5 &&
				   memcmp(tok[1], "scope", 5) == 0) {
				if (len[2] != 4 || memcmp(tok[2], "node", 4) != 0)
					return 0;
				node_scope = 1;
			} else if (n == 4 && len[0] == 1 && tok[0][0] == 'P') {
				if (pass == 1 && !grace_probe_matches(tok[1], len[1], tok[2], len[2],
								      tok[3], len[3]))
					return 0;
			} else {
				return 0;
			}
			p = eol + 1;
		}
		/* The node-wide file takes only entries marked for it, which
		 * may omit creds and cwd; the user's file takes no such entry. */
		if (pass == 0 && (!have_mode || node_scope != node_file ||
				  (seen & (node_file ? GRACE_REQUIRED_NODE : GRACE_REQUIRED_ALL)) !=
					  (node_file ? GRACE_REQUIRED_NODE : GRACE_REQUIRED_ALL)))
			return 0;
		/* A container step replays only an entry made for its image and
		 * the runtime's options: a host entry for the same argv0 says
		 * nothing about the image, nor one made without the mounts. */
		if (pass == 0 && step->container_kind != NULL && (!have_container || !have_cargs))
			return 0;
	}
	return 1;
}

/* One file's entries, newest first: 1 and the mode on a hit. */
static int grace_cache_lookup_fd(int fd, int node_file, const struct grace_step *step,
				 const struct grace_now *now, char *mode, size_t modelen)
{
	struct stat st;
	char *buf;
	size_t want, got = 0;
	off_t off;
	const char **starts = NULL, **ends = NULL;
	size_t nblocks = 0, cap = 0, i;
	const char *p, *end, *open_block = NULL;
	int hit = 0;

	if (fd < 0 || fstat(fd, &st) != 0 || st.st_size <= 0)
		return 0;
	want = st.st_size > GRACE_CACHE_READ_MAX ? GRACE_CACHE_READ_MAX : (size_t)st.st_size;
	off = st.st_size - (off_t)want;
	buf = malloc(want + 1);
	if (buf == NULL)
		return 0;
	while (got < want) {
		ssize_t n = pread(fd, buf + got, want - got, off + (off_t)got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	buf[got] = '\0';

	/* The blocks, in file order (verdict_cache.parse). A read that starts
	 * inside the file starts inside a line: skip to the next one, so the
	 * tail of a value can never be taken for a "GPC1" line. */
	end = buf + got;
	p = buf;
	if (off > 0) {
		const char *first = memchr(buf, '\n', got);

		p = first ? first + 1 : end;
	}
	for (; p < end;) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		const char *eol = nl ? nl : end;
		size_t llen = (size_t)(eol - p);

		if (llen == 4 && memcmp(p, "GPC1", 4) == 0) {
			open_block = nl ? nl + 1 : end;
		} else if (llen == 1 && p[0] == '.' && open_block != NULL) {
			if (nblocks == cap) {
				size_t ncap = cap ? cap * 2 : 64;
				const char **ns = realloc(starts, ncap * sizeof(*ns));
				const char **ne;

				if (ns == NULL)
					break;
				starts = ns;
				ne = realloc(ends, ncap * sizeof(*ne));
				if (ne == NULL)
					break;
				ends = ne;
				cap = ncap;
			}
			starts[nblocks] = open_block;
			/* the block's lines end before this "." line's own start */
			ends[nblocks] = p > open_block ? p - 1 : open_block;
			nblocks++;
			open_block = NULL;
		}
		if (nl == NULL)
			break;
		p = nl + 1;
	}
	/* Newest first. */
	for (i = nblocks; i-- > 0;) {
		if (grace_block_matches(step, now, node_file, starts[i], ends[i], mode,
					modelen)) {
			hit = 1;
			break;
		}
	}
	free(starts);
	free(ends);
	free(buf);
	return hit;
}

/*
 * Which steps the cache may answer at all: the steps slurm_bridge._cache_entry
 * writes an entry for (the same three tests there). A batch step's stored
 * script is new for every job; a container step is replayed only when C
 * found its runtime and a local image to key on (one skipped on the admin's
 * word judged nothing); `apptainer exec IMG CMD` names its image in an
 * argument no entry keys on (contract.IMAGE_WRAPPERS), so a host entry for
 * the same argv0 says nothing about it.
 */
static int grace_replayable(const struct grace_step *step)
{
	if (step->batch)
		return 0;
	if (step->container != NULL && (step->container_kind == NULL || !step->container_local))
		return 0;
	if (step->argc > 0 && step->argv != NULL && grace_wraps_an_image(step->argv[0]))
		return 0;
	return 1;
}

int grace_cache_lookup(const struct grace_context *ctx, const struct grace_step *step,
		       char *mode, size_t modelen)
{
	struct grace_now *now;
	int hit = 0;

	if (ctx->cache_fd < 0 || !grace_replayable(step))
		return 0;
	now = malloc(sizeof(*now));
	if (now == NULL)
		return 0;
	if (grace_creds(now->creds, sizeof(now->creds)) == 0 &&
	    grace_host(now->host, sizeof(now->host)) == 0)
		hit = grace_cache_lookup_fd(ctx->cache_fd, 0, step, now, mode, modelen) ||
		      grace_cache_lookup_fd(ctx->node_cache_fd, 1, step, now, mode, modelen);
	free(now);
	return hit;
}

const char *grace_cache_store(const struct grace_context *ctx, const char *entry,
			      char *err, size_t errlen)
{
	size_t len = strlen(entry);
	struct stat st;
	ssize_t n;
	int fd = ctx->cache_fd;
	const char *which = "verdict cache";

	if (ctx->cache_fd < 0)
		return NULL;
	/* What verdict_cache.entry() makes: "\nGPC1\n...\n.\n", bounded. */
	if (len < 9 || len > GRACE_CACHE_ENTRY_MAX || strncmp(entry, "\nGPC1\n", 6) != 0 ||
	    strcmp(entry + len - 3, "\n.\n") != 0) {
		snprintf(err, errlen, "verdict cache: malformed entry not stored");
		return err;
	}
	if (strstr(entry, "\nO scope node\n") != NULL) {
		/* The check found that no user can change any answer it rests on:
		 * for every user of the node, in the file only root writes. */
		fd = ctx->node_cache_fd;
		which = "node-wide verdict cache";
		if (fd < 0)
			return NULL; /* its opening was logged */
	}
	if (fstat(fd, &st) == 0 && st.st_size > GRACE_CACHE_TRIM && ftruncate(fd, 0) != 0) {
		snprintf(err, errlen, "%s: cannot trim: %s", which, strerror(errno));
		return err;
	}
	n = write(fd, entry, len);
	if (n < 0) {
		snprintf(err, errlen, "%s: cannot write: %s", which, strerror(errno));
		return err;
	}
	if ((size_t)n != len) {
		/* A torn entry is skipped by every reader; the next one starts
		 * with a newline of its own. */
		snprintf(err, errlen, "%s: short write (%zd of %zu bytes)", which, n, len);
		return err;
	}
	return NULL;
}

/* ------------------------------------------------------------------------ */
/* The audit line of a hit: grace_policy/audit.py's lean line, byte for byte  */
/* (json.dumps(sort_keys=True, ensure_ascii=True)) plus "cache": "hit".       */

struct grace_buf {
	char *p;
	size_t n, cap;
	int full;
};

static void grace_put(struct grace_buf *b, const char *s, size_t len)
{
	if (b->n + len >= b->cap) {
		b->full = 1;
		return;
	}
	memcpy(b->p + b->n, s, len);
	b->n += len;
	b->p[b->n] = '\0';
}

static void grace_puts(struct grace_buf *b, const char *s)
{
	grace_put(b, s, strlen(s));
}

static void grace_put_u(struct grace_buf *b, unsigned int cp)
{
	char esc[8];

	snprintf(esc, sizeof(esc), "\\u%04x", cp & 0xffff);
	grace_puts(b, esc);
}

/* A JSON string of bytes read as Python reads them (UTF-8, surrogateescape)
 * and written as json.dumps(ensure_ascii=True) writes it. */
static void grace_put_json(struct grace_buf *b, const char *s)
{
	const unsigned char *p = (const unsigned char *)s;

	if (s == NULL) {
		grace_puts(b, "null");
		return;
	}
	grace_puts(b, "\"");
	while (*p) {
		unsigned int c = *p, cp = 0;
		int extra = 0, i;

		if (c < 0x80) {
			switch (c) {
			case '"': grace_puts(b, "\\\""); break;
			case '\\': grace_puts(b, "\\\\"); break;
			case '\n': grace_puts(b, "\\n"); break;
			case '\r': grace_puts(b, "\\r"); break;
			case '\t': grace_puts(b, "\\t"); break;
			case '\b': grace_puts(b, "\\b"); break;
			case '\f': grace_puts(b, "\\f"); break;
			default:
				if (c < 0x20)
					grace_put_u(b, c);
				else
					grace_put(b, (const char *)p, 1);
			}
			p++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf) {
			extra = 1;
			cp = c & 0x1f;
		} else if (c >= 0xe0 && c <= 0xef) {
			extra = 2;
			cp = c & 0x0f;
		} else if (c >= 0xf0 && c <= 0xf4) {
			extra = 3;
			cp = c & 0x07;
		}
		for (i = 1; extra && i <= extra; i++) {
			if ((p[i] & 0xc0) != 0x80) {
				extra = 0;
				break;
			}
			cp = (cp << 6) | (p[i] & 0x3f);
		}
		/* overlong, surrogate or beyond U+10FFFF: not UTF-8 */
		if (extra && ((extra == 2 && cp < 0x800) || (extra == 3 && cp < 0x10000) ||
			      (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff))
			extra = 0;
		if (extra == 0) {
			grace_put_u(b, 0xdc00 + c); /* surrogateescape: one byte at a time */
			p++;
			continue;
		}
		if (cp >= 0x10000) {
			cp -= 0x10000;
			grace_put_u(b, 0xd800 + (cp >> 10));
			grace_put_u(b, 0xdc00 + (cp & 0x3ff));
		} else {
			grace_put_u(b, cp);
		}
		p += extra + 1;
	}
	grace_puts(b, "\"");
}

/* float repr of round(ms, 3): "%.3f" without trailing zeros, one kept. */
static void grace_put_ms(struct grace_buf *b, double ms)
{
	char num[64];
	size_t len;

	snprintf(num, sizeof(num), "%.3f", ms < 0 ? 0.0 : ms);
	len = strlen(num);
	while (len > 2 && num[len - 1] == '0' && num[len - 2] != '.')
		num[--len] = '\0';
	grace_puts(b, num);
}

/* audit.iso_utc(): microseconds omitted when zero. */
static void grace_put_time(struct grace_buf *b)
{
	struct timespec now;
	struct tm tm;
	char text[64];
	time_t sec;
	long micros;

	clock_gettime(CLOCK_REALTIME, &now);
	sec = now.tv_sec;
	micros = (now.tv_nsec + 500) / 1000;
	if (micros >= 1000000) {
		sec += 1;
		micros -= 1000000;
	}
	gmtime_r(&sec, &tm);
	strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%S", &tm);
	grace_puts(b, "\"");
	grace_puts(b, text);
	if (micros) {
		snprintf(text, sizeof(text), ".%06ld", micros);
		grace_puts(b, text);
	}
	grace_puts(b, "Z\"");
}

static const char *grace_step_name(unsigned int step_id, char *buf, size_t len)
{
	switch (step_id) {
	case 0xFFFFFFFBu: return "batch";
	case 0xFFFFFFFCu: return "extern";
	case 0xFFFFFFFDu: return "interactive";
	case 0xFFFFFFFEu: return "pending";
	}
	snprintf(buf, len, "%u", step_id);
	return buf;
}

/* What every C-written audit line ends with, from "job_id" on (keys sorted,
 * as json.dumps(sort_keys=True)); "mode" is null for an outcome no config
 * decided. */
static void grace_audit_tail(struct grace_buf *b, const struct grace_step *step,
			     const char *mode, const char *node, const char *phase)
{
	char num[32], step_buf[32];

	grace_puts(b, ", \"job_id\": ");
	snprintf(num, sizeof(num), "%u", step->job_id);
	grace_put_json(b, num);
	grace_puts(b, ", \"mode\": ");
	grace_put_json(b, mode);
	grace_puts(b, ", \"node\": ");
	grace_put_json(b, node);
	grace_puts(b, ", \"partition\": ");
	grace_put_json(b, step->partition);
	grace_puts(b, ", \"paths\": []");
	if (phase != NULL) { /* only on a registry image's second judgement (audit.PHASES) */
		grace_puts(b, ", \"phase\": ");
		grace_put_json(b, phase);
	}
	grace_puts(b, ", \"program\": ");
	grace_put_json(b, step->argc > 0 && step->argv != NULL ? step->argv[0] : NULL);
	grace_puts(b, ", \"rules\": [], \"skipped\": null, \"step_id\": ");
	grace_put_json(b, grace_step_name(step->step_id, step_buf, sizeof(step_buf)));
	grace_puts(b, ", \"time\": ");
	grace_put_time(b);
	snprintf(num, sizeof(num), ", \"uid\": %u}\n", step->uid);
	grace_puts(b, num);
}

/* One whole line to the audit fd (O_APPEND: lines never interleave), or why not. */
static const char *grace_audit_write(const struct grace_context *ctx,
				     const struct grace_buf *b, char *err, size_t errlen)
{
	ssize_t n;

	if (b->full) {
		snprintf(err, errlen, "audit log %s: line too long; not written", ctx->audit_path);
		return err;
	}
	n = write(ctx->audit_fd, b->p, b->n);
	if (n < 0) {
		snprintf(err, errlen, "audit log %s: cannot write: %s", ctx->audit_path,
			 strerror(errno));
		return err;
	}
	if ((size_t)n != b->n) {
		snprintf(err, errlen, "audit log %s: cannot write: short write (%zd of %zu bytes)",
			 ctx->audit_path, n, b->n);
		return err;
	}
	return NULL;
}

/* The node's name for an audit line: slurmstepd's, else uname's. */
static const char *grace_audit_node(const struct grace_step *step, struct utsname *uts)
{
	if (step->node != NULL && step->node[0] != '\0')
		return step->node;
	return uname(uts) == 0 ? uts->nodename : NULL;
}

const char *grace_audit_hit(const struct grace_context *ctx, const struct grace_step *step,
			    const char *mode, double elapsed_ms, char *err, size_t errlen)
{
	char line[32768]; /* argv[0] up to PATH_MAX bytes, each escaped to 6 */
	struct grace_buf b = { line, 0, sizeof(line), 0 };
	struct utsname uts;

	if (ctx->audit_fd < 0 || ctx->audit_path == NULL)
		return NULL; /* not configured, or C logged why it is not open */
	line[0] = '\0';
	/* Keys sorted, as json.dumps(sort_keys=True). */
	grace_puts(&b, "{\"action\": \"allow\", \"cache\": \"hit\", \"elapsed_ms\": ");
	grace_put_ms(&b, elapsed_ms);
	/* A hit is a clean allow: enforce would allow it too, nothing exempted
	 * (exempted verdicts are never cached). */
	grace_puts(&b, ", \"enforce_action\": \"allow\", \"env_set\": [], \"env_unset\": [], "
		   "\"error\": null, \"event\": \"decision\", \"exempt\": [], \"image\": ");
	/* the image a container step was judged in (the bridge's "image") */
	grace_put_json(&b, step->container_kind != NULL ? step->container_image : NULL);
	grace_audit_tail(&b, step, mode, grace_audit_node(step, &uts), NULL);
	return grace_audit_write(ctx, &b, err, errlen);
}

const char *grace_audit_verdict(const struct grace_context *ctx, const char *line,
				char *err, size_t errlen)
{
	size_t len = strlen(line);
	struct grace_buf b = { (char *)line, len, len + 1, 0 };

	if (ctx->audit_fd < 0 || ctx->audit_path == NULL)
		return NULL;
	/* One line: JSON with ensure_ascii has no newline but the last. */
	if (len < 2 || line[0] != '{' || line[len - 1] != '\n' || memchr(line, '\n', len - 1)) {
		snprintf(err, errlen, "audit log %s: the check's line is not one JSON line; "
			 "not written", ctx->audit_path);
		return err;
	}
	return grace_audit_write(ctx, &b, err, errlen);
}

/* The audit line of an on_error outcome decided in C (grace_stepd.c's
 * grace_fail): the same keys as a decision, "mode" null (no config was
 * applied), "error" the reason and "failure" its kind (grace.h GRACE_FAIL_*),
 * which grace-policy report counts apart. */
const char *grace_audit_failure(const struct grace_context *ctx,
				const struct grace_step *step, const char *action,
				const char *failure, const char *reason, double elapsed_ms,
				char *err, size_t errlen)
{
	return grace_audit_failure_phase(ctx, step, action, failure, reason, elapsed_ms, NULL,
					 err, errlen);
}

const char *grace_audit_failure_phase(const struct grace_context *ctx,
				      const struct grace_step *step, const char *action,
				      const char *failure, const char *reason, double elapsed_ms,
				      const char *phase, char *err, size_t errlen)
{
	char line[32768];
	struct grace_buf b = { line, 0, sizeof(line), 0 };
	struct utsname uts;

	if (ctx->audit_fd < 0 || ctx->audit_path == NULL)
		return NULL;
	line[0] = '\0';
	grace_puts(&b, "{\"action\": ");
	grace_put_json(&b, action);
	grace_puts(&b, ", \"elapsed_ms\": ");
	grace_put_ms(&b, elapsed_ms);
	grace_puts(&b, ", \"enforce_action\": null, \"env_set\": [], \"env_unset\": [], "
		   "\"error\": ");
	grace_put_json(&b, reason);
	grace_puts(&b, ", \"event\": \"decision\", \"exempt\": [], \"failure\": ");
	grace_put_json(&b, failure);
	grace_puts(&b, ", \"image\": null"); /* nothing was judged, in no image */
	grace_audit_tail(&b, step, NULL, grace_audit_node(step, &uts), phase);
	return grace_audit_write(ctx, &b, err, errlen);
}
