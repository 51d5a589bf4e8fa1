// How fast this core issues AVX-512 VNNI dot products (vpdpbusd), a C model of the batched products' loop, and
// (where the CPU has AMX, which -march=native then enables) the tile unit's rates and the same loop on the tiles.
//
//     gcc -O2 -march=native dev/vnni_rates.c -o /tmp/vnni_rates && /tmp/vnni_rates
//
// Part 1, issue rates (ns per vpdpbusd, 12 independent accumulators):
//   - registers only;
//   - each vpdpbusd with a load of its own: a broadcast memory operand ({1to16}), or a vpbroadcastd in front;
//   - one vpbroadcastd feeding two vpdpbusd (and four).
// Ice Lake Xeon VM, 2026-12-06: 0.19 / 0.32 / 0.32 / 0.19 (0.19) ns: a vpdpbusd that needs a load of its own issues
// one a cycle, two sharing a broadcast two a cycle. The rows of 8 (ggufrun.quants.dot._rows_z8: each broadcast quad
// of activation quants meets one code vector) are bound by the first; _rows_zq (two pairs of groups against every
// row: each broadcast meets two code vectors) by the second.
//
// Part 2, the loop of _rows_zq in C (ns per 16 weight rows x 32 values x 1 activation row): 16 activation rows of
// K = 576, two pairs of groups of Q4_1-like nibble codes decoded per block into registers, every row's two int32
// sums, its d-term FMAs into accumulators in L1 (one load and one store a row, pair and block); "with m" adds
// Q4_1's m terms as a second read-modify-write per row (which _rows_zq instead takes after the blocks, in
// registers). Weights repeated from L1 (1 pair of pairs) or from L2 (40). Ice Lake, 2026-12-06, quiet minutes: 3.0-3.1 /
// 3.4-3.6 ns, with m 3.9-4.6 ns; a rows-of-8 loop (one broadcast per vpdpbusd, 8 rows' accumulators in registers)
// 4.8-4.9 ns. AMD EPYC Zen 4 VM (znver4, 2 cores), 2026-12-07: Part 1 0.27 ns for all four (one vpdpbusd a cycle
// at 3.66 GHz, however it is fed); Part 2 2.96 / 2.95-2.97 ns, with m 3.21-3.23 / 3.25-3.26, at 8 rows 3.00-3.01 /
// 3.05 (one pair against four rows 3.05-3.40 / 3.06-3.97); ggufrun's _rows_zq there, SmolLM2's Q4_1 matrices with
// the weights in cache (one call repeated, 1 thread): 3.39-3.77 ns at 16 rows, 3.64-4.26 at 8, and ~4.0 inside a
// 16-row step (2 threads). Intel Xeon with AMX (lscpu model 207), 2026-12-06: Part 1 0.17-0.20 / 0.17-0.21 / 0.19-0.30 /
// 0.18-0.22 ns (a load of its own costs little there); Part 2 2.5-3.1 / 2.6-2.7 ns. The same loop with one pair of
// groups against four rows at a time (so each broadcast meets one code vector, four rows' chains independent), same
// machine, 8 / 16 rows from L2: 3.3 / 3.1 ns against 2.7 / 2.5 for two pairs against each row (earlier runs alike);
// ggufrun.quants.dot's version of it ran SmolLM2's Q4_1 products at 8-16 rows 1.0-1.4x slower, so it was not kept.
//
// Part 3, AMX (Linux must grant the tile state): ns per tdpbssd (16 x 16 x 64, four independent), tilestored and
// tileloadd of 16 x 64 bytes; one block (16 weight rows x 32 values) of 16 or 8 activation rows at a time, its steps
// one after another (quants and codes loaded, tdpbssd, the sums stored, read back and scaled); and Part 2's loop on the
// tiles at 16 and 8 rows (the rows past 8 as a tile of 8), beside Part 2's own at the same rows, weights from L2 (40
// pairs of pairs) and L3 (2,900: 33 MB): per block and pair of groups the codes decoded as in Part 2 and stored as a B
// tile (minus 8), one tdpbssd, the sums stored and scaled into accumulators in registers; in order, or pipelined (B
// tiles built two blocks ahead, the tiles one block ahead of the scaling). Intel Xeon with AMX (lscpu model 207),
// 2026-12-06, two runs: tdpbssd 7.1-7.2 ns, tilestored 5.9-7.2, tileloadd 3.2-4.2; a block of 16 / 8 rows one after
// another 29-34 / 17-25 ns (1.8-2.2 / 2.1-3.2 per 16 x 32 x 1); per 16 x 32 x 1 from L2 / L3 at 16 rows Part 2's loop
// 2.44-2.54 / 2.70-2.72, the tiles in order 2.19-2.53 / 2.76-2.95, pipelined 1.94-2.00 / 2.10-2.28; at 8 rows
// 2.95-3.28 / 3.45-3.79, 3.56-3.62 / 4.28-5.04, 2.49-2.72 / 3.09-3.32. A tile store costs ~6 ns whatever its rows and
// each block's steps wait on the one before through memory, so the tiles beat the vector loop below 32 rows only when
// pipelined, and then by 10-20%. ggufrun.quants.dot's version of the pipelined loop (Numba; one pair of groups at a
// time, two sets of tiles in turn) ran SmolLM2's Q4_1 products slower than _rows_zq at 8 / 12 rows (1.07-1.8x /
// 1.16-1.46x) and even at 16 (0.89-1.08x), so those rows stay on _rows_zq.
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define R12(op) op(0) op(1) op(2) op(3) op(4) op(5) op(6) op(7) op(8) op(9) op(10) op(11)
#define REG(k) "vpdpbusd %%zmm30, %%zmm31, %%zmm" #k "\n\t"
#define MEM(k) "vpdpbusd " #k "*4(%0)%{1to16%}, %%zmm31, %%zmm" #k "\n\t"
#define BC1(k) "vpbroadcastd " #k "*4(%0), %%zmm30\n\tvpdpbusd %%zmm30, %%zmm31, %%zmm" #k "\n\t"
#define BC2(k, a, b)                                                                                                 \
    "vpbroadcastd " #k "*4(%0), %%zmm30\n\tvpdpbusd %%zmm30, %%zmm31, %%zmm" #a "\n\t"                               \
    "vpdpbusd %%zmm30, %%zmm29, %%zmm" #b "\n\t"
// the vector registers the loops above write, declared to the compiler (which may keep its own values in them)
#define CLOBBERED                                                                                                    \
    "memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm30"

static void issue_rates(void) {
    int *buf = aligned_alloc(64, 4096);
    for (int i = 0; i < 1024; i++) buf[i] = i;
    const long n = 20000000;
    double t = now();
    for (long i = 0; i < n; i++) __asm__ volatile(R12(REG)::"r"(buf) : CLOBBERED);
    double reg = now() - t;
    t = now();
    for (long i = 0; i < n; i++) __asm__ volatile(R12(MEM)::"r"(buf) : CLOBBERED);
    double mem = now() - t;
    t = now();
    for (long i = 0; i < n; i++) __asm__ volatile(R12(BC1)::"r"(buf) : CLOBBERED);
    double bc1 = now() - t;
    t = now();
    for (long i = 0; i < n; i++)
        __asm__ volatile(BC2(0, 0, 1) BC2(1, 2, 3) BC2(2, 4, 5) BC2(3, 6, 7) BC2(4, 8, 9) BC2(5, 10, 11)::"r"(buf)
                         : CLOBBERED);
    double bc2 = now() - t;
    printf("ns per vpdpbusd: registers %.3f; broadcast memory operand %.3f; vpbroadcastd each %.3f; "
           "one vpbroadcastd for two %.3f\n",
           reg * 1e9 / (12 * n), mem * 1e9 / (12 * n), bc1 * 1e9 / (12 * n), bc2 * 1e9 / (12 * n));
    free(buf);
}

#define NB 18
#define K (NB * 32)
#define MMAX 16  // activation rows, at most
#define GB 160  // bytes per block of a group of 8 rows: 8 d, 8 m (halves), 4 chunks of 32 nibble bytes

// The loops' inputs: `quads` pairs of pairs of groups of weights (w), MMAX activation rows of quants (x), their scales
// (dx); the same values for every loop.
typedef struct {
    unsigned char *w;
    signed char *x;
    float *dx;
} Inputs;

static Inputs inputs(int quads) {
    Inputs in = {aligned_alloc(64, 4L * quads * NB * GB + 64), aligned_alloc(64, MMAX * K),
                 aligned_alloc(64, MMAX * NB * 4 + 64)};
    for (long i = 0; i < 4L * quads * NB * GB; i++) in.w[i] = (i * 7) & 255;
    for (int i = 0; i < MMAX * K; i++) in.x[i] = (i * 13) % 200 - 100;
    for (int i = 0; i < MMAX * NB + 16; i++) in.dx[i] = 0.01f * (i % 7);
    return in;
}

static void free_inputs(Inputs in) { free(in.w), free(in.x), free(in.dx); }

// chunk k (32 bytes) of a block of groups A (ga) and B (gb) side by side: the nibbles of 16 rows x 4 bytes
static inline __m512i chunk_pair(const unsigned char *ga, const unsigned char *gb, int k) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(ga + 32 + 32 * k))),
                              _mm256_loadu_si256((const __m256i *)(gb + 32 + 32 * k)), 1);
}

static double zq_loop(int M, int with_m, int quads, long iters) {
    Inputs in = inputs(quads);
    const unsigned char *w = in.w;
    const signed char *x = in.x;
    const float *dx = in.dx;
    float *acc = aligned_alloc(64, M * 32 * 4), *accm = aligned_alloc(64, M * 32 * 4);
    float *out = aligned_alloc(64, M * 32 * 4L * quads);
    const __m512i m15 = _mm512_set1_epi8(15);
    long units = 0;
    double t = now();
    for (long it = 0; it < iters; it++) {
        for (int q = 0; q < quads; q++) {
            const unsigned char *w0 = w + (long)q * 4 * NB * GB;
            for (int i = 0; i < M * 32; i++) acc[i] = accm[i] = 0;
            for (int b = 0; b < NB; b++) {
                __m512i ca[8], cb[8];  // the two pairs' code vectors, in registers
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    const unsigned char *ga = w0 + (2 * h) * NB * GB + b * GB, *gb = ga + NB * GB;
#pragma GCC unroll 4
                    for (int k = 0; k < 4; k++) {
                        __m512i v = chunk_pair(ga, gb, k);
                        __m512i lo = _mm512_and_si512(v, m15), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m15);
                        if (h == 0) {
                            ca[2 * k] = lo, ca[2 * k + 1] = hi;
                        } else {
                            cb[2 * k] = lo, cb[2 * k + 1] = hi;
                        }
                    }
                }
                __m512 dwa = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w0 + b * GB)));
                __m512 dwb = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w0 + 2 * NB * GB + b * GB)));
#pragma GCC unroll 2
                for (int r = 0; r < M; r++) {
                    const int *xr = (const int *)(x + r * K + 32 * b);
                    __m512i sa = _mm512_setzero_si512(), sb = sa;
#pragma GCC unroll 8
                    for (int j = 0; j < 8; j++) {
                        __m512i xv = _mm512_set1_epi32(xr[(j & 1) * 4 + (j >> 1)]);
                        sa = _mm512_dpbusd_epi32(sa, ca[j], xv);
                        sb = _mm512_dpbusd_epi32(sb, cb[j], xv);
                    }
                    __m512 d = _mm512_set1_ps(dx[r * NB + b]);
                    float *ar = acc + r * 32, *mr = accm + r * 32;
                    _mm512_store_ps(ar, _mm512_fmadd_ps(_mm512_cvtepi32_ps(sa), _mm512_mul_ps(dwa, d), _mm512_load_ps(ar)));
                    _mm512_store_ps(ar + 16,
                                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(sb), _mm512_mul_ps(dwb, d), _mm512_load_ps(ar + 16)));
                    if (with_m) {
                        __m512 s = _mm512_set1_ps(dx[r * NB + b + 1]);
                        _mm512_store_ps(mr, _mm512_fmadd_ps(dwa, s, _mm512_load_ps(mr)));
                        _mm512_store_ps(mr + 16, _mm512_fmadd_ps(dwb, s, _mm512_load_ps(mr + 16)));
                    }
                }
            }
            for (int i = 0; i < M * 32; i++) out[q * M * 32 + i] = acc[i] + accm[i];
            units += 2 * NB * M;
        }
    }
    t = now() - t;
    volatile float sink = out[3];
    (void)sink;
    free_inputs(in), free(acc), free(accm), free(out);
    return t * 1e9 / units;
}

// Part 2's loop with one pair of groups a step against four activation rows at a time (each broadcast quad of quants
// meets one code vector; the four rows' chains independent), M a multiple of 4.
static double zq4_loop(int M, int quads, long iters) {
    Inputs in = inputs(quads);
    const unsigned char *w = in.w;
    const signed char *x = in.x;
    const float *dx = in.dx;
    float *acc = aligned_alloc(64, M * 32 * 4);
    float *out = aligned_alloc(64, M * 32 * 4L * quads);
    const __m512i m15 = _mm512_set1_epi8(15);
    long units = 0;
    double t = now();
    for (long it = 0; it < iters; it++) {
        for (int q = 0; q < quads; q++) {
            const unsigned char *w0 = w + (long)q * 4 * NB * GB;
            for (int h = 0; h < 2; h++) {
                for (int i = 0; i < M * 16; i++) acc[i] = 0;
                for (int b = 0; b < NB; b++) {
                    __m512i ca[8];
                    const unsigned char *ga = w0 + (2 * h) * NB * GB + b * GB, *gb = ga + NB * GB;
#pragma GCC unroll 4
                    for (int k = 0; k < 4; k++) {
                        __m512i v = chunk_pair(ga, gb, k);
                        ca[2 * k] = _mm512_and_si512(v, m15), ca[2 * k + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m15);
                    }
                    __m512 dwa = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w0 + 2 * h * NB * GB + b * GB)));
                    for (int r = 0; r < M; r += 4) {
                        const int *x0 = (const int *)(x + r * K + 32 * b), *x1 = (const int *)((const signed char *)x0 + K),
                                  *x2 = (const int *)((const signed char *)x0 + 2 * K), *x3 = (const int *)((const signed char *)x0 + 3 * K);
                        __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
#pragma GCC unroll 8
                        for (int j = 0; j < 8; j++) {
                            int o = (j & 1) * 4 + (j >> 1);
                            s0 = _mm512_dpbusd_epi32(s0, ca[j], _mm512_set1_epi32(x0[o]));
                            s1 = _mm512_dpbusd_epi32(s1, ca[j], _mm512_set1_epi32(x1[o]));
                            s2 = _mm512_dpbusd_epi32(s2, ca[j], _mm512_set1_epi32(x2[o]));
                            s3 = _mm512_dpbusd_epi32(s3, ca[j], _mm512_set1_epi32(x3[o]));
                        }
                        __m512i s[4] = {s0, s1, s2, s3};
                        for (int t2 = 0; t2 < 4; t2++) {
                            float *ar = acc + (r + t2) * 16;
                            __m512 d = _mm512_set1_ps(dx[(r + t2) * NB + b]);
                            _mm512_store_ps(ar, _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[t2]), _mm512_mul_ps(dwa, d), _mm512_load_ps(ar)));
                        }
                    }
                }
                for (int i = 0; i < M * 16; i++) out[q * M * 32 + h * M * 16 + i] = acc[i];
            }
            units += 2 * NB * M;
        }
    }
    t = now() - t;
    volatile float sink = out[3];
    (void)sink;
    free_inputs(in), free(acc), free(out);
    return t * 1e9 / units;
}

#ifdef __AMX_INT8__
// Part 3 (CPUs with AMX, where Linux grants the tile state): the tile unit's rates, one block's chain, and the batched
// loop on the tiles (ggufrun.quants.dot's "AMX tiles" sections) beside Part 2's loop at the same row counts.
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef struct {
    unsigned char palette, start, reserved[14];
    unsigned short colsb[16];
    unsigned char rows[16];
} TileConfig;

// tmm0..3: int32 sums (c_rows x 64 bytes); tmm4, tmm5: a block's B tiles (8 rows x 64: 16 weight rows x 32 values);
// tmm6: activation quants (a_rows x a_bytes); tmm7: 16 x 64
static void tile_shapes(int c_rows, int a_rows, int a_bytes) {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 4; t++) c.colsb[t] = 64, c.rows[t] = c_rows;
    c.colsb[4] = c.colsb[5] = 64, c.rows[4] = c.rows[5] = 8;
    c.colsb[6] = a_bytes, c.rows[6] = a_rows;
    c.colsb[7] = 64, c.rows[7] = 16;
    __asm__ volatile("ldtilecfg %0" ::"m"(c));  // GCC 12's _tile_loadconfig let it drop the stores to c
}

static void tile_rates(void) {
    static char buf[65536] __attribute__((aligned(64)));
    static int sums[4096] __attribute__((aligned(64)));
    const long n = 2000000;
    memset(buf, 1, sizeof buf);
    tile_shapes(16, 16, 64);
    _tile_loadd(6, buf, 64);
    _tile_loadd(7, buf + 1024, 64);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    double t = now();
    for (long i = 0; i < n; i++) {
        _tile_dpbssd(0, 6, 7);
        _tile_dpbssd(1, 6, 7);
        _tile_dpbssd(2, 6, 7);
        _tile_dpbssd(3, 6, 7);
    }
    double dp = now() - t;
    t = now();
    for (long i = 0; i < n; i++) {
        _tile_stored(0, sums, 64);
        _tile_stored(1, sums + 256, 64);
    }
    double st = now() - t;
    t = now();
    for (long i = 0; i < n; i++) {
        _tile_loadd(6, buf + (i & 7) * 1024, 64);
        _tile_loadd(7, buf + 8192 + (i & 7) * 1024, 64);
    }
    double ld = now() - t;
    printf("AMX, ns each: tdpbssd 16 x 16 x 64 (4 independent) %.2f; tilestored 16 x 64 bytes %.2f; tileloadd 16 x 64 "
           "bytes %.2f\n",
           dp * 1e9 / (4 * n), st * 1e9 / (2 * n), ld * 1e9 / (2 * n));
    for (int m = 16; m >= 8; m -= 8) {  // one block: quants and codes in, one tdpbssd, the sums out and scaled
        tile_shapes(m, m, 32);
        __m512 acc[16];
        for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
        const __m512 sc = _mm512_set1_ps(0.5f);
        t = now();
        for (long i = 0; i < n / 2; i++) {
            int *c = sums + (i & 3) * 256;
            _tile_zero(0);
            _tile_loadd(6, buf + (i & 7) * 512, 32);
            _tile_loadd(4, buf + 16384 + (i & 7) * 512, 64);
            _tile_dpbssd(0, 6, 4);
            _tile_stored(0, c, 64);
            for (int r = 0; r < m; r++)
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + 16 * r)), sc, acc[r]);
        }
        t = now() - t;
        float sink = 0;
        for (int r = 0; r < 16; r++) sink += _mm512_reduce_add_ps(acc[r]);
        printf("AMX, one block of %d rows x 16 x 32 (load, tdpbssd, store, the rows' cvt / FMA), one after another: "
               "%.2f ns (%.2f per 16 x 32 x 1)%s\n",
               m, t * 1e9 / (n / 2), t * 1e9 / (n / 2) / m, sink == 1234.5f ? " " : "");
    }
}

// Part 2's loop on the tiles: per block, both pairs' codes decoded as there, stored as B tiles (minus 8: signed), one
// tdpbssd each against the block's M x 32 quants, the sums stored and scaled into accumulators in registers. In
// order (each block's steps one after another) or pipelined (B tiles built two blocks ahead, the tile steps one
// block ahead of the float steps, so no block waits on its own stores).
static double amx_loop(int M, int pipelined, int quads, long iters) {
    Inputs in = inputs(quads);
    const unsigned char *w = in.w;
    const signed char *x = in.x;
    const float *dx = in.dx;
    float *out = aligned_alloc(64, MMAX * 32 * 4L * quads);
    signed char *bt = aligned_alloc(64, 4 * 1024);  // B tiles of 4 blocks in flight, two pairs each
    int *sums = aligned_alloc(64, 4 * 2 * 1024);    // sums of 4 blocks, two pairs each (M x 16 int32)
    const __m512i m15 = _mm512_set1_epi8(15), eight = _mm512_set1_epi8(8);
    tile_shapes(M, M, 32);
    long units = 0;
    double t = now();
    for (long it = 0; it < iters; it++) {
        for (int q = 0; q < quads; q++) {
            const unsigned char *w0 = w + (long)q * 4 * NB * GB;
            __m512 acc[2][MMAX];
            for (int r = 0; r < M; r++) acc[0][r] = acc[1][r] = _mm512_setzero_ps();
            for (int b = -2; b < NB; b++) {
                int build = pipelined ? b + 2 : b, tiles = pipelined ? b + 1 : b;
                if (build >= 0 && build < NB) {
                    for (int h = 0; h < 2; h++) {
                        const unsigned char *ga = w0 + (2 * h) * NB * GB + build * GB, *gb = ga + NB * GB;
                        signed char *to = bt + 1024 * (build & 3) + 512 * h;
                        for (int k = 0; k < 4; k++) {
                            __m512i v = chunk_pair(ga, gb, k);
                            _mm512_store_si512(to + 64 * k, _mm512_sub_epi8(_mm512_and_si512(v, m15), eight));
                            _mm512_store_si512(to + 256 + 64 * k,
                                               _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), m15), eight));
                        }
                    }
                }
                if (tiles >= 0 && tiles < NB) {
                    int *c = sums + 512 * (tiles & 3);
                    _tile_zero(0);
                    _tile_zero(1);
                    _tile_loadd(6, x + 32 * tiles, K);
                    _tile_loadd(4, bt + 1024 * (tiles & 3), 64);
                    _tile_loadd(5, bt + 1024 * (tiles & 3) + 512, 64);
                    _tile_dpbssd(0, 6, 4);
                    _tile_dpbssd(1, 6, 5);
                    _tile_stored(0, c, 64);
                    _tile_stored(1, c + 256, 64);
                }
                if (b >= 0) {
                    __m512 dwa = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w0 + b * GB)));
                    __m512 dwb = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w0 + 2 * NB * GB + b * GB)));
                    const int *ca = sums + 512 * (b & 3), *cb = ca + 256;
                    for (int r = 0; r < M; r++) {
                        __m512 d = _mm512_set1_ps(dx[r * NB + b]);
                        acc[0][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(ca + 16 * r)),
                                                    _mm512_mul_ps(dwa, d), acc[0][r]);
                        acc[1][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cb + 16 * r)),
                                                    _mm512_mul_ps(dwb, d), acc[1][r]);
                    }
                }
            }
            for (int r = 0; r < M; r++) {
                _mm512_store_ps(out + q * MMAX * 32 + 32 * r, acc[0][r]);
                _mm512_store_ps(out + q * MMAX * 32 + 32 * r + 16, acc[1][r]);
            }
            units += 2 * NB * M;
        }
    }
    t = now() - t;
    volatile float sink = out[3];
    (void)sink;
    free_inputs(in), free(out), free(bt), free(sums);
    return t * 1e9 / units;
}

static void amx_rates(void) {
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */)) {
        printf("AMX: this process was not granted the tile state\n");
        return;
    }
    tile_rates();
    for (int m = 16; m >= 8; m -= 8)  // L2: 40 pairs of pairs of groups (0.46 MB); L3: 2,900 (33 MB)
        printf("%d rows, ns per 16 x 32 x 1, weights from L2 / L3: Part 2's loop %.2f / %.2f; on the tiles in order "
               "%.2f / %.2f, pipelined %.2f / %.2f\n",
               m, zq_loop(m, 0, 40, 5000), zq_loop(m, 0, 2900, 60), amx_loop(m, 0, 40, 5000), amx_loop(m, 0, 2900, 60),
               amx_loop(m, 1, 40, 5000), amx_loop(m, 1, 2900, 60));
    _tile_release();
}
#endif

int main(void) {
    issue_rates();
    printf("the batched loop, ns per 16 x 32 x 1: L1 %.2f, L2 %.2f; with m as a second read-modify-write: L1 %.2f, "
           "L2 %.2f\n",
           zq_loop(16, 0, 1, 200000), zq_loop(16, 0, 40, 5000), zq_loop(16, 1, 1, 200000), zq_loop(16, 1, 40, 5000));
    for (int m = 8; m <= 16; m += 8)
        printf("%d rows, ns per 16 x 32 x 1, L1 / L2: two pairs against each row %.2f / %.2f; one pair against four "
               "rows at a time %.2f / %.2f\n",
               m, zq_loop(m, 0, 1, 200000), zq_loop(m, 0, 40, 5000), zq4_loop(m, 1, 200000), zq4_loop(m, 40, 5000));
#ifdef __AMX_INT8__
    amx_rates();
#endif
    return 0;
}
