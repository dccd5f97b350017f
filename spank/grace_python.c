/*
 * grace-policy: the embedded interpreter.
 *
 * This file is not compiled on its own: spank/build_plugin.py hands it to
 * cffi's set_source(), so it lands in the generated file after cffi's
 * embedding support and can call the static cffi_start_python(). That file
 * is the Python part of the plugin, grace_policy_py.so (the only library
 * with libpython as DT_NEEDED), dlopen()ed on a cache miss in the check's
 * helper process (grace_helper.c), never in slurmstepd itself.
 *
 * Why we start Python ourselves instead of letting cffi do it: cffi calls
 * Py_InitializeEx(0), which reads PYTHONPATH/PYTHONHOME from the *user's*
 * step environment, imports site (user site-packages included) and calls
 * exit() if site fails - inside slurmstepd. An isolated PyConfig reads no
 * environment variable, imports no site, installs no signal handler and
 * searches exactly the directories we name. cffi then finds Python
 * initialised and only runs its init code.
 */
#include <dlfcn.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grace.h"
#include "grace_build.h" /* GRACE_LIBPYTHON, GRACE_PY_* (written by build_plugin.py) */

/* Python hands back the result one string at a time (cffi calls this; it
 * lives in this library so the Python part never needs to resolve a symbol
 * of the stub, which Slurm loaded RTLD_LOCAL). The stub frees it all. */
void grace_emit(void *result, int kind, const char *text)
{
	struct grace_result *r = result;
	struct grace_strlist *l = NULL;

	if (r == NULL)
		return;
	switch (kind) {
	case GRACE_EMIT_USER:
		l = &r->user;
		break;
	case GRACE_EMIT_UNSET:
		l = &r->unset;
		break;
	case GRACE_EMIT_SET:
		l = &r->set;
		break;
	case GRACE_EMIT_LOG:
		l = &r->log;
		break;
	case GRACE_EMIT_CACHE:
		if (text == NULL || r->cache != NULL)
			return;
		r->cache = strdup(text);
		if (r->cache == NULL)
			r->oom = 1;
		return;
	case GRACE_EMIT_DONE:
		r->done = 1;
		return;
	case GRACE_EMIT_PULL:
		r->pull = 1;
		return;
	case GRACE_EMIT_FAIL:
		if (text != NULL)
			snprintf(r->failure, sizeof(r->failure), "%s", text);
		return;
	default:
		return;
	}
	if (text == NULL || grace_strlist_add(l, text, strlen(text)) < 0)
		r->oom = 1;
}

/* 1: started and the cffi module is ready; -1: start failed (reason kept). */
static int grace_py_state;
static char grace_py_failure[512];

static void grace_status_text(PyStatus st, const char *what, char *err, size_t errlen)
{
	snprintf(err, errlen, "%s: %s%s%s", what, st.func ? st.func : "",
		 st.func ? ": " : "", st.err_msg ? st.err_msg : "(no message)");
}

static int grace_append_path(PyConfig *config, const char *path, char *err, size_t errlen)
{
	wchar_t *wide;
	PyStatus st;

	if (path == NULL || path[0] == '\0')
		return 0;
	wide = Py_DecodeLocale(path, NULL);
	if (wide == NULL) {
		snprintf(err, errlen, "cannot decode module path %s", path);
		return -1;
	}
	st = PyWideStringList_Append(&config->module_search_paths, wide);
	PyMem_RawFree(wide);
	if (PyStatus_Exception(st)) {
		grace_status_text(st, "module path", err, errlen);
		return -1;
	}
	return 0;
}

/* Append each entry of a ':'-separated list. */
static int grace_append_path_list(PyConfig *config, const char *list, char *err, size_t errlen)
{
	char buf[4096];
	char *save = NULL;
	char *tok;

	if (list == NULL)
		return 0;
	if (strlen(list) >= sizeof(buf)) {
		snprintf(err, errlen, "python_path is too long");
		return -1;
	}
	strcpy(buf, list);
	for (tok = strtok_r(buf, ":", &save); tok; tok = strtok_r(NULL, ":", &save)) {
		if (grace_append_path(config, tok, err, errlen) < 0)
			return -1;
	}
	return 0;
}

/* The text of the pending Python exception, for slurmd's log. GIL held. */
static void grace_exception_text(const char *what, char *err, size_t errlen)
{
	PyObject *type = NULL, *value = NULL, *tb = NULL, *text = NULL;
	const char *utf8 = NULL;

	PyErr_Fetch(&type, &value, &tb);
	PyErr_NormalizeException(&type, &value, &tb);
	if (value != NULL)
		text = PyObject_Repr(value);
	if (text != NULL)
		utf8 = PyUnicode_AsUTF8(text);
	snprintf(err, errlen, "%s: %s", what, utf8 ? utf8 : "unknown Python error");
	PyErr_Clear();
	Py_XDECREF(text);
	Py_XDECREF(type);
	Py_XDECREF(value);
	Py_XDECREF(tb);
}

static int grace_python_start(const struct grace_context *ctx, char *err, size_t errlen)
{
	PyPreConfig preconfig;
	PyConfig config;
	PyStatus st;
	PyGILState_STATE gil;
	PyObject *backend;
	char pkgdir[sizeof(ctx->plugin_dir) + 32];

	/*
	 * Slurm dlopen()s plugins RTLD_LOCAL. The stub loads this library
	 * RTLD_GLOBAL, but make sure libpython (our DT_NEEDED) is visible to the
	 * extension modules Python loads later (_cffi_backend, the lib-dynload
	 * modules): they would fail with "undefined symbol: PyExc_..." and cffi
	 * would return 0 from our function. Promote it to global.
	 */
	if (dlopen(GRACE_LIBPYTHON, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD) == NULL) {
		const char *why = dlerror();

		snprintf(err, errlen, "cannot make %s global: %s", GRACE_LIBPYTHON,
			 why ? why : "not loaded");
		return -1;
	}
	if (Py_IsInitialized()) {
		snprintf(err, errlen, "an interpreter is already running in this process; "
			 "refusing to share it");
		return -1;
	}

	/* UTF-8 mode: paths and env values decode the same whatever the
	 * step's locale; isolated preconfig leaves the process locale alone. */
	PyPreConfig_InitIsolatedConfig(&preconfig);
	preconfig.utf8_mode = 1;
	st = Py_PreInitialize(&preconfig);
	if (PyStatus_Exception(st)) {
		grace_status_text(st, "Python pre-initialisation failed", err, errlen);
		return -1;
	}

	PyConfig_InitIsolatedConfig(&config);
	config.site_import = 0;
	config.user_site_directory = 0;
	config.use_environment = 0;
	config.install_signal_handlers = 0;
	config.write_bytecode = 0; /* the install dir is not the user's to write */
	config.pathconfig_warnings = 0;
	config.parse_argv = 0;
	config.faulthandler = 0;
	config.module_search_paths_set = 1;
	st = PyConfig_SetBytesString(&config, &config.home, GRACE_PY_HOME);
	if (!PyStatus_Exception(st))
		st = PyConfig_SetBytesString(&config, &config.program_name, GRACE_PY_EXECUTABLE);
	if (PyStatus_Exception(st)) {
		grace_status_text(st, "Python config", err, errlen);
		goto fail_config;
	}
	snprintf(pkgdir, sizeof(pkgdir), "%s/../grace-policy/python", ctx->plugin_dir);
	if (grace_append_path(&config, GRACE_PY_STDLIB, err, errlen) < 0 ||
	    grace_append_path(&config, GRACE_PY_DYNLOAD, err, errlen) < 0 ||
	    grace_append_path_list(&config, ctx->python_path, err, errlen) < 0 ||
	    grace_append_path(&config, pkgdir, err, errlen) < 0)
		goto fail_config;

	st = Py_InitializeFromConfig(&config);
	PyConfig_Clear(&config);
	if (PyStatus_Exception(st)) {
		/* Includes PyStatus_IsExit: we never pass it to exit(). */
		grace_status_text(st, "Python initialisation failed", err, errlen);
		return -1;
	}
	/* Py_InitializeFromConfig leaves us holding the GIL; cffi's entry
	 * points take it with PyGILState_Ensure, so hand it back. */
	PyEval_SaveThread();

	/* cffi's own start-up prints its errors to stderr, which is /dev/null
	 * in slurmstepd; import the backend first to get a reason we can log. */
	gil = PyGILState_Ensure();
	backend = PyImport_ImportModule("_cffi_backend");
	if (backend == NULL)
		grace_exception_text("cannot import _cffi_backend", err, errlen);
	Py_XDECREF(backend);
	PyGILState_Release(gil);
	if (backend == NULL)
		return -1;

	if (cffi_start_python() != 0) {
		snprintf(err, errlen, "cffi could not set up the embedded module "
			 "(its init code failed)");
		return -1;
	}
	return 0;

fail_config:
	PyConfig_Clear(&config);
	return -1;
}

/* 1 if fd has something to read (the step has come, or EOF). */
static int grace_readable(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return fd >= 0 && poll(&p, 1, 0) > 0;
}

/*
 * The pre-started helper (grace_helper.c) calls us with no step while
 * slurmstepd is still setting up: import what a miss needs, one module of
 * slurm_bridge.PRELOAD at a time (modules only: no config, no user file), and
 * stop as soon as the step arrives on ctx->preload_fd - the check imports
 * what it still lacks itself, so this only moves work off the critical path
 * and never adds to it. Errors are ignored: the check reports them.
 */
static void grace_python_preload(const struct grace_context *ctx)
{
	PyGILState_STATE gil;
	PyObject *bridge, *names;
	Py_ssize_t i, n;

	if (grace_readable(ctx->preload_fd))
		return;
	gil = PyGILState_Ensure();
	bridge = PyImport_ImportModule("grace_policy.slurm_bridge");
	names = bridge ? PyObject_GetAttrString(bridge, "PRELOAD") : NULL;
	n = names && PyTuple_Check(names) ? PyTuple_GET_SIZE(names) : 0;
	for (i = 0; i < n && !grace_readable(ctx->preload_fd); i++) {
		PyObject *mod = PyImport_Import(PyTuple_GET_ITEM(names, i));

		Py_XDECREF(mod);
	}
	PyErr_Clear();
	Py_XDECREF(names);
	Py_XDECREF(bridge);
	PyGILState_Release(gil);
}

/* The only symbol this library exports (grace_policy_py.map). With step
 * NULL: start the interpreter and preload, decide nothing. */
int grace_python_check(const struct grace_context *ctx, const struct grace_step *step,
		       char *err, size_t errlen)
{
	if (grace_py_state == 0) {
		if (grace_python_start(ctx, grace_py_failure, sizeof(grace_py_failure)) == 0)
			grace_py_state = 1;
		else
			grace_py_state = -1;
	}
	if (grace_py_state < 0) {
		snprintf(err, errlen, "%s", grace_py_failure);
		return -1;
	}
	if (step == NULL) {
		grace_python_preload(ctx);
		return 0;
	}
	return grace_py_decide(step);
}
