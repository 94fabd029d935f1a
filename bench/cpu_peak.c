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

/* NAME(turns, seed): CHAINS accumulators of type VEC, each turn one STEP per chain (acc = STEP(acc)),
   then their sum's lanes added up (REDUCE), so that the compiler must compute every chain */
#define FMA_CHAINS(NAME, VEC, SET1, ADD, REDUCE, OPERANDS, STEP)                 \
    static float NAME(long turns, float seed) {                                  \
        VEC acc[CHAINS];                                                         \
        for (int c = 0; c < CHAINS; c++) acc[c] = SET1(seed + (float)c);         \
        OPERANDS;                                                                \
        for (long i = 0; i < turns; i++)                                         \
            for (int c = 0; c < CHAINS; c++) acc[c] = STEP(acc[c]);              \
        VEC sum = acc[0];                                                        \
        for (int c = 1; c < CHAINS; c++) sum = ADD(sum, acc[c]);                 \
        return REDUCE(sum);                                                      \
    }

#ifdef __AVX2__
static float lanes_of_256(__m256 v) {
    float lanes[8];
    _mm256_storeu_ps(lanes, v);
    return lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] + lanes[7];
}
#endif

/* f32 FMA chains on the registers of intrinsics prefix P (_mm512, _mm256): acc = acc*a + b,
   with a just under 1 and b small, keeps every lane finite for any number of turns */
#define F32_CHAINS(NAME, VEC, P, REDUCE)                                                          \
    FMA_CHAINS(NAME, VEC, P##_set1_ps, P##_add_ps, REDUCE,                                       \
               const VEC a = P##_set1_ps(0.999999f * seed); const VEC b = P##_set1_ps(1e-7f), \
               STEP_F32_##P)

#ifdef __AVX512F__
#define STEP_F32__mm512(x) _mm512_fmadd_ps(x, a, b)
F32_CHAINS(run_avx512, __m512, _mm512, _mm512_reduce_add_ps)
#endif

#ifdef __AVX2__
#define STEP_F32__mm256(x) _mm256_fmadd_ps(x, a, b)
F32_CHAINS(run_avx2, __m256, _mm256, lanes_of_256)
#endif

#ifdef __AVX512BF16__
/* acc + pairs of small bf16 products: grows by 2e-6 a turn */
#define STEP_BF16(x) _mm512_dpbf16_ps(x, a, b)
FMA_CHAINS(run_bf16, __m512, _mm512_set1_ps, _mm512_add_ps, _mm512_reduce_add_ps,
           const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f * seed), _mm512_set1_ps(1e-3f));
           const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f * seed)), STEP_BF16)
#endif

/* the kernels this binary was compiled for, with the FLOPs of one loop turn: CHAINS
   instructions of their lanes, 2 FLOPs a lane (a bf16 lane: a pair of products, 4) */
typedef struct {
    const char* isa;
    float (*run)(long turns, float seed);
    double turn_flops;
} kernel;

static const kernel KERNELS[] = {
#ifdef __AVX512F__
    {"avx512", run_avx512, CHAINS * 16 * 2.0},
#endif
#ifdef __AVX512BF16__
    {"bf16", run_bf16, CHAINS * 16 * 4.0},
#endif
#ifdef __AVX2__
    {"avx2", run_avx2, CHAINS * 8 * 2.0},
#endif
    {NULL, NULL, 0.0},
};

static const kernel* find(const char* isa) {
    for (const kernel* k = KERNELS; k->isa != NULL; k++)
        if (strcmp(k->isa, isa) == 0) return k;
    return NULL;
}

static void* work(void* arg) {
    job* j = (job*)arg;
    const kernel* k = find(j->isa);
    volatile float seed = 1.0f; /* not a constant the compiler could fold the chains with */
    double start = clock_of(CLOCK_THREAD_CPUTIME_ID);
    j->sink = k->run(j->turns, seed);
    j->seconds = clock_of(CLOCK_THREAD_CPUTIME_ID) - start;
    j->flops = k->turn_flops * (double)j->turns;
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
    if (find(isa) == NULL) {
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
