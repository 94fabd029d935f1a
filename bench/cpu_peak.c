/* The f32 FMA peak of this machine's cores (bench/cpu_peak.py compiles and runs it).

   Each thread runs CHAINS independent chains of fused multiply-adds on AVX-512 (16 f32 lanes)
   or AVX2 (8 lanes) registers, so no instruction waits on the one before it: the core's FMA
   units are the only limit. A thread's GFLOP/s is its FLOPs over its own CPU time
   (CLOCK_THREAD_CPUTIME_ID), so time the OS gives to other processes is not counted (the
   peak of a core while it runs this thread, on a busy machine too); the whole run's GFLOP/s
   is every thread's FLOPs over the wall time. With avx512_bf16, the same for vdpbf16ps (a bf16
   dot product of pairs into f32 lanes: 64 FLOPs an instruction).

   usage: cpu_peak ISA THREADS MILLIONS   (ISA: avx512 | avx2 | bf16; MILLIONS of loop turns)
   prints one line: ISA THREADS WALL_GFLOPS THREAD_GFLOPS...                                  */

#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHAINS 16 /* above latency (4) x FMA units (2) on current cores, and within 32 registers */

typedef struct {
    const char* isa;
    long turns;
    double flops;
    double seconds;
    float sink;
} job;

static double clock_of(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#ifdef __AVX512F__
static float run_avx512(long turns, float seed) {
    __m512 acc[CHAINS];
    for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_set1_ps(seed + (float)c);
    /* a*x + b with a just under 1 and b small keeps every lane finite for any number of turns */
    const __m512 a = _mm512_set1_ps(0.999999f * seed), b = _mm512_set1_ps(1e-7f);
    for (long i = 0; i < turns; i++) {
        for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
    }
    __m512 sum = acc[0];
    for (int c = 1; c < CHAINS; c++) sum = _mm512_add_ps(sum, acc[c]);
    return _mm512_reduce_add_ps(sum);
}
#endif

#ifdef __AVX512BF16__
static float run_bf16(long turns, float seed) {
    __m512 acc[CHAINS];
    for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_set1_ps(seed + (float)c);
    const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f * seed), _mm512_set1_ps(1e-3f));
    const __m512bh x = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f * seed));
    for (long i = 0; i < turns; i++) {
        for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_dpbf16_ps(acc[c], a, x);
    }
    __m512 sum = acc[0];
    for (int c = 1; c < CHAINS; c++) sum = _mm512_add_ps(sum, acc[c]);
    return _mm512_reduce_add_ps(sum);
}
#endif

#ifdef __AVX2__
static float run_avx2(long turns, float seed) {
    __m256 acc[CHAINS];
    for (int c = 0; c < CHAINS; c++) acc[c] = _mm256_set1_ps(seed + (float)c);
    const __m256 a = _mm256_set1_ps(0.999999f * seed), b = _mm256_set1_ps(1e-7f);
    for (long i = 0; i < turns; i++) {
        for (int c = 0; c < CHAINS; c++) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
    }
    __m256 sum = acc[0];
    for (int c = 1; c < CHAINS; c++) sum = _mm256_add_ps(sum, acc[c]);
    float lanes[8];
    _mm256_storeu_ps(lanes, sum);
    return lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] + lanes[7];
}
#endif

/* FLOPs of one loop turn: CHAINS instructions of LANES lanes, 2 FLOPs a lane (4 for a bf16 pair) */
static double turn_flops(const char* isa) {
    if (strcmp(isa, "avx512") == 0) return CHAINS * 16 * 2.0;
    if (strcmp(isa, "bf16") == 0) return CHAINS * 32 * 2.0;
    if (strcmp(isa, "avx2") == 0) return CHAINS * 8 * 2.0;
    return 0.0;
}

static int supported(const char* isa) {
#ifdef __AVX512F__
    if (strcmp(isa, "avx512") == 0) return 1;
#endif
#ifdef __AVX512BF16__
    if (strcmp(isa, "bf16") == 0) return 1;
#endif
#ifdef __AVX2__
    if (strcmp(isa, "avx2") == 0) return 1;
#endif
    return 0;
}

static void* work(void* arg) {
    job* j = (job*)arg;
    volatile float seed = 1.0f; /* not a constant the compiler could fold the chains with */
    double start = clock_of(CLOCK_THREAD_CPUTIME_ID);
    float sink = 0.0f;
#ifdef __AVX512F__
    if (strcmp(j->isa, "avx512") == 0) sink = run_avx512(j->turns, seed);
#endif
#ifdef __AVX512BF16__
    if (strcmp(j->isa, "bf16") == 0) sink = run_bf16(j->turns, seed);
#endif
#ifdef __AVX2__
    if (strcmp(j->isa, "avx2") == 0) sink = run_avx2(j->turns, seed);
#endif
    j->seconds = clock_of(CLOCK_THREAD_CPUTIME_ID) - start;
    j->flops = turn_flops(j->isa) * (double)j->turns;
    j->sink = sink;
    return NULL;
}

int main(int argc, char** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s avx512|avx2|bf16 THREADS MILLIONS\n", argv[0]);
        return 2;
    }
    const char* isa = argv[1];
    int threads = atoi(argv[2]);
    long turns = (long)(atof(argv[3]) * 1e6);
    if (!supported(isa)) {
        printf("%s unsupported\n", isa);
        return 0;
    }
    if (threads < 1 || threads > 256 || turns < 1) {
        fprintf(stderr, "THREADS must be 1 to 256 and MILLIONS positive\n");
        return 2;
    }
    job jobs[256];
    pthread_t ids[256];
    double start = clock_of(CLOCK_MONOTONIC);
    for (int t = 0; t < threads; t++) {
        jobs[t] = (job){isa, turns, 0.0, 0.0, 0.0f};
        pthread_create(&ids[t], NULL, work, &jobs[t]);
    }
    double flops = 0.0;
    float sink = 0.0f;
    for (int t = 0; t < threads; t++) {
        pthread_join(ids[t], NULL);
        flops += jobs[t].flops;
        sink += jobs[t].sink;
    }
    double wall = clock_of(CLOCK_MONOTONIC) - start;
    printf("%s %d %.3f", isa, threads, flops / wall / 1e9);
    for (int t = 0; t < threads; t++) printf(" %.3f", jobs[t].flops / jobs[t].seconds / 1e9);
    printf("\n");
    return sink != sink ? 1 : 0; /* a NaN sum means the chains overflowed: the figures are suspect */
}
