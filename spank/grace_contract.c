/*
 * grace-policy: the strings C and Python must build alike, built once in C
 * (grace_policy/contract.py has the Python side and says why each exists;
 * tests/test_contract.py holds the two to the same output).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grace.h"

int grace_code(const char *plugin_dir, const char *python_path, char *buf, size_t len)
{
	int n = snprintf(buf, len, "%s" GRACE_CODE_SEP "%s", plugin_dir,
			 python_path ? python_path : GRACE_CODE_NO_PATH);

	return n >= 0 && (size_t)n < len ? 0 : -1;
}

static int grace_cmp_uint(const void *a, const void *b)
{
	unsigned int x = *(const unsigned int *)a, y = *(const unsigned int *)b;

	return x < y ? -1 : x > y;
}

int grace_creds_format(unsigned int egid, const unsigned int *groups, size_t n, char *buf,
		       size_t len)
{
	unsigned int *sorted;
	size_t used, i, m = 0;

	sorted = calloc(n + 1, sizeof(*sorted));
	if (sorted == NULL)
		return -1;
	if (n)
		memcpy(sorted, groups, n * sizeof(*sorted));
	qsort(sorted, n, sizeof(sorted[0]), grace_cmp_uint);
	used = (size_t)snprintf(buf, len, "%u:", egid);
	for (i = 0; i < n && used < len; i++) {
		if (i > 0 && sorted[i] == sorted[i - 1])
			continue;
		used += (size_t)snprintf(buf + used, len - used, "%s%u", m++ ? "," : "", sorted[i]);
	}
	free(sorted);
	return used < len ? 0 : -1;
}

int grace_wraps_an_image(const char *argv0)
{
	static const char *const names[] = GRACE_IMAGE_WRAPPERS;
	const char *base;
	size_t i;

	if (argv0 == NULL)
		return 0;
	base = strrchr(argv0, '/');
	base = base ? base + 1 : argv0;
	for (i = 0; names[i] != NULL; i++)
		if (strcmp(base, names[i]) == 0)
			return 1;
	return 0;
}

const char *grace_python_failure(const char *name)
{
#define GRACE_IS(kind)                      \
	if (name != NULL && strcmp(name, kind) == 0) \
		return kind;
	GRACE_PYTHON_FAILURES(GRACE_IS)
#undef GRACE_IS
	return NULL;
}
