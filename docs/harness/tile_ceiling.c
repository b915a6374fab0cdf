/* tile_ceiling.c: how fast a prompt tile's inner loop can go on this core, against the
 * register-only FMA peak (docs/speed.md, "the Q8_0 prompt's ceiling").
 *
 *   gcc -O3 -march=native -o /tmp/tile_ceiling docs/harness/tile_ceiling.c && /tmp/tile_ceiling
 *
 * Needs AVX-512F (zmm tiles, as asm/fast512.asm's tile8). One thread. Each figure is the
 * fused multiply-adds a second of one sweep (24 rows x 48 tokens of n columns, each (row,
 * token) summed into one zmm accumulator and reduced at the end, as the engine's tiles do),
 * the fastest of 100 sweeps, over the peak of ten independent vfmadd231ps zmm chains on
 * registers (the bench's FMA loop). Tiles: R rows x T tokens; the weights FP16 (converted
 * in the loop), Q8_0 (int8 q sign-extended, converted, times the block's scale: the
 * engine's three operations per 16 weights), float32 (no conversion at all), float32 after
 * dequantizing the Q8_0 rows once per sweep, and float32 with x held in registers (four
 * broadcasts the compiler keeps out of the loop; no x loads: not a product, a bound on what
 * the weights' loads leave of the peak). Values are arbitrary: the timing does not depend
 * on them. */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define ROWS 24
#define TOK 48
float out[TOK * ROWS];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* A sweep of R x T tiles; LOAD(r, j) gives row r's 16 weights at column j. */
#define TILE(NAME, R, T, ARGS, SETUP, LOAD, XLOAD)                                          \
    __attribute__((noinline)) void NAME ARGS {                                              \
        for (int t0 = 0; t0 + T <= TOK; t0 += T)                                            \
            for (int r0 = 0; r0 + R <= ROWS; r0 += R) {                                     \
                __m512 a[R * T], d[R] __attribute__((unused));                             \
                for (int i = 0; i < R * T; i++) a[i] = _mm512_setzero_ps();                 \
                for (int r = 0; r < R; r++) d[r] = _mm512_setzero_ps();                     \
                for (int j = 0; j < n; j += 16) {                                           \
                    __m512 w[R];                                                            \
                    SETUP;                                                                  \
                    for (int r = 0; r < R; r++) w[r] = LOAD;                                \
                    for (int t = 0; t < T; t++) {                                           \
                        __m512 xv = XLOAD;                                                  \
                        for (int r = 0; r < R; r++)                                         \
                            a[r * T + t] = _mm512_fmadd_ps(w[r], xv, a[r * T + t]);         \
                    }                                                                       \
                }                                                                           \
                for (int i = 0; i < R * T; i++)                                             \
                    out[(t0 + i % T) * ROWS + r0 + i / T] = _mm512_reduce_add_ps(a[i]);     \
            }                                                                               \
    }
#define X _mm512_loadu_ps(x + (t0 + t) * n + j)
#define F16(R, T, NAME) TILE(NAME, R, T, (const uint16_t *W, const float *x, int n), ,      \
    _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(W + (r0 + r) * n + j))), X)
#define Q8(R, T, NAME) TILE(NAME, R, T, (const int8_t *Q, const float *S, const float *x, int n), \
    if (!(j & 16)) for (int r = 0; r < R; r++) d[r] = _mm512_set1_ps(S[((r0 + r) * n + j) >> 5]), \
    _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(                                   \
        _mm_loadu_si128((const void *)(Q + (r0 + r) * n + j)))), d[r]), X)
#define F32(R, T, NAME, XL) TILE(NAME, R, T, (const float *F, const float *x, int n), ,     \
    _mm512_loadu_ps(F + (r0 + r) * n + j), XL)

F16(4, 4, f16_4x4) F16(3, 8, f16_3x8)
Q8(4, 4, q8_4x4) Q8(3, 8, q8_3x8) Q8(4, 6, q8_4x6)
F32(4, 4, f32_4x4, X) F32(4, 4, f32_4x4_xreg, _mm512_set1_ps(x[t0 + t]))

__attribute__((noinline)) void dequant(const int8_t *Q, const float *S, float *F, int n) {
    for (int i = 0; i < ROWS * n; i += 16)
        _mm512_storeu_ps(F + i, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
            _mm_loadu_si128((const void *)(Q + i)))), _mm512_set1_ps(S[i >> 5])));
}

static double peak(void) {
    double best = 1e30;
    for (int r = 0; r < 20; r++) {
        double t = now();
        __asm__ volatile(
            "mov $1000000, %%rcx\n1:\n"
            "vfmadd231ps %%zmm1, %%zmm2, %%zmm3\n vfmadd231ps %%zmm1, %%zmm2, %%zmm4\n"
            "vfmadd231ps %%zmm1, %%zmm2, %%zmm5\n vfmadd231ps %%zmm1, %%zmm2, %%zmm6\n"
            "vfmadd231ps %%zmm1, %%zmm2, %%zmm7\n vfmadd231ps %%zmm1, %%zmm2, %%zmm8\n"
            "vfmadd231ps %%zmm1, %%zmm2, %%zmm9\n vfmadd231ps %%zmm1, %%zmm2, %%zmm10\n"
            "vfmadd231ps %%zmm1, %%zmm2, %%zmm11\n vfmadd231ps %%zmm1, %%zmm2, %%zmm12\n"
            "dec %%rcx\n jnz 1b"
            ::: "rcx", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
                "xmm11", "xmm12");
        t = now() - t;
        if (t < best) best = t;
    }
    return 10e6 / best;
}

int main(void) {
    static const int ns[] = {640, 2048, 16384};
    static const char *names[] = {"FP16 4x4", "FP16 3x8", "Q8_0 4x4", "Q8_0 3x8", "Q8_0 4x6",
                                  "f32 4x4", "Q8_0 dequantized once + f32 4x4",
                                  "f32 4x4, x in registers"};
    double pk = peak();
    printf("FMA peak (zmm, registers only): %.3f G fused multiply-adds/s\n", pk / 1e9);
    for (int k = 0; k < 3; k++) {
        int n = ns[k];
        uint16_t *W = aligned_alloc(64, ROWS * n * 2);
        int8_t *Q = aligned_alloc(64, ROWS * n);
        float *S = aligned_alloc(64, ROWS * n / 32 * 4), *F = aligned_alloc(64, ROWS * n * 4);
        float *x = aligned_alloc(64, TOK * n * 4);
        for (int i = 0; i < ROWS * n; i++) W[i] = 0x3c00, Q[i] = i % 9 - 4, F[i] = 1;
        for (int i = 0; i < ROWS * n / 32; i++) S[i] = 0.01f;
        for (int i = 0; i < TOK * n; i++) x[i] = 0.5f;
        double best[8];
        for (int i = 0; i < 8; i++) best[i] = 1e30;
        for (int r = 0; r < 100; r++) {
            double t[9];
            t[0] = now(); f16_4x4(W, x, n);
            t[1] = now(); f16_3x8(W, x, n);
            t[2] = now(); q8_4x4(Q, S, x, n);
            t[3] = now(); q8_3x8(Q, S, x, n);
            t[4] = now(); q8_4x6(Q, S, x, n);
            t[5] = now(); f32_4x4(F, x, n);
            t[6] = now(); dequant(Q, S, F, n); f32_4x4(F, x, n);
            t[7] = now(); f32_4x4_xreg(F, x, n);
            t[8] = now();
            for (int i = 0; i < 8; i++)
                if (t[i + 1] - t[i] < best[i]) best[i] = t[i + 1] - t[i];
        }
        double fmas = (double)ROWS * TOK * n / 16;
        printf("n = %5d:", n);
        for (int i = 0; i < 8; i++) printf("  %s %.3f%s", names[i], fmas / best[i] / pk, i < 7 ? "," : "\n");
        free(W), free(Q), free(S), free(F), free(x);
    }
    return 0;
}
