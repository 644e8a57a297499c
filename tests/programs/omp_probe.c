/* A small OpenMP program: every thread does a little work and prints its binding as the runtime sees it
 * (omp_display_affinity uses the same format as OMP_DISPLAY_AFFINITY=true, and also reports a team of one). */
#include <omp.h>
#include <stdio.h>

int main(void) {
    double total = 0.0;
#pragma omp parallel reduction(+ : total)
    {
        for (long i = 0; i < 2000000; i++) total += (double)i * 1e-9;
#pragma omp critical
        {
            omp_display_affinity(NULL);
            fflush(stdout);
        }
    }
    printf("threads=%d total=%.3f\n", omp_get_max_threads(), total);
    return 0;
}
