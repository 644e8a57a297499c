/* An OpenMP program that forks: every team thread prints its binding (omp_display_affinity), then a fork()ed
 * child prints its mask and, with argument "team", runs a team of its own (libgomp hangs there: its thread pool
 * is not fork-safe), and the parent prints the child's exit status. One "key=value" line per fact. */
#define _GNU_SOURCE
#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void print_mask(const char *who) {
    cpu_set_t set;
    CPU_ZERO(&set);
    sched_getaffinity(0, sizeof set, &set);
    printf("%s=", who);
    int first = 1;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set)) { printf(first ? "%d" : ",%d", c); first = 0; }
    printf("\n");
    fflush(stdout);
}

static double team(void) {
    double total = 0.0;
#pragma omp parallel reduction(+ : total)
    {
        for (long i = 0; i < 20000000; i++) total += (double)i * 1e-9;
#pragma omp critical
        {
            omp_display_affinity(NULL);
            fflush(stdout);
        }
    }
    return total;
}

int main(int argc, char **argv) {
    double total = team();
    print_mask("main");
    pid_t pid = fork();
    if (pid == 0) {
        print_mask("forked");
        if (argc > 1 && strcmp(argv[1], "team") == 0) { /* libgomp hangs here: its pool is not fork-safe */
            printf("forked_team\n");
            fflush(stdout);
            total += team();
            print_mask("forked_after_team");
        }
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    printf("forked_status=%d\n", status);
    fflush(stdout);
    printf("threads=%d total=%.3f\n", omp_get_max_threads(), total > 0);
    return 0;
}
