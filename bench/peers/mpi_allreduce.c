/*
 * mpi_allreduce: Open MPI's MPI_Allreduce (float32, MPI_SUM, out-of-place),
 * the peer that bench/compare_allreduce.sh sets beside hvd-bench; with -C
 * allgather or -C broadcast, MPI_Allgather or MPI_Bcast (root 0) instead
 * (bench/compare_shm.sh). As in nccl-tests and hvd-bench, an allgather's
 * size is its whole output (each rank gives SIZE/N), and busbw uses
 * nccl-tests' factors ((N-1)/N for allgather, 1 for broadcast).
 *
 * DESIGN. For each size: every rank fills its input with rank+1 and runs one
 * allreduce whose output is checked (each element must be N(N+1)/2), then
 * the rest of the warmup. Unless -n fixes the count, a calibration loop
 * doubles a batch of ops until a batch takes at least target/8 (the batch
 * time is the max over ranks, so all ranks agree) and sizes the timed run to
 * about `target` seconds, at least 3 ops. The timed run starts after an
 * MPI_Barrier; each rank takes MPI_Wtime around the whole batch and rank 0
 * reports the max over ranks (MPI_Reduce) divided by the op count. The
 * output of the last timed op is checked again. #wrong is the number of
 * wrong elements over both checks, summed over ranks.
 *
 * Output: nccl-tests columns (see bench/peers/README.md), one line per size,
 * printed by rank 0; everything else is a '#' comment.
 */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_SIZES 64
#define MIN_ITERS 3

enum coll { ALLREDUCE, ALLGATHER, BROADCAST };

struct opts {
    enum coll coll;
    size_t sizes[MAX_SIZES];
    int nsizes;
    long iters;  /* 0: sized to target */
    long warmup; /* at least 1: the first op is the checked one */
    double target;
};

/* "64M" -> 67108864 (K/M/G are powers of 1024, as in nccl-tests). */
static int parse_size(const char *s, size_t *out)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s)
        return -1;
    switch (*end) {
    case 'K': case 'k': v <<= 10; end++; break;
    case 'M': case 'm': v <<= 20; end++; break;
    case 'G': case 'g': v <<= 30; end++; break;
    default: break;
    }
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end != '\0')
        return -1;
    *out = (size_t)v;
    return 0;
}

static void usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [-C allreduce|allgather|broadcast] [-b MIN -e MAX -f FACTOR | SIZE...]\n"
            "          [-n ITERS] [-w WARMUP] [-t SECONDS]\n"
            "  sizes in bytes, K/M/G suffixes (1024-based); -n 0 (default) sizes each\n"
            "  timed run to about -t seconds (default 0.4); -w default 5\n",
            argv0);
}

static int parse_args(int argc, char **argv, struct opts *o)
{
    size_t b = 0, e = 0;
    unsigned long f = 2;
    int c, have_range = 0;

    o->coll = ALLREDUCE;
    o->nsizes = 0;
    o->iters = 0;
    o->warmup = 5;
    o->target = 0.4;
    while ((c = getopt(argc, argv, "C:b:e:f:n:w:t:c:h")) != -1) {
        switch (c) {
        case 'C':
            if (strcmp(optarg, "allreduce") == 0)
                o->coll = ALLREDUCE;
            else if (strcmp(optarg, "allgather") == 0)
                o->coll = ALLGATHER;
            else if (strcmp(optarg, "broadcast") == 0)
                o->coll = BROADCAST;
            else
                return -1;
            break;
        case 'b': if (parse_size(optarg, &b)) return -1; have_range = 1; break;
        case 'e': if (parse_size(optarg, &e)) return -1; have_range = 1; break;
        case 'f': f = strtoul(optarg, NULL, 10); break;
        case 'n': o->iters = atol(optarg); break;
        case 'w': o->warmup = atol(optarg); break;
        case 't': o->target = atof(optarg); break;
        case 'c': break; /* nccl-tests' check flag: we always check */
        default: return -1;
        }
    }
    if (have_range) {
        if (b == 0 || e < b || f < 2)
            return -1;
        for (size_t s = b; s <= e && o->nsizes < MAX_SIZES; s *= f)
            o->sizes[o->nsizes++] = s;
    }
    for (int i = optind; i < argc; i++) {
        if (o->nsizes == MAX_SIZES || parse_size(argv[i], &o->sizes[o->nsizes]))
            return -1;
        o->nsizes++;
    }
    if (o->nsizes == 0 || o->iters < 0 || o->target <= 0)
        return -1;
    if (o->warmup < 1)
        o->warmup = 1;
    return 0;
}

static enum coll coll;

static void run_ops(const float *in, float *out, int count, long n)
{
    /* MPI_ERRORS_ARE_FATAL (the default) ends the job on any error. */
    for (long i = 0; i < n; i++) {
        if (coll == ALLGATHER)
            MPI_Allgather(in, count, MPI_FLOAT, out, count, MPI_FLOAT, MPI_COMM_WORLD);
        else if (coll == BROADCAST)
            MPI_Bcast(out, count, MPI_FLOAT, 0, MPI_COMM_WORLD);
        else
            MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
}

/* Allreduce: every element N(N+1)/2; allgather: rank r's block r+1;
 * broadcast: root 0's 1. */
static long count_wrong(const float *out, int count, int nranks)
{
    long wrong = 0;
    if (coll == ALLGATHER) {
        for (long i = 0; i < (long)count * nranks; i++)
            wrong += out[i] != (float)(i / count + 1);
        return wrong;
    }
    const float want = coll == BROADCAST ? 1.0f : (float)nranks * (float)(nranks + 1) / 2.0f;
    for (int i = 0; i < count; i++)
        wrong += out[i] != want;
    return wrong;
}

static double max_all(double v)
{
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return v;
}

/* Op count for about o->target seconds, the same on every rank. */
static long calibrate(const float *in, float *out, int count, const struct opts *o)
{
    long n = 1;
    double t;

    if (o->iters > 0)
        return o->iters;
    for (;;) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        run_ops(in, out, count, n);
        t = max_all(MPI_Wtime() - t0);
        if (t >= o->target / 8 || n >= (1L << 24))
            break;
        n *= 2;
    }
    double want = o->target * (double)n / t;
    return want < MIN_ITERS ? MIN_ITERS : want > 1e8 ? 100000000L : (long)want;
}

int main(int argc, char **argv)
{
    struct opts o;
    int rank, nranks, exit_code = 0;
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int version_len;
    long iters_used[MAX_SIZES];

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (parse_args(argc, argv, &o)) {
        if (rank == 0)
            usage(argv[0]);
        MPI_Finalize();
        return 2;
    }
    coll = o.coll;
    MPI_Get_library_version(version, &version_len);
    version[strcspn(version, ",\n")] = '\0';

    if (rank == 0) {
        static const char *const what[] = {"MPI_Allreduce float32 MPI_SUM out-of-place",
                                           "MPI_Allgather float32", "MPI_Bcast float32 root 0"};
        static const char *const factor[] = {"2(N-1)/N", "(N-1)/N", "1"};
        printf("# mpi_allreduce: %s, %s, np=%d\n", version, what[coll], nranks);
        printf("# time: max over ranks of the mean time per op, us; algbw = size/time; "
               "busbw = algbw*%s; GB/s = 1e9 B/s\n", factor[coll]);
        if (o.iters > 0)
            printf("# iters: %ld per size, warmup %ld\n", o.iters, o.warmup);
        else
            printf("# iters: sized to %.2f s per size (at least %d), warmup %ld\n", o.target,
                   MIN_ITERS, o.warmup);
        printf("#%11s %13s %9s %6s %6s %11s %9s %9s %7s\n", "size", "count", "type", "redop", "root",
               "time", "algbw", "busbw", "#wrong");
        printf("#%11s %13s %9s %6s %6s %11s %9s %9s %7s\n", "(B)", "(elements)", "", "", "", "(us)",
               "(GB/s)", "(GB/s)", "");
        fflush(stdout);
    }

    for (int si = 0; si < o.nsizes; si++) {
        size_t count = o.sizes[si] / sizeof(float);
        if (coll == ALLGATHER)
            count /= (size_t)nranks;
        if (count == 0 || count > INT_MAX) {
            if (rank == 0)
                printf("# skipped size %zu: count must be 1..INT_MAX floats\n", o.sizes[si]);
            iters_used[si] = 0;
            continue;
        }
        float *in = malloc(count * sizeof(float));
        size_t out_count = coll == ALLGATHER ? count * (size_t)nranks : count;
        float *out = malloc(out_count * sizeof(float));
        if (in == NULL || out == NULL) {
            fprintf(stderr, "rank %d: malloc(%zu) failed\n", rank, count * sizeof(float));
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        for (size_t i = 0; i < count; i++)
            in[i] = (float)(rank + 1);
        /* A broadcast sends the root's output buffer. */
        for (size_t i = 0; i < out_count; i++)
            out[i] = coll == BROADCAST && rank == 0 ? 1.0f : 0.0f;

        run_ops(in, out, (int)count, 1);
        long wrong = count_wrong(out, (int)count, nranks);
        run_ops(in, out, (int)count, o.warmup - 1);
        long n = calibrate(in, out, (int)count, &o);

        if (coll != BROADCAST || rank != 0)
            memset(out, 0, out_count * sizeof(float));
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        run_ops(in, out, (int)count, n);
        double local = MPI_Wtime() - t0, tmax = 0.0;
        wrong += count_wrong(out, (int)count, nranks);

        long wrong_total = 0;
        MPI_Reduce(&local, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        MPI_Reduce(&wrong, &wrong_total, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            double us = tmax / (double)n * 1e6;
            double algbw = (double)(out_count * sizeof(float)) / (us * 1e-6) / 1e9;
            double busbw = coll == ALLREDUCE   ? algbw * 2.0 * (nranks - 1) / nranks
                           : coll == ALLGATHER ? algbw * (nranks - 1) / nranks
                                               : algbw;
            printf("%12zu %13zu %9s %6s %6d %11.2f %9.4f %9.4f %7ld\n", out_count * sizeof(float),
                   out_count, "float", coll == ALLREDUCE ? "sum" : "none", coll == BROADCAST ? 0 : -1,
                   us, algbw, busbw, wrong_total);
            fflush(stdout);
            if (wrong_total != 0)
                exit_code = 1;
        }
        iters_used[si] = n;
        free(out);
        free(in);
    }

    if (rank == 0) {
        printf("# timed ops per size:");
        for (int si = 0; si < o.nsizes; si++)
            printf(" %zu:%ld", o.sizes[si], iters_used[si]);
        printf("\n# %s\n", exit_code ? "FAILED: wrong elements" : "all results verified");
    }
    MPI_Bcast(&exit_code, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Finalize();
    return exit_code;
}
