/*
 * grace-policy: the frames and records the check's helpers exchange with
 * slurmstepd (grace_wire.c). Their layout is grace_policy/contract.py's
 * (GRACE_STEP_FRAME, GRACE_CREDS_IDS, GRACE_REC_*: build/grace_contract.h);
 * grace_policy/checker/wire.py is the Python side of the same contract.
 *
 * A frame is a u32 length (host order) and that many bytes; in it a number
 * is a u32 and a text its length with the NUL (0 for NULL), then its bytes
 * and the NUL. A record is one byte of kind, a u32 length and the bytes.
 */
#ifndef GRACE_WIRE_H
#define GRACE_WIRE_H

#include <stdint.h>
#include <sys/types.h>

#include "grace.h"

/* More than any real frame: a request that says more is refused. */
#define GRACE_FRAME_MAX (16u << 20)

/* A growing buffer; oom: an allocation failed (or past GRACE_FRAME_MAX). */
struct grace_wbuf {
	char *p;
	size_t n, cap;
	int oom;
};

void grace_put(struct grace_wbuf *b, const void *data, size_t len);
void grace_put_u32(struct grace_wbuf *b, uint32_t v);
void grace_put_str(struct grace_wbuf *b, const char *s);
/* Start a frame (returns where its length goes), end it (fills it in). */
size_t grace_begin_frame(struct grace_wbuf *b);
void grace_end_frame(struct grace_wbuf *b, size_t at);

/* A reader over one frame; bad: it was short or malformed. */
struct grace_cursor {
	const char *p;
	size_t left;
	int bad;
};

uint32_t grace_get_u32(struct grace_cursor *c);
const char *grace_get_str(struct grace_cursor *c);

/* The step, field by field as GRACE_STEP_FRAME lists them. */
void grace_put_step(struct grace_wbuf *b, const struct grace_step *s);
/* The step from its frame: texts point into it, argv/env are allocated
 * (grace_step_free_lists). 0, or -1 for a bad frame. */
int grace_get_step(struct grace_cursor *c, struct grace_step *s);
void grace_step_free_lists(struct grace_step *s);

/* The credentials frame's body: this process's ids and groups now. */
struct grace_creds {
#define GRACE_CREDS_MEMBER(name) uint32_t name;
	GRACE_CREDS_IDS(GRACE_CREDS_MEMBER)
#undef GRACE_CREDS_MEMBER
	uint32_t ngroups;
	gid_t *groups; /* allocated by grace_get_creds (free) */
};
/* 0, or -1 if the ids cannot be read (or no memory). */
int grace_put_creds(struct grace_wbuf *b);
/* The node checker's request goes on after them (contract.REQUEST_TAIL). */
void grace_put_request_tail(struct grace_wbuf *b, uint32_t left_ms, const char *code,
			    const char *path);
int grace_get_creds(struct grace_cursor *c, struct grace_creds *out);

/* Decode a helper's records into out; 0 if they end with GRACE_REC_END,
 * else -1 (out->err and out->failure set). */
int grace_decode(const char *buf, size_t n, struct grace_outcome *out);

/*
 * A node checker request made in one place and sent from another
 * (grace_helper.c): what slurmstepd was at user_init (its ids, its PATH),
 * the install's code and the step's frame, encoded while the step's argv
 * and environment are slurmstepd's to read - a task child forked later may
 * find them moved (another plugin's spank_setenv reallocates the array).
 */
struct grace_node_req {
	struct grace_wbuf creds; /* grace_put_creds */
	struct grace_wbuf step;  /* one frame: grace_put_step */
	char *path;              /* slurmstepd's PATH, or NULL (unset) */
	const char *code;        /* the install's code (the step's, static) */
};

/* 0, or -1 (nothing held). */
int grace_node_req_make(struct grace_node_req *r, const struct grace_step *step);
void grace_node_req_free(struct grace_node_req *r);
/* The after-pull request on sock (grace_afterpull_dial's), as
 * grace_afterpull_ask: 0 answered (out filled), -1 no answer within
 * timeout_ms of started, 1 the node checker did not take it. */
int grace_afterpull_ask_node(int sock, const struct grace_node_req *r,
			     const struct timespec *started, unsigned int timeout_ms,
			     struct grace_outcome *out);

#endif
