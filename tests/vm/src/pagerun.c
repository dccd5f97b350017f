/* pagerun: runs the page oracle's cases inside the VM and reports what happened.
 *
 * Input (argv[1]): one case a line, fields separated by tabs:
 *     ID  MODE  ENV  ARG0  [ARG...]
 * MODE "exec" runs execve(ARG0, ARG0 ARG..., env) in a child; "dlopen" makes
 * the child dlopen(ARG0, RTLD_LAZY) and print dlerror()'s text. ENV is "-" or
 * one NAME=VALUE added to PATH=/usr/bin:/bin.
 *
 * Output (stdout, the virtio console): one line a case,
 *     R  ID  HOW  VALUE  STDOUT  STDERR
 * HOW is exit (VALUE = status), signal (VALUE = signal number), errno (execve
 * failed in the child, VALUE = errno) or timeout. Output fields are cut at
 * 2 KiB and escaped (\\, \t, \n) so one case is one line. A last line "END"
 * tells the host that nothing was lost.
 *
 * Built against the oldest userland's glibc so one binary runs in every root.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CAP 2048
#define CASE_SECONDS 20

static void put_escaped(const char *buf, size_t len) {
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)buf[i];
        if (c == '\\') fputs("\\\\", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c == '\n') fputs("\\n", stdout);
        else if (c < 32 || c == 127) printf("\\x%02x", c);
        else putchar(c);
    }
}

static size_t slurp(const char *path, char *buf) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, CAP);
    close(fd);
    return n > 0 ? (size_t)n : 0;
}

static volatile sig_atomic_t timed_out;
static void on_alarm(int sig) { (void)sig; timed_out = 1; }

static void run_case(char *line) {
    char *fields[64];
    int n = 0;
    for (char *tok = strtok(line, "\t"); tok && n < 63; tok = strtok(NULL, "\t"))
        fields[n++] = tok;
    fields[n] = NULL;
    if (n < 4) return;
    const char *id = fields[0], *mode = fields[1], *extra = fields[2];
    char *env[3] = {"PATH=/usr/bin:/bin", NULL, NULL};
    if (strcmp(extra, "-") != 0) env[1] = (char *)extra;

    int errpipe[2];
    if (pipe2(errpipe, O_CLOEXEC) != 0) { perror("pipe2"); return; }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int in = open("/dev/null", O_RDONLY);
        int out = open("/tmp/pagerun.out", O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int err = open("/tmp/pagerun.err", O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(in, 0); dup2(out, 1); dup2(err, 2);
        if (strcmp(mode, "dlopen") == 0) {
            void *h = dlopen(fields[3], RTLD_LAZY | RTLD_LOCAL);
            if (h) { puts("DLOPEN-OK"); _exit(0); }
            printf("DLOPEN-ERR:%s\n", dlerror());
            _exit(1);
        }
        execve(fields[3], &fields[3], env);
        int e = errno;
        if (write(errpipe[1], &e, sizeof e) < 0) _exit(126);
        _exit(127);
    }
    close(errpipe[1]);
    int status = 0, child_errno = 0;
    timed_out = 0;
    alarm(CASE_SECONDS);
    while (waitpid(pid, &status, 0) < 0) {
        if (errno == EINTR && timed_out) { kill(pid, SIGKILL); }
        else if (errno != EINTR) break;
    }
    alarm(0);
    ssize_t got = read(errpipe[0], &child_errno, sizeof child_errno);
    close(errpipe[0]);

    char out[CAP], err[CAP];
    size_t out_n = slurp("/tmp/pagerun.out", out), err_n = slurp("/tmp/pagerun.err", err);
    printf("R\t%s\t", id);
    if (timed_out) printf("timeout\t%d", CASE_SECONDS);
    else if (got == (ssize_t)sizeof child_errno) printf("errno\t%d", child_errno);
    else if (WIFSIGNALED(status)) printf("signal\t%d", WTERMSIG(status));
    else printf("exit\t%d", WEXITSTATUS(status));
    putchar('\t');
    put_escaped(out, out_n);
    putchar('\t');
    put_escaped(err, err_n);
    putchar('\n');
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: pagerun CASES\n"); return 64; }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, NULL);
    FILE *f = fopen(argv[1], "r");
    if (!f) { perror(argv[1]); return 66; }
    char line[8192];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        if (line[0]) run_case(line);
    }
    fclose(f);
    puts("END");
    fflush(stdout);
    return 0;
}
