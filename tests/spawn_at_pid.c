/* spawn-at-pid PID PROGRAM [ARGS...]: run PROGRAM as process PID (clone3 with set_tid; root), so
 * a test can give a new process the pid of one that just exited, as the kernel does after its
 * pids wrap around. Waits for it; exits with its status (125: PID was not free). */
#define _GNU_SOURCE
#include <linux/sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char ** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: spawn-at-pid PID PROGRAM [ARGS...]\n");
        return 2;
    }
    pid_t want = (pid_t) atoi(argv[1]);
    struct clone_args args;
    memset(&args, 0, sizeof args);
    args.exit_signal = SIGCHLD;
    args.set_tid = (uint64_t) (uintptr_t) &want;
    args.set_tid_size = 1;
    long pid = syscall(SYS_clone3, &args, sizeof args);
    if (pid < 0) {
        perror("spawn-at-pid: clone3");
        return 125;
    }
    if (pid == 0) {
        execv(argv[2], argv + 2);
        perror("spawn-at-pid: execv");
        _exit(127);
    }
    int status = 0;
    if (waitpid((pid_t) pid, &status, 0) < 0) {
        return 126;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
