// How fast an AVX2 core without VNNI issues the batched products' instructions, and the products' inner loop as
// Numba compiles it, with parts of it taken out: what holds ggufrun.quants.dot._rows_x8 (the tile loop that runs
// every product of 3 or more activation rows of the 32-value types on CPUs without AVX-512) on such a CPU.
//
//     gcc -O2 -mavx2 -mfma dev/avx2_rates.c -o /tmp/avx2_rates && /tmp/avx2_rates
//
// Part 1, issue rates (ns per instruction, 12 independent chains or loads, registers only unless a load is named):
// vpmaddubsw, vpmaddwd, vfmadd231ps, vpaddw, vpmaddubsw and vfmadd231ps in turn, vpsignb, vpmaddubsw and vpsignb in
// turn, vpbroadcastd ymm from memory, vmovdqu ymm from memory. AMD EPYC (Zen 3) VM, 2026-12-07 00:15-00:30 UTC: 0.155
// / 0.156 / 0.156 / 0.078 / 0.145 / 0.157 / 0.145 / 0.155 / 0.157 ns: two multiplies a cycle (~3.2 GHz) on two pipes
// that the FMAs and vpsignb share (in turn with either they issue no faster), four integer adds, two 256-bit loads or
// broadcasts. Q8_0's signed pairs (dot8_x8: per 4 values of 8 rows a vpsignb, a vpmaddubsw and a vpmaddwd, the
// codes' own vpsignb out of the row loop) take 8 vpsignb and 7 vpmaddwd more a row and block than Q4_1's nibbles.
// Tried and dropped: Q8_0's codes + 128 split into nibbles in the tile loop (two vpmaddubsw a quad, summed in int16,
// a vpmaddwd by 16 and one by 1 a block; the same integers): 1.06-1.14x slower on SmolLM2's Q8_0 output projection
// at 3-32 rows in one process, the two forms in turn (in its machine code ~39 vector ops and ~20 loads a row and
// block against ~34 and ~14, for 6 fewer multiplies: the vector pipes' total holds this loop, not its multiplies).
//
// Part 2, the loop over one weight block's activation rows of _rows_x8 for Q4_1 (ns per 8 weight rows x 32 values x
// 1 activation row, 16 rows of K = 576 from L1), copied from Numba's machine code for it (the 8 code vectors in
// ymm0-7, d in ymm8, m in ymm9): per row 8 vpbroadcastd of the row's quants, 8 vpmaddubsw summed in int16, one
// vpmaddwd by ones (a constant-pool load), then the d-term (broadcast the row's d, times the block's d, FMA into the
// row's accumulator in L1, store) and Q4_1's m-term (broadcast s, FMA, store). Variants: the ones in a register; no
// m-term at all; both; the integer steps only; the 8 quads taken from two vbroadcasti128 by vpshufd instead of 8
// vpbroadcastd (6 loads fewer, 8 shuffles more). The loop's 12 multiplies (8 vpmaddubsw, a vpmaddwd, a vmulps, two
// FMAs) bound it at 6 cycles, ~1.9 ns, its 13 loads at ~6.5 cycles, ~2.0 ns. The same VM, quiet minutes: the loop
// 2.63-2.78 ns, ones in a register 2.58-2.77, no m-term 2.34-2.42 (the package's kernel cannot drop the m-terms, only
// move them: after the blocks in registers they still take an FMA and a broadcast a row and block, and that version
// of the kernel ran 0.75-1.13x on SmolLM2's products at 3-32 rows in one process, the two trees in turn, with no
// steady gain on the larger ones), both 2.32-2.48, integers only 1.80-1.95; the vpshufd quads 2.82-3.03 and
// 1.97-2.14 (the shuffles share the pipes). So ~100 GMAC/s a core at the loop's rate; the package's kernel ran
// SmolLM2's Q4_1 products at 16-64 rows at 81-85 GMAC/s on one thread, in cache. A batched step of 16 SmolLM2
// sequences holds 2.15 G multiply-adds: ~11-13 ms of products on both cores at those rates, where 6x one sequence's
// tokens a second allows the whole step 16 / 6 x 8.5 ms = 22.7 ms. Restructurings modelled in C with gcc -O3 (two
// groups of weight rows per broadcast with the second group's codes in L1, quants + 128 against signed codes,
// broadcasts laid out in memory as vpmaddubsw's operands) ran 0.9-1.15x the loop's time and were not written into the
// package.
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define X12(op) op(0, 0) op(1, 4) op(2, 8) op(3, 12) op(4, 16) op(5, 20) op(6, 24) op(7, 28) op(8, 32) op(9, 36) \
    op(10, 40) op(11, 44)
#define UB(k, o) "vpmaddubsw %%ymm15, %%ymm" #k ", %%ymm" #k "\n\t"
#define WD(k, o) "vpmaddwd %%ymm15, %%ymm" #k ", %%ymm" #k "\n\t"
#define FM(k, o) "vfmadd231ps %%ymm15, %%ymm14, %%ymm" #k "\n\t"
#define AD(k, o) "vpaddw %%ymm15, %%ymm" #k ", %%ymm" #k "\n\t"
#define SG(k, o) "vpsignb %%ymm15, %%ymm" #k ", %%ymm" #k "\n\t"
#define BD(k, o) "vpbroadcastd " #o "(%0), %%ymm" #k "\n\t"
#define LD(k, o) "vmovdqu " #o "*8(%0), %%ymm" #k "\n\t"
#define REGS "ymm0", "ymm1", "ymm2", "ymm3", "ymm4", "ymm5", "ymm6", "ymm7", "ymm8", "ymm9", "ymm10", "ymm11", "ymm12"

static char buf[4096] __attribute__((aligned(64)));

#define RATE(name, body, per)                                                                                        \
    {                                                                                                                \
        long n = 20000000;                                                                                           \
        double best = 1e9;                                                                                           \
        for (int rep = 0; rep < 3; rep++) {                                                                          \
            double t = now();                                                                                        \
            for (long k = 0; k < n; k++) __asm__ volatile(body ::"r"(buf) : REGS, "memory");                         \
            t = (now() - t) * 1e9 / (n * (double)(per));                                                             \
            best = t < best ? t : best;                                                                              \
        }                                                                                                            \
        printf("  %-34s %.3f ns\n", name, best);                                                                     \
    }

// ---- Part 2: _rows_x8's row loop (Q4_1, AVX2), as Numba compiled it ----
enum { M = 16, K = 576, NB = 18 };
static signed char X[M * K] __attribute__((aligned(64)));
static float D[M * NB], S[M * NB];
static float ACC[M * 16] __attribute__((aligned(64)));
static short ONES[16] __attribute__((aligned(32))) = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};

#define INT_STEPS(WD_STEP)                                                                                           \
    "vpbroadcastd -28(%%r11), %%ymm10\n\t"                                                                           \
    "vpbroadcastd -12(%%r11), %%ymm11\n\t"                                                                           \
    "vpbroadcastd -8(%%r11), %%ymm12\n\t"                                                                            \
    "decq %%r10\n\t"                                                                                                 \
    "vpmaddubsw %%ymm10, %%ymm0, %%ymm10\n\t"                                                                        \
    "vpmaddubsw %%ymm11, %%ymm1, %%ymm11\n\t"                                                                        \
    "vpmaddubsw %%ymm12, %%ymm3, %%ymm12\n\t"                                                                        \
    "vpaddw %%ymm10, %%ymm11, %%ymm10\n\t"                                                                           \
    "vpbroadcastd -24(%%r11), %%ymm11\n\t"                                                                           \
    "vpmaddubsw %%ymm11, %%ymm2, %%ymm11\n\t"                                                                        \
    "vpaddw %%ymm12, %%ymm11, %%ymm11\n\t"                                                                           \
    "vpbroadcastd -4(%%r11), %%ymm12\n\t"                                                                            \
    "vpaddw %%ymm11, %%ymm10, %%ymm10\n\t"                                                                           \
    "vpbroadcastd -20(%%r11), %%ymm11\n\t"                                                                           \
    "vpmaddubsw %%ymm12, %%ymm5, %%ymm12\n\t"                                                                        \
    "vpmaddubsw %%ymm11, %%ymm4, %%ymm11\n\t"                                                                        \
    "vpaddw %%ymm12, %%ymm11, %%ymm11\n\t"                                                                           \
    "vpbroadcastd -16(%%r11), %%ymm12\n\t"                                                                           \
    "vpmaddubsw %%ymm12, %%ymm6, %%ymm12\n\t"                                                                        \
    "vpaddw %%ymm12, %%ymm11, %%ymm11\n\t"                                                                           \
    "vpaddw %%ymm11, %%ymm10, %%ymm10\n\t"                                                                           \
    "vpbroadcastd (%%r11), %%ymm11\n\t"                                                                              \
    "addq %[K], %%r11\n\t"                                                                                           \
    "vpmaddubsw %%ymm11, %%ymm7, %%ymm11\n\t"                                                                        \
    "vpaddw %%ymm11, %%ymm10, %%ymm10\n\t" WD_STEP
#define INT_SHUF(WD_STEP) \
    "vbroadcasti128 -28(%%r11), %%ymm13\n\t" \
    "vpshufd $0x00, %%ymm13, %%ymm10\n\t" \
    "vpshufd $0x55, %%ymm13, %%ymm12\n\t" \
    "decq %%r10\n\t" \
    "vpmaddubsw %%ymm10, %%ymm0, %%ymm10\n\t" \
    "vpmaddubsw %%ymm12, %%ymm2, %%ymm12\n\t" \
    "vpaddw %%ymm10, %%ymm12, %%ymm10\n\t" \
    "vpshufd $0xAA, %%ymm13, %%ymm12\n\t" \
    "vpmaddubsw %%ymm12, %%ymm4, %%ymm12\n\t" \
    "vpaddw %%ymm10, %%ymm12, %%ymm10\n\t" \
    "vpshufd $0xFF, %%ymm13, %%ymm12\n\t" \
    "vpmaddubsw %%ymm12, %%ymm6, %%ymm12\n\t" \
    "vpaddw %%ymm10, %%ymm12, %%ymm10\n\t" \
    "vbroadcasti128 -12(%%r11), %%ymm13\n\t" \
    "vpshufd $0x00, %%ymm13, %%ymm11\n\t" \
    "vpshufd $0x55, %%ymm13, %%ymm12\n\t" \
    "vpmaddubsw %%ymm11, %%ymm1, %%ymm11\n\t" \
    "vpmaddubsw %%ymm12, %%ymm3, %%ymm12\n\t" \
    "vpaddw %%ymm11, %%ymm12, %%ymm11\n\t" \
    "vpshufd $0xAA, %%ymm13, %%ymm12\n\t" \
    "vpmaddubsw %%ymm12, %%ymm5, %%ymm12\n\t" \
    "vpaddw %%ymm11, %%ymm12, %%ymm11\n\t" \
    "vpshufd $0xFF, %%ymm13, %%ymm12\n\t" \
    "vpmaddubsw %%ymm12, %%ymm7, %%ymm12\n\t" \
    "vpaddw %%ymm11, %%ymm12, %%ymm11\n\t" \
    "addq %[K], %%r11\n\t" \
    "vpaddw %%ymm11, %%ymm10, %%ymm10\n\t" WD_STEP
#define WD_MEM "vpmaddwd (%[ones]), %%ymm10, %%ymm10\n\t"
#define WD_REG "vpmaddwd %%ymm14, %%ymm10, %%ymm10\n\t"
#define D_TERM                                                                                                       \
    "vbroadcastss (%[d],%%rax), %%ymm11\n\t"                                                                         \
    "vmulps %%ymm8, %%ymm11, %%ymm11\n\t"                                                                            \
    "vcvtdq2ps %%ymm10, %%ymm10\n\t"                                                                                 \
    "vfmadd213ps -32(%%r9), %%ymm10, %%ymm11\n\t"                                                                    \
    "vmovups %%ymm11, -32(%%r9)\n\t"
#define M_TERM                                                                                                       \
    "vbroadcastss (%[s],%%rax), %%ymm10\n\t"                                                                         \
    "vfmadd213ps (%%r9), %%ymm9, %%ymm10\n\t"                                                                        \
    "vmovups %%ymm10, (%%r9)\n\t"
#define INT_ONLY "vmovups %%ymm10, -32(%%r9)\n\t"
#define LOOP_END                                                                                                     \
    "addq %[st], %%rax\n\t"                                                                                          \
    "addq $64, %%r9\n\t"                                                                                             \
    "cmpq $1, %%r10\n\t"                                                                                             \
    "jg 1b\n\t"

#define ROW_LOOP(name, body)                                                                                         \
    static double name(void) {                                                                                       \
        long reps = 1000000;                                                                                         \
        double best = 1e9;                                                                                           \
        __asm__ volatile("vmovdqa (%0), %%ymm14" ::"r"(ONES) : "ymm14");                                             \
        for (int rep = 0; rep < 3; rep++) {                                                                          \
            double t = now();                                                                                        \
            for (long k = 0; k < reps; k++) {                                                                        \
                register long r10 __asm__("r10") = M + 1;                                                            \
                register char *r11 __asm__("r11") = (char *)X + 28;                                                  \
                register char *r9 __asm__("r9") = (char *)ACC + 32;                                                  \
                register long rax __asm__("rax") = 0;                                                                \
                __asm__ volatile("1:\n\t" body LOOP_END                                                              \
                                 : "+r"(r10), "+r"(r11), "+r"(r9), "+r"(rax)                                         \
                                 : [K] "r"((long)K), [ones] "r"(ONES), [d] "r"(D), [s] "r"(S),                       \
                                   [st] "r"((long)NB * 4)                                                            \
                                 : "ymm10", "ymm11", "ymm12", "ymm13", "memory", "cc");                               \
            }                                                                                                        \
            t = (now() - t) * 1e9 / (reps * (double)M);                                                              \
            best = t < best ? t : best;                                                                              \
        }                                                                                                            \
        return best;                                                                                                 \
    }

ROW_LOOP(loop_as_compiled, INT_STEPS(WD_MEM) D_TERM M_TERM)
ROW_LOOP(loop_ones_in_register, INT_STEPS(WD_REG) D_TERM M_TERM)
ROW_LOOP(loop_no_m_term, INT_STEPS(WD_MEM) D_TERM)
ROW_LOOP(loop_ones_reg_no_m, INT_STEPS(WD_REG) D_TERM)
ROW_LOOP(loop_integers_only, INT_STEPS(WD_MEM) INT_ONLY)
ROW_LOOP(loop_vpshufd, INT_SHUF(WD_REG) D_TERM M_TERM)
ROW_LOOP(loop_vpshufd_integers, INT_SHUF(WD_REG) INT_ONLY)

int main(void) {
    __asm__ volatile("vpxor %%ymm15, %%ymm15, %%ymm15\n\tvpxor %%ymm14, %%ymm14, %%ymm14" ::: "ymm14", "ymm15");
    printf("Part 1, ns per instruction (best of 3):\n");
    RATE("vpmaddubsw", X12(UB), 12)
    RATE("vpmaddwd", X12(WD), 12)
    RATE("vfmadd231ps", X12(FM), 12)
    RATE("vpaddw", X12(AD), 12)
    RATE("vpmaddubsw and vfmadd231ps in turn", UB(0, 0) FM(1, 0) UB(2, 0) FM(3, 0) UB(4, 0) FM(5, 0) UB(6, 0) FM(7, 0)
         UB(8, 0) FM(9, 0) UB(10, 0) FM(11, 0), 12)
    RATE("vpsignb", X12(SG), 12)
    RATE("vpmaddubsw and vpsignb in turn", UB(0, 0) SG(1, 0) UB(2, 0) SG(3, 0) UB(4, 0) SG(5, 0) UB(6, 0) SG(7, 0)
         UB(8, 0) SG(9, 0) UB(10, 0) SG(11, 0), 12)
    RATE("vpbroadcastd ymm, m32", X12(BD), 12)
    RATE("vmovdqu ymm, m256", X12(LD), 12)
    printf("Part 2, _rows_x8's row loop (Q4_1), ns per 8 weight rows x 32 values x 1 row (best of 3):\n");
    for (int round = 0; round < 2; round++) {
        printf("  as compiled %.3f | ones in a register %.3f | no m-term %.3f | both %.3f | integers only %.3f\n",
               loop_as_compiled(), loop_ones_in_register(), loop_no_m_term(), loop_ones_reg_no_m(),
               loop_integers_only());
        printf("  quads by vpshufd from two 16-byte loads (ones in a register): %.3f, integers only %.3f\n",
               loop_vpshufd(), loop_vpshufd_integers());
    }
    return 0;
}
