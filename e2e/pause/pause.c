/*
 * The pod sandbox ("pause") process of the local cluster: it holds the pod's namespaces, reaps
 * the zombies of processes that end up re-parented to it (it is PID 1 of a pod that shares its
 * PID namespace), and exits cleanly on SIGINT/SIGTERM. Built with `gcc -static` by
 * `cargo xtask cluster up` into an image FROM scratch, so it must not need anything at run time.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) {
	/* Exit status 0 on a requested stop, like upstream pause, so runtimes do not log a failure. */
	(void)sig;
	_exit(0);
}

static void on_child(int sig) {
	(void)sig;
	int saved = errno;
	while (waitpid(-1, NULL, WNOHANG) > 0) {
	}
	errno = saved;
}

int main(int argc, char **argv) {
	if (argc > 1 && strcmp(argv[1], "-v") == 0) {
		puts("kubevirt-rs pause 1");
		return 0;
	}
	if (getpid() != 1) {
		/* Not fatal: it still holds the namespaces, but zombies elsewhere are not ours to reap. */
		fprintf(stderr, "pause: warning: not running as PID 1\n");
	}
	struct sigaction stop = {.sa_handler = on_stop};
	sigemptyset(&stop.sa_mask);
	sigaction(SIGINT, &stop, NULL);
	sigaction(SIGTERM, &stop, NULL);
	struct sigaction child = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
	sigemptyset(&child.sa_mask);
	sigaction(SIGCHLD, &child, NULL);
	for (;;) {
		pause();
	}
}
