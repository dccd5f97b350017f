/*
 * grace-policy: the frames and records of the check's helpers (grace_wire.h).
 *
 * Why a file of its own: the layout is grace_policy/contract.py's, and the
 * Python side (grace_policy/checker/wire.py) reads and writes the same
 * bytes. Kept apart from the processes that send them (grace_helper.c),
 * this file is what tests/test_contract.py compiles into its C driver, so
 * the test exercises the plugin's own encoder and decoder, not a copy.
 */
#define _GNU_SOURCE
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "grace_wire.h"

void grace_put(struct grace_wbuf *b, const void *data, size_t len)
{
	if (b->oom)
		return;
	if (b->n + len > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		char *np;

		while (cap < b->n + len)
			cap *= 2;
		np = cap > GRACE_FRAME_MAX ? NULL : realloc(b->p, cap);
		if (np == NULL) {
			b->oom = 1;
			return;
		}
		b->p = np;
		b->cap = cap;
	}
	memcpy(b->p + b->n, data, len);
	b->n += len;
}

void grace_put_u32(struct grace_wbuf *b, uint32_t v)
{
	grace_put(b, &v, sizeof(v));
}

/* A string with its NUL (length 0: NULL). */
void grace_put_str(struct grace_wbuf *b, const char *s)
{
	uint32_t len = s ? (uint32_t)strlen(s) + 1 : 0;

	grace_put_u32(b, len);
	if (len)
		grace_put(b, s, len);
}

size_t grace_begin_frame(struct grace_wbuf *b)
{
	size_t at = b->n;

	grace_put_u32(b, 0);
	return at;
}

void grace_end_frame(struct grace_wbuf *b, size_t at)
{
	uint32_t len = (uint32_t)(b->n - at - sizeof(len));

	if (!b->oom)
		memcpy(b->p + at, &len, sizeof(len));
}

uint32_t grace_get_u32(struct grace_cursor *c)
{
	uint32_t v = 0;

	if (c->left < sizeof(v)) {
		c->bad = 1;
		return 0;
	}
	memcpy(&v, c->p, sizeof(v));
	c->p += sizeof(v);
	c->left -= sizeof(v);
	return v;
}

const char *grace_get_str(struct grace_cursor *c)
{
	uint32_t len = grace_get_u32(c);
	const char *s = c->p;

	if (len == 0 || c->bad)
		return NULL;
	/* Its one NUL is its last byte: C would read a shorter string than
	 * the sender wrote. */
	if (len > c->left || s[len - 1] != '\0' || memchr(s, '\0', len - 1) != NULL) {
		c->bad = 1;
		return NULL;
	}
	c->p += len;
	c->left -= len;
	return s;
}

/* ------------------------------------------------------------------------ */
/* The step                                                                 */

static void grace_put_list(struct grace_wbuf *b, char **items, int n)
{
	int i;

	grace_put_u32(b, (uint32_t)(n < 0 ? 0 : n));
	for (i = 0; i < n; i++)
		grace_put_str(b, items[i]);
}

void grace_put_step(struct grace_wbuf *b, const struct grace_step *s)
{
#define PUT_TEXT(f) grace_put_str(b, s->f);
#define PUT_NUM(f) grace_put_u32(b, (uint32_t)s->f);
#define PUT_LIST(f, n) grace_put_list(b, s->f, s->n);
	GRACE_STEP_FRAME(PUT_TEXT, PUT_NUM, PUT_NUM, PUT_NUM, PUT_LIST)
#undef PUT_TEXT
#undef PUT_NUM
#undef PUT_LIST
}

/* A list: its count, then that many strings, none NULL (a NULL inside argv
 * or env would end it early). The array is NULL-terminated. */
static char **grace_get_list(struct grace_cursor *c, int *count)
{
	uint32_t n = grace_get_u32(c), i;
	char **items;

	*count = 0;
	/* Every item takes at least its 4-byte length: a count past what is
	 * left is a lie, not a reason to allocate. */
	if (c->bad || n > c->left / sizeof(uint32_t) || n > (uint32_t)INT32_MAX) {
		c->bad = 1;
		return NULL;
	}
	items = calloc((size_t)n + 1, sizeof(char *));
	if (items == NULL) {
		c->bad = 1;
		return NULL;
	}
	for (i = 0; i < n && !c->bad; i++)
		if ((items[i] = (char *)grace_get_str(c)) == NULL)
			c->bad = 1;
	*count = (int)n;
	return items;
}

int grace_get_step(struct grace_cursor *c, struct grace_step *s)
{
	memset(s, 0, sizeof(*s));
#define GET_TEXT(f) s->f = grace_get_str(c);
#define GET_UINT(f) s->f = grace_get_u32(c);
#define GET_INT(f) s->f = (int)grace_get_u32(c);
#define GET_LIST(f, n) s->f = grace_get_list(c, &s->n);
	GRACE_STEP_FRAME(GET_TEXT, GET_UINT, GET_INT, GET_INT, GET_LIST)
#undef GET_TEXT
#undef GET_UINT
#undef GET_INT
#undef GET_LIST
	/* Nothing may follow: a frame longer than its fields is another layout. */
	if (c->left != 0)
		c->bad = 1;
	return c->bad ? -1 : 0;
}

void grace_step_free_lists(struct grace_step *s)
{
#define FREE_NONE(f)
#define FREE_LIST(f, n) free(s->f), s->f = NULL, s->n = 0;
	GRACE_STEP_FRAME(FREE_NONE, FREE_NONE, FREE_NONE, FREE_NONE, FREE_LIST)
#undef FREE_NONE
#undef FREE_LIST
}

/* ------------------------------------------------------------------------ */
/* Credentials                                                              */

int grace_put_creds(struct grace_wbuf *b)
{
	struct grace_creds c;
	uid_t ru, eu, su;
	gid_t rg, eg, sg, *groups;
	int n, i;

	if (getresuid(&ru, &eu, &su) != 0 || getresgid(&rg, &eg, &sg) != 0)
		return -1;
	n = getgroups(0, NULL);
	if (n < 0)
		return -1;
	groups = calloc((size_t)n + 1, sizeof(*groups));
	if (groups == NULL || (n = getgroups(n, groups)) < 0) {
		free(groups);
		return -1;
	}
	c.ruid = ru;
	c.euid = eu;
	c.suid = su;
	c.rgid = rg;
	c.egid = eg;
	c.sgid = sg;
#define PUT_ID(name) grace_put_u32(b, c.name);
	GRACE_CREDS_IDS(PUT_ID)
#undef PUT_ID
	grace_put_u32(b, (uint32_t)n);
	for (i = 0; i < n; i++)
		grace_put_u32(b, groups[i]);
	free(groups);
	return b->oom ? -1 : 0;
}

void grace_put_request_tail(struct grace_wbuf *b, uint32_t left_ms, const char *code,
			    const char *path)
{
	grace_put_u32(b, left_ms);
	grace_put_str(b, code);
	grace_put_str(b, path);
}

int grace_get_creds(struct grace_cursor *c, struct grace_creds *out)
{
	uint32_t i;

	memset(out, 0, sizeof(*out));
#define GET_ID(name) out->name = grace_get_u32(c);
	GRACE_CREDS_IDS(GET_ID)
#undef GET_ID
	out->ngroups = grace_get_u32(c);
	if (c->bad || out->ngroups > c->left / sizeof(uint32_t))
		return -1;
	out->groups = calloc((size_t)out->ngroups + 1, sizeof(*out->groups));
	if (out->groups == NULL)
		return -1;
	for (i = 0; i < out->ngroups; i++)
		out->groups[i] = grace_get_u32(c);
	return c->bad ? -1 : 0;
}

/* ------------------------------------------------------------------------ */
/* Records                                                                  */

static void grace_copy(char *dst, size_t cap, const char *src, size_t len)
{
	if (len >= cap)
		len = cap - 1;
	memcpy(dst, src, len);
	dst[len] = '\0';
}

int grace_decode(const char *buf, size_t n, struct grace_outcome *out)
{
	size_t off = 0;
	char num[64];
	struct grace_strlist *l;

	while (off + 5 <= n) {
		char kind = buf[off];
		uint32_t len;
		const char *text;

		memcpy(&len, buf + off + 1, sizeof(len));
		if (len > n - off - 5)
			break;
		text = buf + off + 5;
		off += 5 + len;
		l = NULL;
		switch (kind) {
		case GRACE_REC_USER: l = &out->result.user; break;
		case GRACE_REC_UNSET: l = &out->result.unset; break;
		case GRACE_REC_SET: l = &out->result.set; break;
		case GRACE_REC_LOG: l = &out->result.log; break;
		case GRACE_REC_CACHE:
			free(out->result.cache);
			out->result.cache = strndup(text, len);
			if (out->result.cache == NULL)
				out->result.oom = 1;
			break;
		case GRACE_REC_DONE: out->result.done = 1; break;
		case GRACE_REC_PULL: out->result.pull = 1; break;
		case GRACE_REC_FAIL:
			grace_copy(out->result.failure, sizeof(out->result.failure), text, len);
			break;
		case GRACE_REC_OOM: out->result.oom = 1; break;
		case GRACE_REC_ERROR:
			grace_copy(out->err, sizeof(out->err), text, len);
			out->failure = GRACE_FAIL_PYTHON;
			break;
		case GRACE_REC_HIT:
			out->hit = 1;
			out->rc = GRACE_RC_ALLOW;
			grace_copy(out->mode, sizeof(out->mode), text, len);
			break;
		case GRACE_REC_HIT_MS:
			grace_copy(num, sizeof(num), text, len);
			out->hit_ms = strtod(num, NULL);
			break;
		case GRACE_REC_RC:
			grace_copy(num, sizeof(num), text, len);
			out->rc = (int)strtol(num, NULL, 10);
			break;
		case GRACE_REC_MISS: out->miss = 1; break;
		case GRACE_REC_END:
			return 0;
		default:
			break;
		}
		if (l != NULL && grace_strlist_add(l, text, len) < 0)
			out->result.oom = 1;
	}
	snprintf(out->err, sizeof(out->err), "the check's helper process ended without an "
		 "answer");
	out->failure = GRACE_FAIL_CHECK;
	return -1;
}

static void grace_list_free(struct grace_strlist *l)
{
	size_t i;

	for (i = 0; i < l->n; i++)
		free(l->items[i]);
	free(l->items);
	l->items = NULL;
	l->n = l->cap = 0;
}

void grace_outcome_free(struct grace_outcome *out)
{
	grace_list_free(&out->result.user);
	grace_list_free(&out->result.unset);
	grace_list_free(&out->result.set);
	grace_list_free(&out->result.log);
	free(out->result.cache);
	out->result.cache = NULL;
}
