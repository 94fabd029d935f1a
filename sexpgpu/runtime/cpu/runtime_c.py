"""The C part of the CPU device that no program generates: the kernels' thread pool and the
tape runner, compiled once per machine (the toolchain's cache) like a kernel module.

A program's tape is the list of its steps' launches, recorded once (device.py): generated
kernels (a function over items [begin, end)) and gemms, each argument a base (0: the
program's arena; k: its k-th input) plus a byte offset. `sx_run` walks it: a kernel whose work
gives each of the pool's threads a grain (sx_shares) is split into SX_CHUNKS contiguous ranges of items per thread of the pool, which
the caller and the awake workers claim in turn (items are independent: each is one CUDA thread's, warp's or block's work, so the split
changes no bit), the others run on the calling thread; a gemm is one BLAS call per batch item
from the calling thread, with the BLAS's own threads, except a batch of f32 items too small
for the BLAS to thread (attention's per-head products), whose items the pool's threads share
as a kernel's (each item one BLAS call on one thread: the split changes no bit), and, where
the BLAS gives a piece of a product the whole product's bits (sx_pieces_exact, probed once),
a large product, whose pieces of C (a share for each thread) the pool's threads share,
each one BLAS call while the BLAS is held to one thread (device.py): OpenBLAS's own threads
spin while they wait for each other, which a busy machine turns into most of the step. The
pool's threads spin between two kernels of one stretch (for at most SX_SPINS pauses, then they sleep) and sleep on a condition
variable during a gemm and between runs, so they never compete with the BLAS's threads nor
keep a busy machine's cores from its other work; the caller waiting for them yields its core
after as long. A worker starts from the pool's first epoch, so a kernel launched before the
OS ran the new thread is still its to do.

A repeat (a step's chunks of images: `StepRun.each`) is one op followed by the ops of its
first item; each argument moves by a fixed number of bytes per item, and the step's scratch
is each thread's own (its region). Its items are the pool's: each item's kernels and gemms
run on one thread, in order, the BLAS on that thread (the BLAS is held to one thread: the
repeat's items are shared only where the pool's pieces are, sx_pieces_exact), so an image's
columns are written, multiplied and added back on the core whose cache holds them, with one
hand-off per repeat instead of one per kernel and image; without pieces the items run in
turn, each op as outside a repeat. Each item computes what it does alone: no bit changes.

bf16 gemms widen their operands to f32 into the program's workspace, call sgemm and round
the f32 product to bf16 once: what cuBLAS computes with CUBLAS_COMPUTE_32F, and what the NumPy
backend computes (into the running thread's region: a repeat's items may widen at once).
"""

RUNTIME_C = r"""
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define sx_pause() _mm_pause()
#else
#define sx_pause() ((void)0)
#endif

/* how long a thread spins before it sleeps (a worker between kernels) or yields (the caller
   waiting for the workers): about 20-50 microseconds, the gap between two kernels of a
   stretch, so a busy machine's other work gets the core back soon */
#define SX_SPINS 20000
/* chunks per thread of a kernel split between threads (claimed in turn, so a late thread takes fewer) */
#define SX_CHUNKS 4
/* multiply-adds of a gemm at most which OpenBLAS computes on the calling thread alone
   (its SMP_THRESHOLD_MIN x GEMM_MULTITHREAD_THRESHOLD): a batch of these the pool's threads share */
#define SX_SMALL_GEMM 262144LL
/* multiply-adds of an f32 gemm from which the pool's threads share it (where the BLAS gives
   a piece the bits of the whole product: sx_pieces_exact), in pieces of C's columns (or rows,
   when it has more rows), each one BLAS call on one thread: a share of each thread (sx_piece);
   the BLAS gives every piece the whole product's bits, so the count of threads changes no bit */
#define SX_SPLIT_GEMM 2097152LL

typedef void (*sx_kernel)(void* const*, long long, long long);
typedef void (*sx_sgemm64)(int, int, int, long long, long long, long long, float, const float*, long long, const float*, long long, float, float*, long long);
typedef void (*sx_sgemm32)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);

/* an argument: BASE's address (0 the arena, k the k-th input) + OFFSET + STEP bytes per item
   of a repeat; base -1: OFFSET bytes into the running thread's own region (a repeat's scratch) */
typedef struct { long long base; long long offset; long long step; } sx_ref;
typedef struct {
  long long kind;  /* 0: a kernel, 1: a gemm, 2: a repeat of the next BATCH ops, SIZE times (its items) */
  long long nargs, first;  /* its refs: refs[first .. first + nargs) */
  long long size, work;  /* items, and bytes + flops (threads only for a grain of work per thread: sx_shares) */
  void* fn;
  long long op_a, op_b, m, n, k, lda, ldb, ldc, sa, sb, sc, oa, ob, oc, batch, in_bf16, out_bf16;
} sx_op;

typedef struct {
  int threads;
  long long grain;
  pthread_t* ids;
  pthread_mutex_t lock;
  pthread_cond_t wake;
  /* the current kernel's tickets: its epoch (bits 40-63), its chunks (20-39) and the next
     chunk to claim (0-19), in one word so that a claim is always of the kernel it counts */
  atomic_ullong ticket;
  atomic_llong done;  /* chunks of the current kernel finished */
  atomic_int busy;  /* 1 while a stretch of kernels runs: workers spin instead of sleeping */
  atomic_int stop;
  int split_gemms;  /* the pool's threads share a large gemm's pieces (the BLAS then runs on one thread) */
  sx_kernel fn;
  void* const* args;
  long long size;
  long long shared;  /* launches (kernels, repeats, gemm items or pieces) the threads shared so far: sx_pool_shared */
} sx_pool;

typedef struct { sx_pool* pool; int index; } sx_worker;

/* the running thread's index in its pool (the caller's 0): which region a repeat's item uses */
static _Thread_local int sx_self = 0;

static unsigned long long sx_epoch(unsigned long long ticket) { return ticket >> 40; }

/* claim chunks of the current kernel and run them until none is left: the caller and every
   worker that is awake share them, so a worker the OS has not scheduled delays nothing */
static void sx_claim(sx_pool* p) {
  for (;;) {
    const unsigned long long t = atomic_fetch_add_explicit(&p->ticket, 1ULL, memory_order_acq_rel);
    const long long k = (long long)(t & 0xFFFFFULL), n = (long long)((t >> 20) & 0xFFFFFULL);
    if (k >= n) return;
    const long long begin = p->size * k / n, end = p->size * (k + 1) / n;
    if (end > begin) p->fn(p->args, begin, end);
    atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
  }
}

static void* sx_work(void* arg) {
  sx_worker* w = (sx_worker*)arg;
  sx_pool* p = w->pool;
  sx_self = w->index;
  unsigned long long seen = 0;  /* the pool's first epoch: a kernel launched before this thread ran is still its to share */
  for (;;) {
    unsigned long long now = sx_epoch(atomic_load_explicit(&p->ticket, memory_order_acquire));
    for (long spins = 0; now == seen && spins < SX_SPINS && atomic_load_explicit(&p->busy, memory_order_relaxed); ++spins) {
      sx_pause();
      now = sx_epoch(atomic_load_explicit(&p->ticket, memory_order_acquire));
    }
    if (now == seen) {
      pthread_mutex_lock(&p->lock);
      while (sx_epoch(atomic_load(&p->ticket)) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->wake, &p->lock);
      pthread_mutex_unlock(&p->lock);
      now = sx_epoch(atomic_load_explicit(&p->ticket, memory_order_acquire));
    }
    if (atomic_load(&p->stop)) break;
    seen = now;
    sx_claim(p);
  }
  free(w);
  return NULL;
}

sx_pool* sx_pool_new(int threads, long long grain) {
  sx_pool* p = (sx_pool*)calloc(1, sizeof(sx_pool));
  p->threads = threads < 1 ? 1 : threads;
  p->grain = grain;
  pthread_mutex_init(&p->lock, NULL);
  pthread_cond_init(&p->wake, NULL);
  atomic_init(&p->ticket, 0ULL);
  atomic_init(&p->done, 0);
  atomic_init(&p->busy, 0);
  atomic_init(&p->stop, 0);
  p->ids = (pthread_t*)calloc((size_t)p->threads, sizeof(pthread_t));
  for (int t = 1; t < p->threads; ++t) {
    sx_worker* w = (sx_worker*)malloc(sizeof(sx_worker));
    w->pool = p; w->index = t;
    pthread_create(&p->ids[t], NULL, sx_work, w);
  }
  return p;
}

static void sx_publish(sx_pool* p, long long chunks) {
  const unsigned long long epoch = (sx_epoch(atomic_load(&p->ticket)) + 1ULL) & 0xFFFFFFULL;
  atomic_store_explicit(&p->ticket, (epoch << 40) | ((unsigned long long)chunks << 20), memory_order_release);
  pthread_mutex_lock(&p->lock);
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->lock);
}

void sx_pool_free(sx_pool* p) {
  atomic_store(&p->stop, 1);
  sx_publish(p, 0);
  for (int t = 1; t < p->threads; ++t) pthread_join(p->ids[t], NULL);
  pthread_mutex_destroy(&p->lock);
  pthread_cond_destroy(&p->wake);
  free(p->ids);
  free(p);
}

static void sx_parallel(sx_pool* p, sx_kernel fn, void* const* args, long long size) {
  ++p->shared;
  const long long chunks = size < SX_CHUNKS * p->threads ? size : SX_CHUNKS * p->threads;
  p->fn = fn; p->args = args; p->size = size;
  atomic_store_explicit(&p->done, 0, memory_order_relaxed);
  sx_publish(p, chunks);
  sx_claim(p);
  for (long spins = 0; atomic_load_explicit(&p->done, memory_order_acquire) != chunks; ++spins) {
    if (spins < SX_SPINS) sx_pause();
    else sched_yield();  /* a worker the OS stopped in the middle of a chunk (a busy machine): give it the core */
  }
}

static float sx_widen(unsigned short h) { unsigned int u = ((unsigned int)h) << 16; float f; memcpy(&f, &u, 4); return f; }
static unsigned short sx_narrow(float f) {
  unsigned int u; memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}

static void sx_sgemm(void* blas, int blas64, int op_a, int op_b, long long m, long long n, long long k, const float* a, long long lda,
                     const float* b, long long ldb, float* c, long long ldc) {
  const int ta = op_a ? 112 : 111, tb = op_b ? 112 : 111;
  if (blas64) ((sx_sgemm64)blas)(102, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
  else ((sx_sgemm32)blas)(102, ta, tb, (int)m, (int)n, (int)k, 1.0f, a, (int)lda, b, (int)ldb, 0.0f, c, (int)ldc);
}

/* a column-major rows x cols bf16 matrix (leading dimension ld) widened into a dense f32 one */
static void sx_widen_matrix(const unsigned short* x, long long rows, long long cols, long long ld, float* out) {
  for (long long j = 0; j < cols; ++j) for (long long i = 0; i < rows; ++i) out[i + j * rows] = sx_widen(x[i + j * ld]);
}

/* batch item B of an f32 gemm */
static void sx_gemm_item(const sx_op* op, void* const* ptr, void* blas, int blas64, long long b) {
  const float* a = (const float*)ptr[0] + op->oa + b * op->sa;
  const float* bm = (const float*)ptr[1] + op->ob + b * op->sb;
  float* c = (float*)ptr[2] + op->oc + b * op->sc;
  sx_sgemm(blas, blas64, (int)op->op_a, (int)op->op_b, op->m, op->n, op->k, a, op->lda, bm, op->ldb, c, op->ldc);
}

/* a gemm's batch items given to the pool's threads as a kernel's items: the job comes in place of the args */
typedef struct { const sx_op* op; void* const* ptr; void* blas; int blas64; } sx_gemm_job;

static void sx_gemm_items(void* const* args, long long begin, long long end) {
  const sx_gemm_job* job = (const sx_gemm_job*)(const void*)args;
  for (long long b = begin; b < end; ++b) sx_gemm_item(job->op, job->ptr, job->blas, job->blas64, b);
}

/* an f32 gemm split into pieces of C (SX_GEMM_PIECE columns, or rows), claimed as a kernel's items */
typedef struct {
  void* blas; int blas64, op_a, op_b, rows;
  long long m, n, k, lda, ldb, ldc, width;
  const float* a; const float* b; float* c;
} sx_pieces_job;

/* bytes of the operand every piece reads whole, above which each piece streams it from memory */
#define SX_DEEP_BYTES 1048576LL

/* the width of a gemm's pieces along its split dimension DIM: a share for each of PARTS
   threads, a multiple of 16, at least 64 (narrower pieces repack the other operand too
   often: in eighths on two threads the wide MLP's products cost 1.1-1.4x the CPU time of
   halves); at most halves where the operand every piece reads (SHARED bytes) outgrows the
   cache, since each piece reads it from memory again (the CNN's weight gradient, 64 x 288
   and 50176 deep: 5 pieces cost 1.6x the whole product's CPU time, 2 pieces 1.1x). Where
   the BLAS gives pieces the whole product's bits (sx_pieces_exact, probed at several
   counts of parts), the width changes no bit. */
static long long sx_piece(long long dim, long long shared, long long parts) {
  if (shared > SX_DEEP_BYTES && parts > 2) parts = 2;
  const long long w = ((dim + parts - 1) / parts + 15) / 16 * 16;
  return w < 64 ? 64 : w;
}

static void sx_gemm_pieces(void* const* args, long long begin, long long end) {
  const sx_pieces_job* g = (const sx_pieces_job*)(const void*)args;
  for (long long p = begin; p < end; ++p) {
    const long long at = p * g->width;
    if (g->rows) {  /* rows [at, at + m) of op(A) and of C */
      const long long m = g->m - at < g->width ? g->m - at : g->width;
      sx_sgemm(g->blas, g->blas64, g->op_a, g->op_b, m, g->n, g->k, g->a + (g->op_a ? at * g->lda : at), g->lda, g->b, g->ldb, g->c + at, g->ldc);
    } else {  /* columns [at, at + n) of op(B) and of C */
      const long long n = g->n - at < g->width ? g->n - at : g->width;
      sx_sgemm(g->blas, g->blas64, g->op_a, g->op_b, g->m, n, g->k, g->a, g->lda, g->b + (g->op_b ? at : at * g->ldb), g->ldb, g->c + at * g->ldc, g->ldc);
    }
  }
}

static sx_pieces_job sx_pieces_of(void* blas, int blas64, int op_a, int op_b, long long m, long long n, long long k, const float* a,
                                  long long lda, const float* b, long long ldb, float* c, long long ldc, long long parts, long long* pieces) {
  const int rows = m > n;
  const long long width = sx_piece(rows ? m : n, (rows ? n : m) * k * (long long)sizeof(float), parts);
  *pieces = ((rows ? m : n) + width - 1) / width;
  const sx_pieces_job job = {blas, blas64, op_a, op_b, rows, m, n, k, lda, ldb, ldc, width, a, b, c};
  return job;
}

/* C = op(A) op(B) in f32: one BLAS call, or, with threads and work enough, pieces the pool's threads share */
static void sx_sgemm_pool(sx_pool* pool, void* blas, int blas64, int op_a, int op_b, long long m, long long n, long long k, const float* a,
                          long long lda, const float* b, long long ldb, float* c, long long ldc) {
  long long pieces = 0;
  const sx_pieces_job job = sx_pieces_of(blas, blas64, op_a, op_b, m, n, k, a, lda, b, ldb, c, ldc, pool ? pool->threads : 1, &pieces);
  if (!pool || !pool->split_gemms || pool->threads < 2 || pieces < 2 || m * n * k < SX_SPLIT_GEMM) {
    sx_sgemm(blas, blas64, op_a, op_b, m, n, k, a, lda, b, ldb, c, ldc);
    return;
  }
  sx_parallel(pool, sx_gemm_pieces, (void* const*)(const void*)&job, pieces);
}

/* whether this BLAS gives every piece the bits of the whole product, on products of the
   shapes the models make (each transposition, rows and columns split, odd edges): 1 if so.
   A BLAS kernel whose accumulation depends on the operands' extents (OpenBLAS's Haswell
   sgemm) fails it, and the pool then leaves every product whole to the BLAS's threads. */
int sx_pieces_exact(void* blas, int blas64) {
  static const long long shapes[][3] = {{128, 768, 128}, {768, 200, 96}, {100, 300, 256}, {512, 768, 64}, {96, 1030, 48}};
  int exact = 1;
  for (int s = 0; s < 5 && exact; ++s) {
    const long long m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
    float* a = (float*)malloc((size_t)(m * k) * sizeof(float));
    float* b = (float*)malloc((size_t)(k * n) * sizeof(float));
    float* whole = (float*)malloc((size_t)(m * n) * sizeof(float));
    float* split = (float*)malloc((size_t)(m * n) * sizeof(float));
    unsigned int x = 12345u + (unsigned int)s;
    for (long long i = 0; i < m * k; ++i) { x = x * 1664525u + 1013904223u; a[i] = (float)(x >> 8) / 16777216.0f - 0.5f; }
    for (long long i = 0; i < k * n; ++i) { x = x * 1664525u + 1013904223u; b[i] = (float)(x >> 8) / 16777216.0f - 0.5f; }
    for (int op = 0; op < 4 && exact; ++op) {
      const int op_a = op & 1, op_b = op >> 1;
      const long long lda = op_a ? k : m, ldb = op_b ? n : k;
      sx_sgemm(blas, blas64, op_a, op_b, m, n, k, a, lda, b, ldb, whole, m);
      for (int p = 0; p < 3 && exact; ++p) {  /* halves, thirds and eighths: the pieces of 2, 3 and 8 threads */
        static const long long parts[3] = {2, 3, 8};
        long long pieces = 0;
        const sx_pieces_job job = sx_pieces_of(blas, blas64, op_a, op_b, m, n, k, a, lda, b, ldb, split, m, parts[p], &pieces);
        sx_gemm_pieces((void* const*)(const void*)&job, 0, pieces);
        exact = memcmp(whole, split, (size_t)(m * n) * sizeof(float)) == 0;
      }
    }
    free(a); free(b); free(whole); free(split);
  }
  return exact;
}

void sx_pool_split_gemms(sx_pool* p, int split) { p->split_gemms = split; }

long long sx_pool_shared(const sx_pool* p) { return p->shared; }

/* whether SIZE items of WORK (bytes + flops) are worth the pool's threads: a grain of work for
   each thread, since waking a sleeping worker and waiting for it costs more than a smaller
   share saves (the quickstart's 70 KB kernel ran slower on two threads than on one) */
static int sx_shares(const sx_pool* pool, long long size, long long work) {
  return pool->threads > 1 && size > 1 && work >= pool->grain * pool->threads;
}

/* whether the pool's threads take a gemm's batch items (each one BLAS call, on one thread):
   f32, items small enough that the BLAS runs each on one thread anyway */
static int sx_gemm_splits(const sx_pool* pool, const sx_op* op) {
  return pool->threads > 1 && op->batch > 1 && !op->in_bf16 && op->m * op->n * op->k <= SX_SMALL_GEMM;
}

static void sx_gemm(sx_pool* pool, const sx_op* op, void* const* ptr, void* blas, int blas64, float* workspace) {
  for (long long b = 0; b < op->batch; ++b) {
    const long long ra = op->op_a ? op->k : op->m, ca = op->op_a ? op->m : op->k;
    const long long rb = op->op_b ? op->n : op->k, cb = op->op_b ? op->k : op->n;
    if (!op->in_bf16) {
      sx_sgemm_pool(pool, blas, blas64, (int)op->op_a, (int)op->op_b, op->m, op->n, op->k, (const float*)ptr[0] + op->oa + b * op->sa, op->lda,
                    (const float*)ptr[1] + op->ob + b * op->sb, op->ldb, (float*)ptr[2] + op->oc + b * op->sc, op->ldc);
      continue;
    }
    float* wa = workspace;
    float* wb = wa + ra * ca;
    float* wc = wb + rb * cb;
    sx_widen_matrix((const unsigned short*)ptr[0] + op->oa + b * op->sa, ra, ca, op->lda, wa);
    sx_widen_matrix((const unsigned short*)ptr[1] + op->ob + b * op->sb, rb, cb, op->ldb, wb);
    if (op->out_bf16) {
      sx_sgemm_pool(pool, blas, blas64, (int)op->op_a, (int)op->op_b, op->m, op->n, op->k, wa, ra, wb, rb, wc, op->m);
      unsigned short* c = (unsigned short*)ptr[2] + op->oc + b * op->sc;
      for (long long j = 0; j < op->n; ++j) for (long long i = 0; i < op->m; ++i) c[i + j * op->ldc] = sx_narrow(wc[i + j * op->m]);
    } else {
      float* c = (float*)ptr[2] + op->oc + b * op->sc;
      sx_sgemm_pool(pool, blas, blas64, (int)op->op_a, (int)op->op_b, op->m, op->n, op->k, wa, ra, wb, rb, c, op->ldc);
    }
  }
}

/* the pointers of OP's arguments for item ITEM of a repeat (0 outside one), REGION the running thread's own */
static void sx_args(const sx_op* op, const sx_ref* refs, void* const* bases, char* region, long long item, void** out) {
  for (long long a = 0; a < op->nargs; ++a) {
    const sx_ref r = refs[op->first + a];
    out[a] = r.base < 0 ? (void*)(region + r.offset) : (void*)((char*)bases[r.base] + r.offset + item * r.step);
  }
}

/* one kernel or gemm, its items shared by the pool's threads where that pays */
static void sx_op_run(sx_pool* pool, const sx_op* op, void* const* ptr, void* blas, int blas64, float* workspace) {
  if (op->kind == 1 && sx_gemm_splits(pool, op)) {
    const sx_gemm_job job = {op, ptr, blas, blas64};
    atomic_store_explicit(&pool->busy, 1, memory_order_relaxed);
    sx_parallel(pool, sx_gemm_items, (void* const*)(const void*)&job, op->batch);
  } else if (op->kind == 1) {
    /* the workers sleep through a product the BLAS's own threads compute, and spin through one whose pieces they share */
    atomic_store_explicit(&pool->busy, pool->split_gemms, memory_order_relaxed);
    sx_gemm(pool, op, ptr, blas, blas64, workspace);
  } else if (sx_shares(pool, op->size, op->work)) {
    atomic_store_explicit(&pool->busy, 1, memory_order_relaxed);
    sx_parallel(pool, (sx_kernel)op->fn, ptr, op->size);
  } else if (op->size > 0) {
    ((sx_kernel)op->fn)(ptr, 0, op->size);
  }
}

/* a repeat whose items the pool's threads share: each item's ops on one thread, in its own region */
typedef struct {
  const sx_op* body; long long ops; const sx_ref* refs; void* const* bases;
  void* blas; int blas64; char* regions; long long region_bytes, scratch_bytes, most_args;
} sx_repeat_job;

static void sx_repeat_items(void* const* args, long long begin, long long end) {
  const sx_repeat_job* job = (const sx_repeat_job*)(const void*)args;
  char* region = job->regions + (long long)sx_self * job->region_bytes;
  void* ptr[job->most_args];
  for (long long item = begin; item < end; ++item) {
    for (long long i = 0; i < job->ops; ++i) {
      const sx_op* op = &job->body[i];
      sx_args(op, job->refs, job->bases, region, item, ptr);
      if (op->kind == 1) sx_gemm(NULL, op, ptr, job->blas, job->blas64, (float*)(void*)(region + job->scratch_bytes));
      else if (op->size > 0) ((sx_kernel)op->fn)(ptr, 0, op->size);
    }
  }
}

/* whether the pool's threads share a repeat's items: threads, work enough, and a gemm in it
   only where the BLAS runs on the calling thread (the pool's pieces: it is held to one) */
static int sx_repeat_splits(const sx_pool* pool, const sx_op* head, const sx_op* body) {
  if (!sx_shares(pool, head->size, head->work)) return 0;
  for (long long i = 0; i < head->batch; ++i)
    if (body[i].kind == 1 && !pool->split_gemms) return 0;
  return 1;
}

/* REGIONS: each thread's REGION_BYTES, its repeats' scratch (SCRATCH_BYTES) then its gemms' bf16 workspace */
int sx_run(sx_pool* pool, const sx_op* ops, long long count, const sx_ref* refs, void* const* bases, void** scratch, void* blas, int blas64,
           char* regions, long long region_bytes, long long scratch_bytes) {
  float* workspace = (float*)(void*)(regions + scratch_bytes);
  for (long long i = 0; i < count; ++i) {
    const sx_op* op = &ops[i];
    if (op->kind != 2) {
      sx_args(op, refs, bases, regions, 0, scratch);
      sx_op_run(pool, op, scratch, blas, blas64, workspace);
      continue;
    }
    const sx_op* body = op + 1;
    if (sx_repeat_splits(pool, op, body)) {
      const sx_repeat_job job = {body, op->batch, refs, bases, blas, blas64, regions, region_bytes, scratch_bytes, op->nargs};
      atomic_store_explicit(&pool->busy, 1, memory_order_relaxed);
      sx_parallel(pool, sx_repeat_items, (void* const*)(const void*)&job, op->size);
    } else {
      for (long long item = 0; item < op->size; ++item)
        for (long long b = 0; b < op->batch; ++b) {
          sx_args(&body[b], refs, bases, regions, item, scratch);
          sx_op_run(pool, &body[b], scratch, blas, blas64, workspace);
        }
    }
    i += op->batch;
  }
  atomic_store_explicit(&pool->busy, 0, memory_order_relaxed);
  return 0;
}
"""
