// How fast this core issues AVX-512 VNNI dot products (vpdpbusd), and a C model of the batched products' loop.
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
// 4.8-4.9 ns.
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

static void issue_rates(void) {
    int *buf = aligned_alloc(64, 4096);
    for (int i = 0; i < 1024; i++) buf[i] = i;
    const long n = 20000000;
    double t = now();
    for (long i = 0; i < n; i++) __asm__ volatile(R12(REG)::"r"(buf) : "memory");
    double reg = now() - t;
    t = now();
    for (long i = 0; i < n; i++) __asm__ volatile(R12(MEM)::"r"(buf) : "memory");
    double mem = now() - t;
    t = now();
    for (long i = 0; i < n; i++) __asm__ volatile(R12(BC1)::"r"(buf) : "memory");
    double bc1 = now() - t;
    t = now();
    for (long i = 0; i < n; i++)
        __asm__ volatile(BC2(0, 0, 1) BC2(1, 2, 3) BC2(2, 4, 5) BC2(3, 6, 7) BC2(4, 8, 9) BC2(5, 10, 11)::"r"(buf)
                         : "memory");
    double bc2 = now() - t;
    printf("ns per vpdpbusd: registers %.3f; broadcast memory operand %.3f; vpbroadcastd each %.3f; "
           "one vpbroadcastd for two %.3f\n",
           reg * 1e9 / (12 * n), mem * 1e9 / (12 * n), bc1 * 1e9 / (12 * n), bc2 * 1e9 / (12 * n));
    free(buf);
}

#define NB 18
#define K (NB * 32)
#define M 16
#define GB 160  // bytes per block of a group of 8 rows: 8 d, 8 m (halves), 4 chunks of 32 nibble bytes

static double zq_loop(int with_m, int quads, long iters) {
    unsigned char *w = aligned_alloc(64, 4L * quads * NB * GB + 64);
    for (long i = 0; i < 4L * quads * NB * GB; i++) w[i] = (i * 7) & 255;
    signed char *x = aligned_alloc(64, M * K);
    for (int i = 0; i < M * K; i++) x[i] = (i * 13) % 200 - 100;
    float *dx = aligned_alloc(64, M * NB * 4 + 64);
    for (int i = 0; i < M * NB + 16; i++) dx[i] = 0.01f * (i % 7);
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
                        __m512i v = _mm512_inserti64x4(
                            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(ga + 32 + 32 * k))),
                            _mm256_loadu_si256((const __m256i *)(gb + 32 + 32 * k)), 1);
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
    free(w), free(x), free(dx), free(acc), free(accm), free(out);
    return t * 1e9 / units;
}

int main(void) {
    issue_rates();
    printf("the batched loop, ns per 16 x 32 x 1: L1 %.2f, L2 %.2f; with m as a second read-modify-write: L1 %.2f, "
           "L2 %.2f\n",
           zq_loop(0, 1, 200000), zq_loop(0, 40, 5000), zq_loop(1, 1, 200000), zq_loop(1, 40, 5000));
    return 0;
}
