/*
 * mpi_grads: Open MPI's side of hvd-bench-grads (bench/hvd_grad_bench.c),
 * run by bench/compare_grads.sh.
 *
 *   mpirun ... mpi_grads steps [-n STEPS] [-w WARMUP] [-c 0|1]
 *   mpirun ... mpi_grads latency [-n OPS] [-w WARMUP] [-c 0|1]
 *
 * DESIGN. `steps`: each step runs two timed sections, like hvd-bench-grads:
 * "per_tensor" is one MPI_Allreduce (float32, MPI_SUM, out-of-place) per
 * ResNet-50 gradient tensor (bench/resnet50_params.h: 161 tensors,
 * 25,557,032 values), one after another in table order, no fusion, the
 * way a framework without a coordinator would; "single" is one
 * MPI_Allreduce of all 25,557,032 values as one buffer. Every section
 * starts after an untimed MPI_Barrier. `latency`: one MPI_Allreduce of one
 * float (4 B), back to back, each op timed on its own. Each rank keeps its
 * own times; after the loop one MPI_Allreduce(MPI_MAX) over the sample
 * array makes them the slowest rank's time per step (or op), and rank 0
 * prints mean, median, p10, p90, min and max over them, in the format of
 * hvd-bench-grads (case, samples, mean, median, p10, p90, min, max, unit,
 * #wrong).
 *
 * Inputs are the same small integers as hvd-bench-grads'; with -c 1 (the
 * default) the outputs of the first warmup step and of one untimed step
 * after the loop (outputs zeroed before each) are checked in full, and
 * every latency op; #wrong is summed over ranks and makes the exit code 1.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "resnet50_params.h"

enum mode { STEPS, LATENCY };

struct opts {
    enum mode mode;
    long iters, warmup;
    int check;
};

static void usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s steps|latency [-n ITERS] [-w WARMUP] [-c 0|1]\n"
            "  steps: 161 ResNet-50 MPI_Allreduces one after another, then one of all\n"
            "         25,557,032 floats; -n timed steps (default 20), -w warmup (default 3)\n"
            "  latency: one 4-byte MPI_Allreduce per op; -n ops (default 5000), -w (default 500)\n"
            "  -c 1 (default) checks results\n",
            argv0);
}

static int parse_long(const char *s, long min, long *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || v < min || v > 1000000)
        return -1;
    *out = v;
    return 0;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
    int c;
    long check = 1, iters = -1, warmup = -1;

    if (argc < 2)
        return -1;
    if (strcmp(argv[1], "steps") == 0)
        o->mode = STEPS;
    else if (strcmp(argv[1], "latency") == 0)
        o->mode = LATENCY;
    else
        return -1;
    optind = 2;
    while ((c = getopt(argc, argv, "n:w:c:h")) != -1) {
        switch (c) {
        case 'n': if (parse_long(optarg, 1, &iters)) return -1; break;
        case 'w': if (parse_long(optarg, 0, &warmup)) return -1; break;
        case 'c': if (parse_long(optarg, 0, &check) || check > 1) return -1; break;
        default: return -1;
        }
    }
    if (optind < argc)
        return -1;
    o->iters = iters >= 0 ? iters : o->mode == STEPS ? 20 : 5000;
    o->warmup = warmup >= 0 ? warmup : o->mode == STEPS ? 3 : 500;
    o->check = (int)check;
    if (o->check && o->mode == STEPS && o->warmup == 0)
        return -1;
    return 0;
}

/* The same pattern as hvd-bench-grads: tensor -1 is the single buffer. */
static float value(int rank, int tensor, long j)
{
    return (float)((rank * 3 + (tensor + 1) * 7 + (int)(j % 8191)) % 5 + 1);
}

static int compare_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double quantile(const double *v, long n, double q)
{
    double pos = q * (double)(n - 1);
    long lo = (long)floor(pos);
    long hi = lo + 1 < n ? lo + 1 : lo;
    return v[lo] + (v[hi] - v[lo]) * (pos - (double)lo);
}

/* Max over ranks per sample, then rank 0 prints a data line. */
static void report(int rank, const char *name, double *v, long n, double scale, const char *unit,
                   long wrong, int samples)
{
    double sum = 0;
    MPI_Allreduce(MPI_IN_PLACE, v, (int)n, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank != 0)
        return;
    if (samples) {
        printf("# samples %s (%s, in step order):", name, unit);
        for (long i = 0; i < n; i++)
            printf(" %.4g", v[i] * scale);
        printf("\n");
    }
    for (long i = 0; i < n; i++)
        sum += v[i];
    qsort(v, (size_t)n, sizeof(double), compare_double);
    printf("  %-10s %7ld %11.3f %11.3f %11.3f %11.3f %11.3f %11.3f %4s %7ld\n", name, n,
           sum / (double)n * scale, quantile(v, n, 0.5) * scale, quantile(v, n, 0.1) * scale,
           quantile(v, n, 0.9) * scale, v[0] * scale, v[n - 1] * scale, unit, wrong);
    fflush(stdout);
}

static long count_wrong(const float *got, int tensor, long count, int nranks)
{
    long wrong = 0;
    for (long j = 0; j < count; j++) {
        float want = 0;
        for (int r = 0; r < nranks; r++)
            want += value(r, tensor, j);
        wrong += got[j] != want;
    }
    return wrong;
}

struct bufs {
    float *in[RESNET50_TENSORS], *out[RESNET50_TENSORS];
    float *single_in, *single_out;
};

static void zero_outputs(struct bufs *b)
{
    for (int i = 0; i < RESNET50_TENSORS; i++)
        memset(b->out[i], 0, (size_t)resnet50_count(i) * sizeof(float));
    memset(b->single_out, 0, (size_t)RESNET50_VALUES * sizeof(float));
}

static long check_outputs(const struct bufs *b, int nranks)
{
    long wrong = 0;
    for (int i = 0; i < RESNET50_TENSORS; i++)
        wrong += count_wrong(b->out[i], i, (long)resnet50_count(i), nranks);
    return wrong + count_wrong(b->single_out, -1, RESNET50_VALUES, nranks);
}

/* Barrier, then the section: per_tensor (which = 0) or single (1). */
static double section(struct bufs *b, int which)
{
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    if (which == 0) {
        for (int i = 0; i < RESNET50_TENSORS; i++)
            MPI_Allreduce(b->in[i], b->out[i], (int)resnet50_count(i), MPI_FLOAT, MPI_SUM,
                          MPI_COMM_WORLD);
    } else {
        MPI_Allreduce(b->single_in, b->single_out, RESNET50_VALUES, MPI_FLOAT, MPI_SUM,
                      MPI_COMM_WORLD);
    }
    return MPI_Wtime() - t0;
}

static long run_steps(const struct opts *o, int rank, int nranks, double *t_tensor,
                      double *t_single)
{
    struct bufs b;
    long wrong = 0;

    for (int i = 0; i < RESNET50_TENSORS; i++) {
        size_t n = (size_t)resnet50_count(i);
        b.in[i] = malloc(n * sizeof(float));
        b.out[i] = malloc(n * sizeof(float));
        if (b.in[i] == NULL || b.out[i] == NULL) {
            fprintf(stderr, "rank %d: malloc(%zu) failed\n", rank, n * sizeof(float));
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        for (size_t j = 0; j < n; j++)
            b.in[i][j] = value(rank, i, (long)j);
    }
    b.single_in = malloc((size_t)RESNET50_VALUES * sizeof(float));
    b.single_out = malloc((size_t)RESNET50_VALUES * sizeof(float));
    if (b.single_in == NULL || b.single_out == NULL) {
        fprintf(stderr, "rank %d: malloc(%zu) failed\n", rank,
                (size_t)RESNET50_VALUES * sizeof(float));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (long j = 0; j < RESNET50_VALUES; j++)
        b.single_in[j] = value(rank, -1, j);
    zero_outputs(&b);

    for (long s = 0; s < o->warmup + o->iters; s++) {
        double tt = section(&b, 0), ts = section(&b, 1);
        if (s >= o->warmup) {
            t_tensor[s - o->warmup] = tt;
            t_single[s - o->warmup] = ts;
        }
        if (s == 0 && o->check)
            wrong += check_outputs(&b, nranks);
    }
    if (o->check) {
        zero_outputs(&b);
        section(&b, 0);
        section(&b, 1);
        wrong += check_outputs(&b, nranks);
    }
    for (int i = 0; i < RESNET50_TENSORS; i++) {
        free(b.in[i]);
        free(b.out[i]);
    }
    free(b.single_in);
    free(b.single_out);
    return wrong;
}

static long run_latency(const struct opts *o, int rank, int nranks, double *t)
{
    float in = value(rank, 0, 0), out, want = 0;
    long wrong = 0;

    for (int r = 0; r < nranks; r++)
        want += value(r, 0, 0);
    MPI_Barrier(MPI_COMM_WORLD);
    for (long i = 0; i < o->warmup + o->iters; i++) {
        out = -1;
        double t0 = MPI_Wtime();
        MPI_Allreduce(&in, &out, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if (i >= o->warmup)
            t[i - o->warmup] = MPI_Wtime() - t0;
        wrong += o->check && out != want;
    }
    return wrong;
}

int main(int argc, char **argv)
{
    struct opts o;
    int rank, nranks, exit_code = 0, version_len;
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    long wrong, wrong_total = 0, total = 0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (parse_args(argc, argv, &o)) {
        if (rank == 0)
            usage(argv[0]);
        MPI_Finalize();
        return 2;
    }
    for (int i = 0; i < RESNET50_TENSORS; i++)
        total += (long)resnet50_count(i);
    if (total != RESNET50_VALUES) {
        if (rank == 0)
            fprintf(stderr, "mpi_grads: the ResNet-50 table sums to %ld values, not %d\n", total,
                    RESNET50_VALUES);
        MPI_Finalize();
        return 1;
    }
    double *t1 = calloc((size_t)o.iters, sizeof(double));
    double *t2 = calloc((size_t)o.iters, sizeof(double));
    if (t1 == NULL || t2 == NULL) {
        fprintf(stderr, "rank %d: cannot allocate %ld samples\n", rank, o.iters);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Get_library_version(version, &version_len);
    version[strcspn(version, ",\n")] = '\0';
    if (rank == 0) {
        printf("# mpi_grads %s: %s, np=%d, %ld warmup, %ld timed, check %d\n",
               o.mode == STEPS ? "steps" : "latency", version, nranks, o.warmup, o.iters, o.check);
        if (o.mode == STEPS)
            printf("# per_tensor: %d MPI_Allreduce float32 MPI_SUM out-of-place, one per ResNet-50 "
                   "tensor in table order; single: one MPI_Allreduce of %d floats\n",
                   RESNET50_TENSORS, RESNET50_VALUES);
        else
            printf("# latency: one MPI_Allreduce of 1 float (4 B), back to back\n");
        printf("# time: per step (or op) after an MPI_Barrier (steps), max over ranks per sample "
               "(one MPI_MAX allreduce after the loop)\n");
        printf("# %-10s %7s %11s %11s %11s %11s %11s %11s %4s %7s\n", "case", "samples", "mean",
               "median", "p10", "p90", "min", "max", "unit", "#wrong");
        fflush(stdout);
    }
    if (o.mode == STEPS)
        wrong = run_steps(&o, rank, nranks, t1, t2);
    else
        wrong = run_latency(&o, rank, nranks, t1);
    MPI_Allreduce(&wrong, &wrong_total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (o.mode == STEPS) {
        report(rank, "per_tensor", t1, o.iters, 1e3, "ms", wrong_total, 1);
        report(rank, "single", t2, o.iters, 1e3, "ms", wrong_total, 1);
    } else {
        report(rank, "latency", t1, o.iters, 1e6, "us", wrong_total, 0);
    }
    if (wrong_total != 0)
        exit_code = 1;
    if (rank == 0) {
        printf("# %s\n", !o.check ? "results not checked (-c 0)"
                         : exit_code ? "FAILED: wrong elements"
                                     : "all results verified");
        fflush(stdout);
    }
    free(t1);
    free(t2);
    MPI_Finalize();
    return exit_code;
}
