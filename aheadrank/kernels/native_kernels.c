/* aheadrank's native kernels (rankers/native.py compiles this file on first use; -O3 -march=native -ffast-math).
   Callers check the limits below (an entry point returns -1, writing nothing, for arguments outside them); every
   array is contiguous. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAXQ 64 /* query terms: at most LANES */
#define MAXK 32 /* kernels */
#define MAXR 4  /* distinct chain ratios */
#define LANES 64 /* values per block: MAXQ */
#define SIMD _Pragma("omp simd")

/* TK's kernel stage, chained (rankers/tk.py: KernelChain), one pass over each document's cosines.
   m [B, Td, Tq]: cosines (clamped into [-mlim, mlim], as the PyTorch stage does), row j of document b
   contiguous over the query terms; mask [B, Td]: nonzero = a real term. out [B, K, Tq]: per kernel and query
   term, the sum over the document's terms j of
     anchor:  K_a = keep_j * exp(c * (m - mu_a)^2)                   (c = -1 / 2 sigma^2)
     step s:  K_kern[s] = max(K_prev[s] * ratio[ridx[s]], lo[s])
   where ratio q is exp(rdelta[q] * m) (rop 0), the square of ratio rsrc[q] (rop 1: its delta doubled) or the
   reciprocal of ratio rsrc[q] (rop 2: its delta negated), rsrc[q] < q; each sum times gain[k] (the chain's
   constant factor: 1 for the anchor). As in the PyTorch stage a padding term's chained values sit at their
   floor (1e-30 after the gain); rows after a document's last real term are not visited.
   A document's values are taken LANES at a time as one flat run of whole rows (LANES / Tq rows): every
   element is independent, so the chain's multiply-floor-add steps run on several vectors at once instead of
   waiting on each other, and every inner loop has a fixed trip count (one libmvec expf call per pass). */
struct chain {
    int64_t K, anchor, R, S;
    float mu_a, c, mlim;
    const float *rdelta, *lo, *gain;
    const int64_t *rop, *rsrc, *kern, *prev, *ridx;
};

/* One document's kernel sums: m [Td, Tq] (row j contiguous), mb [Td] mask -> out [K, Tq]. */
static void doc_kernel_sums(const struct chain *ch, const float *m, const uint8_t *mb, int64_t Td, int64_t Tq,
                            float *out) {
    float val[MAXK][LANES] __attribute__((aligned(64)));
    float r[MAXR][LANES] __attribute__((aligned(64)));
    float acc[MAXK][LANES] __attribute__((aligned(64)));
    float x[LANES] __attribute__((aligned(64)));
    float keep[LANES] __attribute__((aligned(64)));
    const int64_t rows = LANES / Tq; /* whole rows per block (Tq <= MAXQ = LANES) */
    const int64_t width = rows * Tq;
    const float mlim = ch->mlim, mu_a = ch->mu_a, c = ch->c;
    const int64_t anchor = ch->anchor;
    int64_t td = Td;
    while (td > 0 && !mb[td - 1]) td--;
    memset(acc, 0, sizeof(acc));
    for (int64_t j0 = 0; j0 < td; j0 += rows) {
        const int64_t n = (td - j0 < rows ? td - j0 : rows) * Tq; /* real values in this block */
        const float *blk = m + j0 * Tq;
        int whole = n == width;
        for (int64_t j = j0; whole && j < j0 + rows; j++) whole = mb[j] != 0;
        if (whole) { /* the usual block: every value real */
            SIMD for (int64_t l = 0; l < LANES; l++) {
                const float v = l < width ? blk[l] : 0.0f;
                x[l] = v < -mlim ? -mlim : (v > mlim ? mlim : v);
                keep[l] = 1.0f;
            }
        } else {
            for (int64_t l = 0; l < LANES; l++) {
                const int in = l < n;
                const float v = in ? blk[l] : 0.0f;
                x[l] = v < -mlim ? -mlim : (v > mlim ? mlim : v);
                keep[l] = in && mb[j0 + l / Tq] ? 1.0f : 0.0f;
            }
        }
        SIMD for (int64_t l = 0; l < LANES; l++) {
            const float t = x[l] - mu_a;
            val[anchor][l] = keep[l] * expf(c * t * t);
            acc[anchor][l] += val[anchor][l];
        }
        for (int64_t q = 0; q < ch->R; q++) {
            const float d = ch->rdelta[q];
            const float *from = r[ch->rsrc[q]];
            if (ch->rop[q] == 1) {
                SIMD for (int64_t l = 0; l < LANES; l++) r[q][l] = from[l] * from[l];
            } else if (ch->rop[q] == 2) {
                SIMD for (int64_t l = 0; l < LANES; l++) r[q][l] = 1.0f / from[l];
            } else {
                SIMD for (int64_t l = 0; l < LANES; l++) r[q][l] = expf(d * x[l]);
            }
        }
        for (int64_t s = 0; s < ch->S; s++) {
            const float *src = val[ch->prev[s]], *rr = r[ch->ridx[s]];
            float *dst = val[ch->kern[s]], *a = acc[ch->kern[s]];
            const float floor_s = ch->lo[s];
            SIMD for (int64_t l = 0; l < LANES; l++) {
                float v = src[l] * rr[l];
                v = v < floor_s ? floor_s : v;
                dst[l] = v;
                a[l] += v;
            }
        }
    }
    for (int64_t k = 0; k < ch->K; k++) {
        for (int64_t i = 0; i < Tq; i++) {
            float sum = 0.0f;
            for (int64_t l = i; l < width; l += Tq) sum += acc[k][l];
            out[k * Tq + i] = sum * ch->gain[k];
        }
    }
}

int tk_kernel_sums(const float *m, const uint8_t *mask, int64_t B, int64_t Td, int64_t Tq, int64_t K,
                    int64_t anchor, float mu_a, float c, float mlim, int64_t R, const float *rdelta,
                    const int64_t *rop, const int64_t *rsrc, int64_t S, const int64_t *kern,
                    const int64_t *prev, const int64_t *ridx, const float *lo, const float *gain, float *out,
                    int64_t threads) {
    const struct chain ch = {K, anchor, R, S, mu_a, c, mlim, rdelta, lo, gain, rop, rsrc, kern, prev, ridx};
    if (Tq < 1 || Tq > MAXQ || K > MAXK || R > MAXR || threads < 1) return -1; /* never divide by 0 */
#pragma omp parallel for num_threads(threads) schedule(dynamic, 8)
    for (int64_t b = 0; b < B; b++) doc_kernel_sums(&ch, m + b * Td * Tq, mask + b * Td, Td, Tq, out + b * K * Tq);
    return 0;
}

/* ---------------------------------------------------------------------------------------------------------------
   Attention of a few query rows over each document's keys and values, read in their own dtype (rankers/blocks.py:
   context_native: MORES' Reuse-S2 cross-attention over the stored fields, the interaction blocks' self-attention
   over each document's query rows, the query encoders, PreTTR's folded [CLS] rows). Per document and head: the
   head's key and value rows of the document's real tokens are widened once into an L1/L2-resident scratch, the
   scores of every query row are computed with the query rows across the vector lanes (q transposed: one broadcast
   key value times a vector of query values), the softmax over the keys runs down those lanes (att_exp), and the
   weighted sum of the values runs over the head dimension for a block of query rows at a time. No float32 copy of
   the candidates' keys and values is made, and padding tokens are skipped rather than masked.
   q [Bq, H, Tq, dh] float32, already scaled (Bq = 1: the same rows for every document, else B); k, v [B, T, H*dh]
   float16 (kind 0), bfloat16 (kind 1), int8 (kind 2, times ks / vs [B, T], one scale per token) or float32
   (kind 3); v may be k itself (widened once); mask [B, T] (nonzero: a real token) or NULL; out [B, Tq, H*dh]
   float32; lse [B, H, Tq] or NULL: log sum_t e^score per row, for merging with scores over other keys;
   ks / vs may
   scale float16, bfloat16 and float32 keys / values per token too (int8: they are its scales). xq [Tq] (or NULL):
   an extra value per key (H = 1, the keys being the values): key j is its stored row (times its scale) followed
   by x_j, row i's coefficient on x_j is xq[i] (already scaled), and the output rows are dh + 1 wide, column dh
   holding the weighted sum of x_j (PreTTR's folded decompression: keys and values [r_j / sigma_j, 1 / sigma_j],
   no padding); x_j is xcol[b, j] ([B, T]), or, with quad [2 dh + 3] = (diag, g2, bb, 1/n, eps) instead, computed
   from the widened row r_j itself, x_j = 1 / sqrt(max(r_j.(diag * r_j + g2) + bb, 0) / n + eps), the row then
   multiplied by x_j (PreTTR's 1/sigma_j in a canonical basis: no per-token pass outside the kernel).
   The documents split over `threads` OpenMP threads. A document
   without a real token gets zeros (and lse -1e30).
   Limits: dh a multiple of 16 up to ATT_MAXDH (32 and multiples of 64 run the widest blocks), 1 <= Tq <= ATT_ROWS,
   T <= ATT_MAXT; AVX-512F builds only
   (elsewhere the entry point returns -1 and the caller runs PyTorch's code). */
#define ATT_ROWS 32
#define ATT_MAXT 4096
#define ATT_MAXDH 512
#define ATT_PREFETCH 16 /* rows ahead the widening prefetches (d = 493, keys in memory: 1.11x the kernel; 4: 1.01x, 8: 1.05x) */
#define ATT_NEXT_HINT _MM_HINT_T1
#define ATT_KEYS 8 /* keys per block of the score stage: 8 x 2 accumulators hide the FMA latency (4: 1.17x slower) */
#if defined(__AVX512F__)
#include <immintrin.h>
#include <stdlib.h>

/* 64-byte aligned memory for n bytes: aligned_alloc wants a size that is a multiple of the alignment (C11) */
static inline void *att_alloc(size_t n) { return aligned_alloc(64, (n + 63) & ~(size_t)63); }

/* bytes per stored value of a kind */
static inline size_t att_elem(int64_t kind) { return kind == 2 ? 1 : (kind == 3 ? 4 : 2); }

static inline __m512 att_load16(const void *src, int64_t off, int64_t kind, float scale) {
    if (kind == 3) return _mm512_loadu_ps((const float *)src + off);
    if (kind == 0) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)src + off)));
    if (kind == 1)
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)src + off))), 16));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((const int8_t *)src + off)))),
                         _mm512_set1_ps(scale));
}

/* 16 stored values times their token's scale where one is given (int8: its own scale, applied by att_load16) */
static inline __m512 att_scaled16(const void *src, int64_t off, int64_t kind, float scale, int given) {
    const __m512 x = att_load16(src, off, kind, scale);
    return given && kind != 2 ? _mm512_mul_ps(x, _mm512_set1_ps(scale)) : x;
}

/* e^x for x <= 0 (a score minus its row's maximum): x = n·ln2 + r, |r| <= ln2 / 2 (Cody-Waite, two constants),
   e^r by its degree-6 Taylor polynomial (relative error < 2e-7), times 2^n by scalef (0 below e^-87). 1.1x the
   whole kernel's speed of libmvec's expf, whose accuracy the attention does not need beyond float32 rounding. */
static inline __m512 att_exp(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* Rows i0 .. i0 + RB - 1 (those below Tq stored) of the weighted sum, value vectors d0 .. d0 + ND - 1: RB x ND
   accumulators over the nv keys; s [nv][ATT_ROWS] holds e^score (lanes up to i0 + RB <= ATT_ROWS are read). */
static inline __attribute__((always_inline)) void att_pv(const int ND, const int RB, const float *vb, const float *s,
                                                          const float *sum, int64_t nv, int64_t dh, int64_t d0,
                                                          int64_t i0, int64_t Tq, int64_t n, int64_t col,
                                                          float *out) {
    __m512 acc[24][4];
    for (int r = 0; r < RB; r++)
        for (int d = 0; d < ND; d++) acc[r][d] = _mm512_setzero_ps();
    for (int64_t u = 0; u < nv; u++) {
        __m512 vv[4];
        for (int d = 0; d < ND; d++) vv[d] = _mm512_load_ps(vb + u * dh + 16 * (d0 + d));
        for (int r = 0; r < RB; r++) {
            const __m512 p = _mm512_set1_ps(s[u * ATT_ROWS + i0 + r]);
            for (int d = 0; d < ND; d++) acc[r][d] = _mm512_fmadd_ps(p, vv[d], acc[r][d]);
        }
    }
    for (int r = 0; r < RB && i0 + r < Tq; r++) {
        const __m512 inv = _mm512_set1_ps(1.0f / sum[i0 + r]);
        for (int d = 0; d < ND; d++)
            _mm512_storeu_ps(out + (i0 + r) * n + col + 16 * (d0 + d), _mm512_mul_ps(acc[r][d], inv));
    }
}

/* Scores s[t][i] = q_i . k_t of keys 0 .. nv - 1 (nv a multiple of ATT_KEYS) from the widened rows kb [nv][dh] and
   the query rows transposed qt [dh][ATT_ROWS] (NQ vectors of rows), ATT_KEYS keys at a time. A function of its
   own, each key row behind its own pointer: inlined into att_head, with its dozens of live values, GCC kept the
   eight rows' offsets in vector registers and moved one to a general register before every multiply-add (half
   the kernel's time at dh = 384, perf annotate); here the loop runs at the FMA rate. */
static inline __attribute__((always_inline)) void att_scores_keys(const int NQ, const float *kb, int64_t dh,
                                                                   const float *qt, float *s, int64_t nv) {
    for (int64_t t = 0; t < nv; t += ATT_KEYS) {
        const float *p[ATT_KEYS];
        for (int r = 0; r < ATT_KEYS; r++) p[r] = kb + (t + r) * dh;
        __m512 acc[ATT_KEYS][2];
        for (int r = 0; r < ATT_KEYS; r++)
            for (int q = 0; q < NQ; q++) acc[r][q] = _mm512_setzero_ps();
        for (int64_t c = 0; c < dh; c++) {
            __m512 qv[2];
            for (int q = 0; q < NQ; q++) qv[q] = _mm512_load_ps(qt + c * ATT_ROWS + 16 * q);
            for (int r = 0; r < ATT_KEYS; r++) {
                const __m512 kv = _mm512_set1_ps(p[r][c]);
                for (int q = 0; q < NQ; q++) acc[r][q] = _mm512_fmadd_ps(kv, qv[q], acc[r][q]);
            }
        }
        for (int r = 0; r < ATT_KEYS; r++)
            for (int q = 0; q < NQ; q++) _mm512_store_ps(s + (t + r) * ATT_ROWS + 16 * q, acc[r][q]);
    }
}
static __attribute__((noinline)) void att_scores_1(const float *kb, int64_t dh, const float *qt, float *s, int64_t nv) {
    att_scores_keys(1, kb, dh, qt, s, nv);
}
static __attribute__((noinline)) void att_scores_2(const float *kb, int64_t dh, const float *qt, float *s, int64_t nv) {
    att_scores_keys(2, kb, dh, qt, s, nv);
}
static __attribute__((noinline)) void att_scores_1_32(const float *kb, const float *qt, float *s, int64_t nv) {
    att_scores_keys(1, kb, 32, qt, s, nv);
}
static __attribute__((noinline)) void att_scores_2_32(const float *kb, const float *qt, float *s, int64_t nv) {
    att_scores_keys(2, kb, 32, qt, s, nv);
}

/* att_head's prefetches for its widened row t: the row ATT_PREFETCH ahead of the keys (and of v, not NULL), rows
   n apart — a new page every few rows, which hardware prefetch misses — and this row's share (per_row lines) of
   the next document's plines lines from pk (and pv, not NULL), on their way into L2 while this one is computed. */
static inline __attribute__((always_inline)) void att_prefetch_rows(const void *k, const void *v, const int32_t *idx,
                                                                     int64_t t, int64_t nv, int64_t n, int64_t col,
                                                                     size_t elem, size_t row_bytes, const char *pk,
                                                                     const char *pv, int64_t per_row, int64_t plines) {
    if (t + ATT_PREFETCH < nv) {
        const size_t at = (size_t)(idx[t + ATT_PREFETCH] * n + col) * elem;
        for (size_t line = 0; line < row_bytes; line += 64) {
            _mm_prefetch((const char *)k + at + line, _MM_HINT_T0);
            if (v) _mm_prefetch((const char *)v + at + line, _MM_HINT_T0);
        }
    }
    for (int64_t line = t * per_row; line < plines && line < (t + 1) * per_row; line++) {
        _mm_prefetch(pk + line * 64, ATT_NEXT_HINT);
        if (pv) _mm_prefetch(pv + line * 64, ATT_NEXT_HINT);
    }
}

/* ------- Heads 32 wide (MORES' cross-attention: 12 heads, 18 query rows and the mean's), keys across the lanes.
   att_head puts a block of query rows across the 16 lanes: 18 or 19 rows fill 2 vectors to 59 %, and its score
   stage multiplies each key by 32 lanes. Here the keys are widened transposed, 16 to a block (kT [block][32][16]),
   and each query row is broadcast against them: 38 multiply-adds per key instead of 64, the same sums in the same
   order (the scores are bitwise those of att_head; the softmax sums run in another order). The scores sT [row]
   [ATT_ST], then per row a softmax across the lanes and the weighted sum of the values (row-major, as att_head). */
#define ATT_ST 528 /* transposed scores' row stride: keys <= 512 (a stride of 4 KB multiples would put every row's
                      same key in one L1 set) */
static inline void att_transpose16(__m512 r[16]) { /* r[i][j] -> r[j][i] */
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
        const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) {
            t[8 * i + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0x88);
            t[8 * i + 4 + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0xdd);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
        r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xdd);
    }
}
/* Scores of RB query rows q (row-major, 32 apart) against every block of kT, into sT's rows */
static inline __attribute__((always_inline)) void att_scores_t_rows(const int RB, const float *kT, int64_t blocks,
                                                                     const float *q, float *sT) {
    for (int64_t b = 0; b < blocks; b++) {
        const float *kt = kT + b * 512;
        __m512 acc[24];
#pragma GCC unroll 24
        for (int r = 0; r < RB; r++) acc[r] = _mm512_setzero_ps();
        for (int c = 0; c < 32; c++) {
            const __m512 kv = _mm512_load_ps(kt + 16 * c);
            const float *qc = q + c;
#pragma GCC unroll 24
            for (int r = 0; r < RB; r++) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(qc[32 * r]), kv, acc[r]);
        }
#pragma GCC unroll 24
        for (int r = 0; r < RB; r++) _mm512_store_ps(sT + r * ATT_ST + 16 * b, acc[r]);
    }
}
#define ATT_ST_CASE(R)                                  \
    case R:                                             \
        att_scores_t_rows(R, kT, blocks, q + 32 * i0, sT + i0 * ATT_ST); \
        break;
static __attribute__((noinline)) void att_scores_t32(const float *kT, int64_t blocks, const float *q, int64_t Tq,
                                                     float *sT) {
    for (int64_t i0 = 0; i0 < Tq; i0 += 24) {
        switch (Tq - i0 < 24 ? Tq - i0 : 24) {
            ATT_ST_CASE(1) ATT_ST_CASE(2) ATT_ST_CASE(3) ATT_ST_CASE(4) ATT_ST_CASE(5) ATT_ST_CASE(6)
            ATT_ST_CASE(7) ATT_ST_CASE(8) ATT_ST_CASE(9) ATT_ST_CASE(10) ATT_ST_CASE(11) ATT_ST_CASE(12)
            ATT_ST_CASE(13) ATT_ST_CASE(14) ATT_ST_CASE(15) ATT_ST_CASE(16) ATT_ST_CASE(17) ATT_ST_CASE(18)
            ATT_ST_CASE(19) ATT_ST_CASE(20) ATT_ST_CASE(21) ATT_ST_CASE(22) ATT_ST_CASE(23) ATT_ST_CASE(24)
        }
    }
}
#undef ATT_ST_CASE
/* Rows i0 .. i0 + RB - 1 of the weighted sum over the values vb [nv][32], weights e^score in sT's rows */
static inline __attribute__((always_inline)) void att_pv_t_rows(const int RB, const float *vb, const float *sT,
                                                                 const float *sum, int64_t nv, int64_t i0,
                                                                 int64_t ostride, int64_t col, float *out) {
    __m512 a0[12], a1[12];
#pragma GCC unroll 12
    for (int r = 0; r < RB; r++) a0[r] = a1[r] = _mm512_setzero_ps();
    const float *p = sT + i0 * ATT_ST;
    for (int64_t u = 0; u < nv; u++) {
        const __m512 v0 = _mm512_load_ps(vb + 32 * u), v1 = _mm512_load_ps(vb + 32 * u + 16);
#pragma GCC unroll 12
        for (int r = 0; r < RB; r++) {
            const __m512 w = _mm512_set1_ps(p[r * ATT_ST + u]);
            a0[r] = _mm512_fmadd_ps(w, v0, a0[r]);
            a1[r] = _mm512_fmadd_ps(w, v1, a1[r]);
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < RB; r++) {
        const __m512 inv = _mm512_set1_ps(1.0f / sum[i0 + r]);
        float *o = out + (i0 + r) * ostride + col;
        _mm512_storeu_ps(o, _mm512_mul_ps(a0[r], inv));
        _mm512_storeu_ps(o + 16, _mm512_mul_ps(a1[r], inv));
    }
}
#define ATT_PV_CASE(R)                                                 \
    case R:                                                            \
        att_pv_t_rows(R, vb, sT, sum, nv, i0, ostride, col, out); \
        break;
/* One head (dh = 32) of one document as above: the real tokens' keys (idx [nv], nv <= ATT_ST - 16) widened
   transposed into kT, their values into vb, with att_head's prefetches; q [Tq][32] the head's query rows; out and
   lse (or NULL) as att_head's. Keys and values float16, bfloat16, int8 or float32, with their scales. */
static __attribute__((noinline)) void att_head_t32(const float *q, int64_t Tq, const void *k, const void *v,
                                                   const float *ks, const float *vs, int64_t kind,
                                                   const int32_t *idx, int64_t nv, int64_t n, int64_t col,
                                                   float *kT, float *vb, float *sT, float *out, float *lse,
                                                   int64_t ostride, const char *pk, const char *pv,
                                                   int64_t plines) {
    const size_t elem = att_elem(kind);
    const int64_t per_row = (plines + nv - 1) / nv;
    for (int64_t t = 0; t < nv; t++) { /* the values, row-major; the keys' lines on their way */
        const int64_t j = idx[t];
        att_prefetch_rows(k, v, idx, t, nv, n, col, elem, 32 * elem, pk, pv, per_row, plines);
        const float vscale = vs ? vs[j] : 1.0f;
        _mm512_store_ps(vb + 32 * t, att_scaled16(v, j * n + col, kind, vscale, vs != NULL));
        _mm512_store_ps(vb + 32 * t + 16, att_scaled16(v, j * n + col + 16, kind, vscale, vs != NULL));
    }
    const int64_t blocks = (nv + 15) / 16;
    for (int64_t b = 0; b < blocks; b++) /* the keys, 16 to a block, transposed (past nv: zeros) */
        for (int half = 0; half < 2; half++) {
            __m512 r[16];
            for (int i = 0; i < 16; i++) {
                const int64_t t = 16 * b + i;
                if (t < nv) {
                    const int64_t j = idx[t];
                    r[i] = att_scaled16(k, j * n + col + 16 * half, kind, ks ? ks[j] : 1.0f, ks != NULL);
                } else
                    r[i] = _mm512_setzero_ps();
            }
            att_transpose16(r);
            float *o = kT + b * 512 + 256 * half;
            for (int c = 0; c < 16; c++) _mm512_store_ps(o + 16 * c, r[c]);
        }
    att_scores_t32(kT, blocks, q, Tq, sT);
    /* per row: the softmax across the lanes (keys past nv out of the maximum, their weights 0) */
    float sum[ATT_ROWS];
    const int64_t rem = nv - 16 * (blocks - 1);
    const __mmask16 last = rem >= 16 ? 0xFFFF : (__mmask16)((1u << rem) - 1);
    for (int64_t i = 0; i < Tq; i++) {
        float *row = sT + i * ATT_ST;
        __m512 m = _mm512_set1_ps(-INFINITY);
        for (int64_t b = 0; b < blocks; b++) {
            const __m512 x = _mm512_load_ps(row + 16 * b);
            m = b + 1 < blocks ? _mm512_max_ps(m, x) : _mm512_mask_max_ps(m, last, m, x);
        }
        const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(m));
        __m512 acc = _mm512_setzero_ps();
        for (int64_t b = 0; b < blocks; b++) {
            __m512 e = att_exp(_mm512_sub_ps(_mm512_load_ps(row + 16 * b), mx));
            if (b + 1 == blocks) e = _mm512_maskz_mov_ps(last, e);
            _mm512_store_ps(row + 16 * b, e);
            acc = _mm512_add_ps(acc, e);
        }
        sum[i] = _mm512_reduce_add_ps(acc);
        if (lse) lse[i] = _mm512_reduce_max_ps(m) + logf(sum[i]);
    }
    for (int64_t i0 = 0; i0 < Tq; i0 += 12) {
        switch (Tq - i0 < 12 ? Tq - i0 : 12) {
            ATT_PV_CASE(1) ATT_PV_CASE(2) ATT_PV_CASE(3) ATT_PV_CASE(4) ATT_PV_CASE(5) ATT_PV_CASE(6)
            ATT_PV_CASE(7) ATT_PV_CASE(8) ATT_PV_CASE(9) ATT_PV_CASE(10) ATT_PV_CASE(11) ATT_PV_CASE(12)
        }
    }
}
#undef ATT_PV_CASE

/* One head of one document. dh: the head's width (32, or a multiple of 64: PreTTR's folded [CLS] rows read whole
   384-wide states as one head); ND = vectors per chunk of the weighted sum (2 for dh = 32, else 4), NQ = vectors of
   query rows (Tq <= 16 * NQ). qt [dh][ATT_ROWS]: the head's query rows transposed (rows >= Tq zero); idx [nv]: the
   real tokens; same: the values are the keys (widened once). lse (or NULL): per query row, log sum_t e^score. */
static inline __attribute__((always_inline)) void att_head(const int ND, const int NQ, int64_t dh, const float *qt,
                                                            const void *k, const void *v, const float *ks,
                                                            const float *vs, int64_t kind, int same,
                                                            const int32_t *idx, int64_t nv, int64_t n, int64_t col,
                                                            float *kb, float *vb, float *s, float *out,
                                                            float *lse, int64_t Tq, const float *xcol,
                                                            const float *xqt, const float *quad, float *xv,
                                                            int64_t ostride, const char *pk, const char *pv,
                                                            int64_t plines) {
    const int64_t DV = dh / 16;
    const int64_t per_row = (plines + nv - 1) / nv; /* the next document's lines to prefetch per widened row */
    if (same) vb = kb;
    const size_t elem = att_elem(kind);
    for (int64_t t = 0; t < nv; t++) { /* widen the head's key and value rows of the real tokens */
        const int64_t j = idx[t];
        att_prefetch_rows(k, same ? NULL : v, idx, t, nv, n, col, elem, (size_t)dh * elem, pk, pv, per_row, plines);
        const float kscale = ks ? ks[j] : 1.0f, vscale = vs ? vs[j] : 1.0f;
        for (int64_t d = 0; d < DV; d++) {
            _mm512_store_ps(kb + t * dh + 16 * d, att_scaled16(k, j * n + col + 16 * d, kind, kscale, ks != NULL));
            if (!same) _mm512_store_ps(vb + t * dh + 16 * d, att_scaled16(v, j * n + col + 16 * d, kind, vscale, vs != NULL));
        }
        if (quad) { /* x_j = 1 / sqrt(max(r.(diag r + g2) + bb, 0) / n + eps), and the row times x_j */
            float *row = kb + t * dh;
            __m512 acc = _mm512_setzero_ps();
            for (int64_t d = 0; d < dh; d += 16) {
                const __m512 r = _mm512_load_ps(row + d);
                acc = _mm512_fmadd_ps(r, _mm512_fmadd_ps(_mm512_loadu_ps(quad + d), r, _mm512_loadu_ps(quad + dh + d)), acc);
            }
            const float form = _mm512_reduce_add_ps(acc) + quad[2 * dh];
            const float x = 1.0f / sqrtf((form > 0.0f ? form : 0.0f) * quad[2 * dh + 1] + quad[2 * dh + 2]);
            const __m512 xs = _mm512_set1_ps(x);
            for (int64_t d = 0; d < dh; d += 16) _mm512_store_ps(row + d, _mm512_mul_ps(_mm512_load_ps(row + d), xs));
            xv[t] = x;
        } else if (xqt)
            xv[t] = xcol[j];
    }
    /* scores s[t][i] = q_i . k_t, ATT_KEYS keys at a time */
    int64_t t = 0;
    {
        const int64_t blocks = nv / ATT_KEYS * ATT_KEYS;
        if (NQ == 1)
            dh == 32 ? att_scores_1_32(kb, qt, s, blocks) : att_scores_1(kb, dh, qt, s, blocks);
        else
            dh == 32 ? att_scores_2_32(kb, qt, s, blocks) : att_scores_2(kb, dh, qt, s, blocks);
        if (xqt) /* the extra value of each key times each row's coefficient, after its sum over the dims */
            for (; t < blocks; t++) {
                const __m512 kv = _mm512_set1_ps(xv[t]);
                for (int q = 0; q < NQ; q++) {
                    float *st = s + t * ATT_ROWS + 16 * q;
                    _mm512_store_ps(st, _mm512_fmadd_ps(kv, _mm512_load_ps(xqt + 16 * q), _mm512_load_ps(st)));
                }
            }
        t = blocks;
    }
    for (; t < nv; t++) {
        __m512 acc[2];
        for (int q = 0; q < NQ; q++) acc[q] = _mm512_setzero_ps();
        for (int64_t c = 0; c < dh; c++) {
            const __m512 kv = _mm512_set1_ps(kb[t * dh + c]);
            for (int q = 0; q < NQ; q++) acc[q] = _mm512_fmadd_ps(kv, _mm512_load_ps(qt + c * ATT_ROWS + 16 * q), acc[q]);
        }
        if (xqt)
            for (int q = 0; q < NQ; q++) acc[q] = _mm512_fmadd_ps(_mm512_set1_ps(xv[t]), _mm512_load_ps(xqt + 16 * q), acc[q]);
        for (int q = 0; q < NQ; q++) _mm512_store_ps(s + t * ATT_ROWS + 16 * q, acc[q]);
    }
    /* softmax over the keys, down each query row's lane */
    float mx[ATT_ROWS] __attribute__((aligned(64)));
    float sum[ATT_ROWS] __attribute__((aligned(64)));
    const int W = 16 * NQ;
    for (int l = 0; l < W; l++) mx[l] = s[l];
    for (int64_t u = 1; u < nv; u++) {
        const float *row = s + u * ATT_ROWS;
        SIMD for (int l = 0; l < W; l++) mx[l] = row[l] > mx[l] ? row[l] : mx[l];
    }
    {
        __m512 m[2], sm[2];
        for (int q = 0; q < NQ; q++) m[q] = _mm512_load_ps(mx + 16 * q), sm[q] = _mm512_setzero_ps();
        for (int64_t u = 0; u < nv; u++) {
            float *row = s + u * ATT_ROWS;
            for (int q = 0; q < NQ; q++) {
                const __m512 e = att_exp(_mm512_sub_ps(_mm512_load_ps(row + 16 * q), m[q]));
                _mm512_store_ps(row + 16 * q, e);
                sm[q] = _mm512_add_ps(sm[q], e);
            }
        }
        for (int q = 0; q < NQ; q++) _mm512_store_ps(sum + 16 * q, sm[q]);
    }
    if (lse)
        for (int64_t i = 0; i < Tq; i++) lse[i] = mx[i] + logf(sum[i]);
    if (xqt) { /* the extra value's weighted sum, in the output's column dh */
        __m512 xs[2];
        for (int q = 0; q < NQ; q++) xs[q] = _mm512_setzero_ps();
        for (int64_t u = 0; u < nv; u++) {
            const __m512 x = _mm512_set1_ps(xv[u]);
            for (int q = 0; q < NQ; q++) xs[q] = _mm512_fmadd_ps(_mm512_load_ps(s + u * ATT_ROWS + 16 * q), x, xs[q]);
        }
        float xsum[ATT_ROWS] __attribute__((aligned(64)));
        for (int q = 0; q < NQ; q++) _mm512_store_ps(xsum + 16 * q, xs[q]);
        for (int64_t i = 0; i < Tq; i++) out[i * ostride + dh] = xsum[i] / sum[i];
    }
    /* out_i = sum_t p[t][i] v_t / sum_i: a block of query rows and ND vectors of the values at a time (blocks of
       24/ND rows while more than 16/ND are left: 24 accumulators, then 16/ND or 8/ND) */
    for (int64_t d0 = 0; d0 < DV; d0 += ND)
        for (int64_t i0 = 0; i0 < Tq;) {
            const int64_t left = Tq - i0;
            if (left > 16 / ND)
                att_pv(ND, 24 / ND, vb, s, sum, nv, dh, d0, i0, Tq, ostride, col, out);
            else if (left > 8 / ND)
                att_pv(ND, 16 / ND, vb, s, sum, nv, dh, d0, i0, Tq, ostride, col, out);
            else
                att_pv(ND, 8 / ND, vb, s, sum, nv, dh, d0, i0, Tq, ostride, col, out);
            i0 += left > 16 / ND ? 24 / ND : (left > 8 / ND ? 16 / ND : 8 / ND);
        }
}

int cross_attention(const float *q, int64_t Bq, const void *k, const void *v, const float *ks, const float *vs,
                    int64_t kind, const uint8_t *mask, int64_t B, int64_t T, int64_t H, int64_t dh, int64_t Tq,
                    float *out, float *lse, const float *xcol,
                    const float *xq, const float *quad, int64_t threads) {
    const int extra = xq != NULL;
    if (dh < 16 || dh % 16 || dh > ATT_MAXDH || Tq < 1 || Tq > ATT_ROWS || T < 1 || T > ATT_MAXT || kind < 0 || kind > 3 ||
        (Bq != 1 && Bq != B) || (kind == 2 && (!ks || !vs)) || threads < 1 ||
        /* an extra value: one head, keys that are the values, no LayerNorm; from xcol or from quad */
        (extra && (H != 1 || k != v || ks != vs || (xcol != NULL) == (quad != NULL) ||
                   (quad && ks && kind != 2))) ||
        (!extra && (xcol || quad)))
        return -1;
    const int64_t n = H * dh, per_q = H * Tq * dh, ostride = n + extra;
    const size_t elem = att_elem(kind);
    const int same = k == v && ks == vs;
    int status = 0;
    /* the documents split over the OpenMP threads of the runtime PyTorch already loaded (same soname): the
       threads that have just run PyTorch's last op take the work, instead of spinning beside threads of ours */
#pragma omp parallel num_threads(threads) reduction(min : status)
    {
        float *kb = att_alloc(sizeof(float) * (size_t)(T * dh));
        float *vb = att_alloc(sizeof(float) * (size_t)(T * dh));
        float *s = att_alloc(sizeof(float) * (size_t)(((T + 16) > ATT_ST ? T + 16 : ATT_ST) * ATT_ROWS));
        float *qt = att_alloc(sizeof(float) * (size_t)(H * dh * ATT_ROWS));
        float *xqt = extra ? att_alloc(sizeof(float) * ATT_ROWS) : NULL; /* the rows' extra coefficients, by lane */
        float *xv = extra ? att_alloc(sizeof(float) * (size_t)T) : NULL; /* each real token's extra value */
        /* heads 32 wide, keys across the lanes (att_head_t32): the keys transposed, the scores in s */
        const int t32 = dh == 32 && !extra && T <= ATT_ST - 16;
        float *kT = t32 ? att_alloc(sizeof(float) * (size_t)((T + 15) / 16 * 512)) : NULL;
        int32_t *idx = malloc(sizeof(int32_t) * (size_t)T);
        const int ok = kb && vb && s && qt && idx && (!extra || (xqt && xv)) && (!t32 || kT);
        if (ok && extra) {
            memset(xqt, 0, sizeof(float) * ATT_ROWS);
            for (int64_t i = 0; i < Tq; i++) xqt[i] = xq[i];
        }
        if (!ok) status = -2;
        int64_t q_doc = -1; /* the document whose query rows qt holds */
#pragma omp for schedule(dynamic, 4) /* a descheduled thread (a busy server) leaves its documents to the others */
        for (int64_t b = 0; b < B; b++) {
            if (!ok) continue;
            float *ob = out + b * Tq * ostride;
            int64_t nv = 0;
            for (int64_t j = 0; j < T; j++)
                if (!mask || mask[b * T + j]) idx[nv++] = (int32_t)j;
            if (nv == 0) { /* zeros */
                memset(ob, 0, sizeof(float) * (size_t)(Tq * ostride));
                if (lse)
                    for (int64_t i = 0; i < H * Tq; i++) lse[b * H * Tq + i] = -1e30f; /* e^lse: 0 */
                continue;
            }
            if (q_doc < 0 || Bq != 1) { /* the query rows transposed per head: once, or per document */
                const float *qb = q + (Bq == 1 ? 0 : b * per_q);
                memset(qt, 0, sizeof(float) * (size_t)(H * dh * ATT_ROWS));
                for (int64_t h = 0; h < H; h++)
                    for (int64_t i = 0; i < Tq; i++)
                        for (int64_t c = 0; c < dh; c++) qt[(h * dh + c) * ATT_ROWS + i] = qb[(h * Tq + i) * dh + c];
                q_doc = b;
            }
            const void *kd = (const char *)k + (size_t)(b * T * n) * elem;
            const void *vd = (const char *)v + (size_t)(b * T * n) * elem;
            const float *xb = xcol ? xcol + b * T : NULL;
            const float *ksb = ks ? ks + b * T : NULL, *vsb = vs ? vs + b * T : NULL;
            /* several heads: the next document's rows (up to its last real token) on their way into L2 while
               this one is computed, a head's share at a time, spread over its widened rows. Read in order, a
               document streams from memory at the machine's bandwidth, where each head's strided rows (a line
               per row and head) leave it latency-bound: MORES 1xIB S2 at d = 493 1.26x the kernel's speed with
               the candidates in memory (scratch A/B), 1.08-1.14x the whole path (bench/online_kernels.py --parts source).
               One head reads whole rows in order already (PreTTR's [CLS] rows: no gain, so none there). */
            int64_t next_lines = 0;
            const char *kn_next = NULL, *vn_next = NULL;
            if (b + 1 < B && H > 1) {
                int64_t last = T;
                if (mask)
                    while (last > 0 && !mask[(b + 1) * T + last - 1]) last--;
                next_lines = (int64_t)(((size_t)(last * n) * elem + 63) / 64);
                kn_next = (const char *)k + (size_t)((b + 1) * T * n) * elem;
                vn_next = same ? NULL : (const char *)v + (size_t)((b + 1) * T * n) * elem;
            }
            for (int64_t h = 0; h < H; h++) {
                const float *qh = qt + h * dh * ATT_ROWS;
                float *lh = lse ? lse + (b * H + h) * Tq : NULL;
                const int64_t l0 = next_lines * h / H, pl = next_lines * (h + 1) / H - l0;
                const char *pk = kn_next ? kn_next + l0 * 64 : NULL, *pv = vn_next ? vn_next + l0 * 64 : NULL;
                if (t32) {
                    const float *qrows = q + (Bq == 1 ? 0 : b * per_q) + h * Tq * dh;
                    att_head_t32(qrows, Tq, kd, vd, ksb, vsb, kind, idx, nv, n, h * dh, kT, vb, s, ob, lh, ostride,
                                 pk, pv, pl);
                    continue;
                }
#define ATT_HEAD(ND, NQ, DH) \
    att_head(ND, NQ, DH, qh, kd, vd, ksb, vsb, kind, same, idx, nv, n, h * dh, kb, vb, s, ob, lh, Tq, \
             xb, xqt, quad, xv, ostride, pk, pv, pl)
                if (dh == 32 && Tq <= 16)
                    ATT_HEAD(2, 1, 32);
                else if (dh == 32)
                    ATT_HEAD(2, 2, 32);
                else if (dh % 64 == 0 && Tq <= 16)
                    ATT_HEAD(4, 1, dh);
                else if (dh % 64 == 0)
                    ATT_HEAD(4, 2, dh);
                else if (Tq <= 16) /* a multiple of 16: one value vector per chunk of the weighted sum */
                    ATT_HEAD(1, 1, dh);
                else
                    ATT_HEAD(1, 2, dh);
#undef ATT_HEAD
            }
        }
        free(kb);
        free(kT);
        free(vb);
        free(s);
        free(qt);
        free(xqt);
        free(xv);
        free(idx);
    }
    return status;
}

/* ---------------------------------------------------------------------------------------------------------------
   TK's cosines and kernel sums in one pass per document, straight from the stored term vectors (rankers/tk.py:
   kernel_sums_stored): no float32 copy of the candidates' vectors and no cosine matrix in memory. Per document,
   TK_ROWS term vectors at a time are widened into an L1-resident scratch and their cosines with every query term
   computed with the query terms across the vector lanes (q transposed once: qt[c][16 * NQ]), into the document's
   [Td, Tq] cosines (the layout tk_kernel_sums reads); doc_kernel_sums then runs the chained kernels over them
   while they are in cache. q [Tq, n] float32 (normalised, as d); d [B, Td, n] float16 (kind 0), bfloat16 (1),
   int8 times ds [B, Td] (2: one scale per term) or float32 (3); mask [B, Td]; out [B, K, Tq] as tk_kernel_sums.
   Padding terms get the cosine 0 (the chain keeps their values at the floor) and their vectors are not read.
   Limits: n a multiple of 16, 1 <= Tq <= MAXQ, Td <= ATT_MAXT, the chain's as tk_kernel_sums'. */
#define TK_ROWS 8 /* term vectors per block: 8 accumulators for up to 16 query terms (12 or 16: slower, the scratch
                     leaves L1), 4 rows at a time for 2-4 vectors of query terms; the next block is prefetched
                     (d = 128, 300 documents in memory: 1.25x the pass) */

static inline __attribute__((always_inline)) void tk_cosine_rows(const int NQ, const int RB, const float *qt,
                                                                  const float *rb, int64_t n, int64_t rows,
                                                                  const float *scale, int64_t Tq, float *m) {
    __m512 acc[TK_ROWS][4];
    for (int r = 0; r < RB; r++)
        for (int g = 0; g < NQ; g++) acc[r][g] = _mm512_setzero_ps();
    for (int64_t c = 0; c < n; c++) {
        __m512 qv[4];
        for (int g = 0; g < NQ; g++) qv[g] = _mm512_load_ps(qt + c * 16 * NQ + 16 * g);
        for (int r = 0; r < RB; r++) {
            const __m512 x = _mm512_set1_ps(rb[r * n + c]);
            for (int g = 0; g < NQ; g++) acc[r][g] = _mm512_fmadd_ps(x, qv[g], acc[r][g]);
        }
    }
    for (int64_t r = 0; r < rows; r++)
        for (int g = 0; g < NQ; g++) {
            const int64_t left = Tq - 16 * g;
            const __mmask16 lanes = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
            _mm512_mask_storeu_ps(m + r * Tq + 16 * g, lanes, _mm512_mul_ps(acc[r][g], _mm512_set1_ps(scale[r])));
        }
}

int tk_stored_sums(const float *q, const void *d, const float *ds, int64_t kind, const uint8_t *mask, int64_t B,
                   int64_t Td, int64_t n, int64_t Tq, int64_t K, int64_t anchor, float mu_a, float c, float mlim,
                   int64_t R, const float *rdelta, const int64_t *rop, const int64_t *rsrc, int64_t S,
                   const int64_t *kern, const int64_t *prev, const int64_t *ridx, const float *lo,
                   const float *gain, float *out, int64_t threads) {
    const struct chain ch = {K, anchor, R, S, mu_a, c, mlim, rdelta, lo, gain, rop, rsrc, kern, prev, ridx};
    if (Tq < 1 || Tq > MAXQ || K > MAXK || R > MAXR || n < 16 || n % 16 || Td < 1 || Td > ATT_MAXT || kind < 0 ||
        kind > 3 || (kind == 2 && !ds) || threads < 1)
        return -1;
    const int NQ = (int)((Tq + 15) / 16);
    const size_t elem = att_elem(kind);
    float *qt = att_alloc(sizeof(float) * (size_t)(n * 16 * NQ)); /* q transposed, terms >= Tq zero */
    if (!qt) return -2;
    memset(qt, 0, sizeof(float) * (size_t)(n * 16 * NQ));
    for (int64_t i = 0; i < Tq; i++)
        for (int64_t k = 0; k < n; k++) qt[k * 16 * NQ + i] = q[i * n + k];
    int status = 0;
#pragma omp parallel num_threads(threads) reduction(min : status)
    {
        float *rb = att_alloc(sizeof(float) * (size_t)(TK_ROWS * n));
        float *m = att_alloc(sizeof(float) * (size_t)(Td * Tq));
        const int ok = rb && m;
        if (!ok) status = -2;
#pragma omp for schedule(dynamic, 8)
        for (int64_t b = 0; b < B; b++) {
            if (!ok) continue;
            const uint8_t *mb = mask + b * Td;
            int64_t td = Td;
            while (td > 0 && !mb[td - 1]) td--;
            const char *db = (const char *)d + (size_t)(b * Td * n) * elem;
            for (int64_t j0 = 0; j0 < td; j0 += TK_ROWS) {
                const int64_t rows = td - j0 < TK_ROWS ? td - j0 : TK_ROWS;
                float scale[TK_ROWS];
                for (int64_t r = 0; r < TK_ROWS; r++) {
                    const int64_t j = j0 + r;
                    const int real = r < rows && mb[j];
                    scale[r] = kind == 2 && real ? ds[b * Td + j] : 1.0f;
                    for (int64_t k = 0; k < n; k += 16)
                        _mm512_store_ps(rb + r * n + k, real ? att_load16(db, j * n + k, kind, 1.0f) : _mm512_setzero_ps());
                }
                /* the next block's vectors on their way while this one's cosines are computed */
                const int64_t next = j0 + TK_ROWS, stop = next + TK_ROWS < td ? next + TK_ROWS : td;
                for (const char *at = db + (size_t)(next * n) * elem; at < db + (size_t)(stop * n) * elem; at += 64)
                    _mm_prefetch(at, _MM_HINT_T0);
                float *mj = m + j0 * Tq;
                if (NQ == 1)
                    tk_cosine_rows(1, TK_ROWS, qt, rb, n, rows, scale, Tq, mj);
                else /* 4 rows at a time: 4 x NQ accumulators */
                    for (int64_t r0 = 0; r0 < rows; r0 += 4) {
                        const int64_t part = rows - r0 < 4 ? rows - r0 : 4;
                        const float *rr = rb + r0 * n, *sr = scale + r0;
                        float *mr = mj + r0 * Tq;
                        if (NQ == 2)
                            tk_cosine_rows(2, 4, qt, rr, n, part, sr, Tq, mr);
                        else if (NQ == 3)
                            tk_cosine_rows(3, 4, qt, rr, n, part, sr, Tq, mr);
                        else
                            tk_cosine_rows(4, 4, qt, rr, n, part, sr, Tq, mr);
                    }
            }
            doc_kernel_sums(&ch, m, mb, Td, Tq, out + b * K * Tq);
        }
        free(rb);
        free(m);
    }
    free(qt);
    return status;
}
/* The linears of encoder_layer: y [M, N] = x [M, K] · Wᵀ + b for a few rows (a query encoder's tokens). wp: W packed as panels of SK_NR
   output columns, [ceil(N / SK_NR)][K][SK_NR] (columns past N zero): each panel is one contiguous run, read
   once from memory by the first block of rows (prefetched ahead into L2) and from cache by the others. Per
   panel and block of up to SK_MR rows, 2 x SK_MR accumulators: each weight vector loaded once, each x value
   broadcast; the sums run in k order (the same bits for any thread count). b may be NULL. act 1: GELU (erf form,
   as torch's default) applied to each output as it is stored. */
#define SK_NR 32
#define SK_MR 12
#define SK_PF 4096 /* floats ahead the first row block prefetches (16 KB: 1024 and 8192 measured no better) */
static inline __attribute__((always_inline)) void sk_rows(const int RB, const float *x, int64_t K, const float *w,
                                                          const float *b, float *y, int64_t ldy, __mmask16 m0,
                                                          __mmask16 m1, int pf, int64_t act) {
    __m512 a0[SK_MR], a1[SK_MR];
    for (int r = 0; r < RB; r++) a0[r] = a1[r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const float *wk = w + k * SK_NR;
        if (pf) {
            _mm_prefetch((const char *)(wk + SK_PF), _MM_HINT_T1);
            _mm_prefetch((const char *)(wk + SK_PF + 16), _MM_HINT_T1);
        }
        __m512 w0 = _mm512_loadu_ps(wk), w1 = _mm512_loadu_ps(wk + 16);
        for (int r = 0; r < RB; r++) {
            __m512 xb = _mm512_set1_ps(x[r * K + k]);
            a0[r] = _mm512_fmadd_ps(xb, w0, a0[r]);
            a1[r] = _mm512_fmadd_ps(xb, w1, a1[r]);
        }
    }
    __m512 b0 = b ? _mm512_maskz_loadu_ps(m0, b) : _mm512_setzero_ps();
    __m512 b1 = b ? _mm512_maskz_loadu_ps(m1, b + 16) : _mm512_setzero_ps();
    for (int r = 0; r < RB; r++) {
        if (act == 1) { /* GELU over the row's 32 values (libmvec's erff: the loop is vectorised), then stored */
            float v[SK_NR] __attribute__((aligned(64)));
            _mm512_store_ps(v, _mm512_add_ps(a0[r], b0));
            _mm512_store_ps(v + 16, _mm512_add_ps(a1[r], b1));
            SIMD for (int j = 0; j < SK_NR; j++) v[j] = 0.5f * v[j] * (1.0f + erff(v[j] * 0.70710678118654752f));
            a0[r] = _mm512_load_ps(v);
            a1[r] = _mm512_load_ps(v + 16);
            _mm512_mask_storeu_ps(y + r * ldy, m0, a0[r]);
            _mm512_mask_storeu_ps(y + r * ldy + 16, m1, a1[r]);
        } else {
            _mm512_mask_storeu_ps(y + r * ldy, m0, _mm512_add_ps(a0[r], b0));
            _mm512_mask_storeu_ps(y + r * ldy + 16, m1, _mm512_add_ps(a1[r], b1));
        }
    }
}
#define SK_CASE(R)                                         \
    case R:                                                \
        sk_rows(R, xr, K, w, bb, yr, ldy, m0, m1, r0 == 0, act); \
        break;
/* Panel p of y = x·Wᵀ + b (M rows; y's rows ldy apart): every block of rows against it */
static void sk_panel(const float *x, int64_t M, int64_t K, const float *wp, const float *b, int64_t N, float *y,
                     int64_t ldy, int64_t act, int64_t p) {
    const float *w = wp + p * K * SK_NR;
    const int64_t n0 = p * SK_NR, left = N - n0;
    const __mmask16 m0 = left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1);
    const __mmask16 m1 = left >= 32 ? 0xFFFF : (left <= 16 ? 0 : (__mmask16)((1u << (left - 16)) - 1));
    const float *bb = b ? b + n0 : 0;
    for (int64_t r0 = 0; r0 < M; r0 += SK_MR) {
        const float *xr = x + r0 * K;
        float *yr = y + r0 * ldy + n0;
        switch (M - r0 < SK_MR ? M - r0 : SK_MR) {
            SK_CASE(1) SK_CASE(2) SK_CASE(3) SK_CASE(4) SK_CASE(5) SK_CASE(6)
            SK_CASE(7) SK_CASE(8) SK_CASE(9) SK_CASE(10) SK_CASE(11) SK_CASE(12)
        }
    }
}
/* Each row y_r [N] becomes LayerNorm(y_r + res_r) (torch's: biased variance), the rows split over the team's
   threads (an orphaned worksharing loop: call it inside a parallel region; it ends with a barrier) */
static void sk_add_norm_rows(float *y, int64_t M, int64_t N, const float *res, const float *ln_w,
                             const float *ln_b, float ln_eps) {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < M; r++) {
        float *row = y + r * N;
        const float *rr = res + r * N;
        float mean = 0.0f;
#pragma omp simd reduction(+ : mean)
        for (int64_t j = 0; j < N; j++) {
            row[j] += rr[j];
            mean += row[j];
        }
        mean /= (float)N;
        float var = 0.0f;
#pragma omp simd reduction(+ : var)
        for (int64_t j = 0; j < N; j++) var += (row[j] - mean) * (row[j] - mean);
        const float rstd = 1.0f / sqrtf(var / (float)N + ln_eps);
        SIMD for (int64_t j = 0; j < N; j++) row[j] = (row[j] - mean) * rstd * ln_w[j] + ln_b[j];
    }
}
/* One BERT layer (post-LN: self-attention, then the feed-forward) over a few rows, in one call: the query
   encoders' 18 tokens, where the same layer as separate PyTorch calls spent more time between the compiled
   linears than in them. x [B, T, n] float32 (B·T = M rows), mask [B, T] (nonzero: a real token; the keys of
   padding are skipped, their rows computed as PyTorch computes them) or NULL; H heads of n / H; the weights
   packed as sk_panel reads them: wq, wk, wv, wo [n -> n], w1 [n -> inner], w2 [inner -> n], each with its bias;
   LayerNorms (ln1 after the attention, ln2 after the feed-forward) with their eps. out [B, T, n]. Stages:
   Q, K and V (their panels shared out together) -> per sequence and head softmax(q·kᵀ/√dh)·v over the real keys
   (a sequence without one: zeros, as the compiled attention) -> LN(Wo·ctx + bo + x) -> GELU(W1·h + b1) (erf form)
   -> LN(W2·f + b2 + h). Sums in a fixed order: the same bits for any thread count. Returns -1 for arguments
   outside its limits (T <= EL_MAXT), -2 when its scratch cannot be allocated. */
#define EL_MAXT 512
/* o [16·ND] = inv · Σ_j s[j]·x_j[0 .. 16·ND) over the T rows x_j = x + j·stride (rows with s[j] = 0 skipped), the
   sums in registers: accumulating into o itself re-read and re-stored it for every row (four fifths of
   encoder_layer's attention) */
static inline __attribute__((always_inline)) void weighted_rows(const int ND, const float *s, const float *x,
                                                                int64_t T, int64_t stride, float inv, float *o) {
    __m512 acc[8];
    for (int d = 0; d < ND; d++) acc[d] = _mm512_setzero_ps();
    for (int64_t j = 0; j < T; j++) {
        if (s[j] == 0.0f) continue;
        const __m512 p = _mm512_set1_ps(s[j]);
        for (int d = 0; d < ND; d++) acc[d] = _mm512_fmadd_ps(p, _mm512_loadu_ps(x + j * stride + 16 * d), acc[d]);
    }
    const __m512 scale = _mm512_set1_ps(inv);
    for (int d = 0; d < ND; d++) _mm512_storeu_ps(o + 16 * d, _mm512_mul_ps(acc[d], scale));
}
/* weighted_rows over a row of any width w (a multiple of 16): 8, then 4, 2, 1 vectors at a time */
static void weighted_row(const float *s, const float *x, int64_t T, int64_t stride, int64_t w, float inv, float *o) {
    for (int64_t d0 = 0; d0 < w / 16;) {
        const int64_t left = w / 16 - d0;
        const int nd = left >= 8 ? 8 : (left >= 4 ? 4 : (left >= 2 ? 2 : 1));
        switch (nd) {
            case 8: weighted_rows(8, s, x + 16 * d0, T, stride, inv, o + 16 * d0); break;
            case 4: weighted_rows(4, s, x + 16 * d0, T, stride, inv, o + 16 * d0); break;
            case 2: weighted_rows(2, s, x + 16 * d0, T, stride, inv, o + 16 * d0); break;
            default: weighted_rows(1, s, x + 16 * d0, T, stride, inv, o + 16 * d0);
        }
        d0 += nd;
    }
}
/* s[j] <- e^(s[j] - mx) over T scores, 16 at a time (att_exp; scalar expf was three quarters of encoder_layer's
   attention), padding (-inf) exactly 0; returns their sum */
static inline float exp_row(float *s, int64_t T, float mx) {
    const __m512 vmx = _mm512_set1_ps(mx), ninf = _mm512_set1_ps(-INFINITY);
    __m512 vsum = _mm512_setzero_ps();
    for (int64_t j = 0; j < T; j += 16) {
        const __mmask16 in = T - j >= 16 ? 0xFFFF : (__mmask16)((1u << (T - j)) - 1);
        const __m512 sj = _mm512_maskz_loadu_ps(in, s + j);
        const __mmask16 real = _mm512_mask_cmp_ps_mask(in, sj, ninf, _CMP_NEQ_OQ);
        const __m512 e = _mm512_maskz_mov_ps(real, att_exp(_mm512_sub_ps(sj, vmx)));
        _mm512_mask_storeu_ps(s + j, in, e);
        vsum = _mm512_add_ps(vsum, e);
    }
    return _mm512_reduce_add_ps(vsum);
}
/* One layer's weights as encoder_layer takes them (the panels, biases and LayerNorms of el_layer) */
struct el_weights {
    const float *wq, *bq, *wk, *bk, *wv, *bv, *wo, *bo, *ln1_w, *ln1_b, *w1, *b1, *w2, *b2, *ln2_w, *ln2_b;
    int64_t H, inner;
    float eps1, eps2;
};
static int el_weights_ok(const struct el_weights *w, int64_t n) {
    return w->H >= 1 && n % w->H == 0 && w->inner >= 1 && w->wq && w->wk && w->wv && w->wo && w->w1 && w->w2 &&
           w->ln1_w && w->ln1_b && w->ln2_w && w->ln2_b;
}
/* encoder_layer's body, run by every thread of a parallel region (its worksharing loops orphaned; it ends with a
   barrier): x [M = B·T, n] -> out, over the scratch qkv [M, 3n], ctx and h1 [M, n], f [M, inner] and this thread's
   kT [n·Tp] (NULL: *failed set) */
static void el_layer(const float *x, int64_t B, int64_t T, int64_t n, const uint8_t *mask,
                     const struct el_weights *w, float *out, float *qkv, float *ctx, float *h1, float *f, float *kT,
                     int *failed) {
    const int64_t H = w->H, inner = w->inner;
    const int64_t M = B * T, dh = n / H, P = (n + SK_NR - 1) / SK_NR, PF = (inner + SK_NR - 1) / SK_NR;
    const float scale = 1.0f / sqrtf((float)dh);
    const float *ws[3] = {w->wq, w->wk, w->wv}, *bs[3] = {w->bq, w->bk, w->bv};
    {
#pragma omp for schedule(static)
        for (int64_t p = 0; p < 3 * P; p++) /* Q, K, V side by side: qkv [M, 3n] */
            sk_panel(x, M, n, ws[p / P], bs[p / P], n, qkv + (p / P) * n, 3 * n, 0, p % P);
        /* per sequence and head: its keys transposed (kT [dh][Tp], the columns past T zero), so that each query
           row's scores come 16 keys at a time, one multiply-add per dimension (a dot product and its horizontal
           sum per key before); e^(s - max) 16 at a time too (att_exp), padding's exactly 0 */
        const int64_t Tp = (T + 15) / 16 * 16;
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < B * H; bh++) {
            if (!kT) {
#pragma omp atomic write
                *failed = 1;
                continue;
            }
            const int64_t b = bh / H, h = bh % H;
            const uint8_t *mb = mask ? mask + b * T : NULL;
            float s[EL_MAXT] __attribute__((aligned(64)));
            __mmask16 real[EL_MAXT / 16]; /* the real keys of each block of 16 */
            int any = 0;
            for (int64_t j0 = 0; j0 < Tp; j0 += 16) {
                __mmask16 bits = 0;
                for (int64_t j = j0; j < j0 + 16 && j < T; j++) bits |= (__mmask16)((!mb || mb[j]) << (j - j0));
                real[j0 / 16] = bits;
                any |= bits != 0;
            }
            for (int64_t j = 0; j < T; j++) {
                const float *kj = qkv + (b * T + j) * 3 * n + n + h * dh;
                for (int64_t c = 0; c < dh; c++) kT[c * Tp + j] = kj[c];
            }
            for (int64_t c = 0; c < dh; c++)
                for (int64_t j = T; j < Tp; j++) kT[c * Tp + j] = 0.0f;
            const __m512 vscale = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);
            for (int64_t i = 0; i < T; i++) {
                const float *qi = qkv + (b * T + i) * 3 * n + h * dh;
                float *ci = ctx + (b * T + i) * n + h * dh;
                if (!any) {
                    for (int64_t c = 0; c < dh; c++) ci[c] = 0.0f;
                    continue;
                }
                __m512 vmax = ninf;
                for (int64_t j0 = 0; j0 < Tp; j0 += 16) {
                    __m512 acc = _mm512_setzero_ps();
                    for (int64_t c = 0; c < dh; c++)
                        acc = _mm512_fmadd_ps(_mm512_set1_ps(qi[c]), _mm512_load_ps(kT + c * Tp + j0), acc);
                    acc = _mm512_mask_blend_ps(real[j0 / 16], ninf, _mm512_mul_ps(acc, vscale));
                    _mm512_store_ps(s + j0, acc);
                    vmax = _mm512_max_ps(vmax, acc);
                }
                const float inv = 1.0f / exp_row(s, T, _mm512_reduce_max_ps(vmax));
                const float *v = qkv + b * T * 3 * n + 2 * n + h * dh; /* key 0's value; key j's 3n further each */
                if (dh % 16 == 0)
                    weighted_row(s, v, T, 3 * n, dh, inv, ci);
                else {
                    SIMD for (int64_t c = 0; c < dh; c++) ci[c] = 0.0f;
                    for (int64_t j = 0; j < T; j++) {
                        if (s[j] == 0.0f) continue;
                        const float pj = s[j] * inv;
                        SIMD for (int64_t c = 0; c < dh; c++) ci[c] += pj * v[j * 3 * n + c];
                    }
                }
            }
        }
#pragma omp for schedule(static)
        for (int64_t p = 0; p < P; p++) sk_panel(ctx, M, n, w->wo, w->bo, n, h1, n, 0, p);
        sk_add_norm_rows(h1, M, n, x, w->ln1_w, w->ln1_b, w->eps1);
#pragma omp for schedule(static)
        for (int64_t p = 0; p < PF; p++) sk_panel(h1, M, n, w->w1, w->b1, inner, f, inner, 1, p);
#pragma omp for schedule(static)
        for (int64_t p = 0; p < P; p++) sk_panel(f, M, inner, w->w2, w->b2, n, out, n, 0, p);
        sk_add_norm_rows(out, M, n, h1, w->ln2_w, w->ln2_b, w->eps2);
    }
}
/* Layers ws[0 .. L-1] one after the other over x [B·T, n] -> out, in one parallel region (el_layer each): the
   scratch for the widest layer, each thread's kT once, the layers' outputs alternating between out and tmp so that
   the last lands in out. 0, -1 (arguments), -2 (scratch). */
static int el_stack(const float *x, int64_t B, int64_t T, int64_t n, const uint8_t *mask,
                    const struct el_weights *ws, int64_t L, float *out, float *tmp, int64_t threads) {
    if (B < 1 || T < 1 || T > EL_MAXT || n < 1 || L < 1 || threads < 1 || (L > 1 && !tmp)) return -1;
    int64_t inner = 0;
    for (int64_t l = 0; l < L; l++) {
        if (!el_weights_ok(ws + l, n)) return -1;
        if (ws[l].inner > inner) inner = ws[l].inner;
    }
    const int64_t M = B * T, Tp = (T + 15) / 16 * 16;
    float *qkv = att_alloc(sizeof(float) * (size_t)(M * 3 * n));
    float *ctx = att_alloc(sizeof(float) * (size_t)(M * n));
    float *h1 = att_alloc(sizeof(float) * (size_t)(M * n));
    float *f = att_alloc(sizeof(float) * (size_t)(M * inner));
    if (!qkv || !ctx || !h1 || !f) {
        free(qkv), free(ctx), free(h1), free(f);
        return -2;
    }
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *kT = att_alloc(sizeof(float) * (size_t)(n * Tp)); /* dh <= n for every layer */
        const float *in = x;
        for (int64_t l = 0; l < L; l++) { /* layer l into out when L - 1 - l is even: the last one there */
            float *dst = (L - 1 - l) % 2 == 0 ? out : tmp;
            el_layer(in, B, T, n, mask, ws + l, dst, qkv, ctx, h1, f, kT, &failed); /* ends with a barrier */
            in = dst;
        }
        free(kT);
    }
    free(qkv), free(ctx), free(h1), free(f);
    return failed ? -2 : 0;
}
int encoder_layer(const float *x, int64_t B, int64_t T, int64_t n, const uint8_t *mask, int64_t H, const float *wq,
                  const float *bq, const float *wk, const float *bk, const float *wv, const float *bv,
                  const float *wo, const float *bo, const float *ln1_w, const float *ln1_b, float eps1,
                  const float *w1, const float *b1, int64_t inner, const float *w2, const float *b2,
                  const float *ln2_w, const float *ln2_b, float eps2, float *out, int64_t threads) {
    const struct el_weights w = {wq, bq, wk, bk, wv, bv, wo, bo, ln1_w, ln1_b, w1, b1, w2, b2, ln2_w, ln2_b,
                                 H, inner, eps1, eps2};
    return el_stack(x, B, T, n, mask, &w, 1, out, NULL, threads);
}
/* L consecutive layers (a query encoder's stack) in one call: the query side paid a Python wrapper, a parallel
   region and a scratch allocation per layer. ptrs [L][16]: per layer wq, bq, wk, bk, wv, bv, wo, bo, ln1_w, ln1_b,
   w1, b1, w2, b2, ln2_w, ln2_b as addresses (encoder_layer's order); dims [L][2]: heads, inner width; eps [L][2]:
   the two LayerNorms'. tmp [B·T, n]: the alternate output (unused for L = 1). Same bits as encoder_layer layer by
   layer. */
int encoder_stack(const float *x, int64_t B, int64_t T, int64_t n, const uint8_t *mask, int64_t L,
                  const int64_t *ptrs, const int64_t *dims, const float *eps, float *out, float *tmp,
                  int64_t threads) {
    if (L < 1 || L > 64 || !ptrs || !dims || !eps) return -1;
    struct el_weights ws[64];
    for (int64_t l = 0; l < L; l++) {
        const float *p[16];
        for (int i = 0; i < 16; i++) p[i] = (const float *)(intptr_t)ptrs[l * 16 + i];
        ws[l] = (struct el_weights){p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11],
                                    p[12], p[13], p[14], p[15], dims[2 * l], dims[2 * l + 1], eps[2 * l],
                                    eps[2 * l + 1]};
    }
    return el_stack(x, B, T, n, mask, ws, L, out, tmp, threads);
}
#else
int cross_attention(const float *q, int64_t Bq, const void *k, const void *v, const float *ks, const float *vs,
                    int64_t kind, const uint8_t *mask, int64_t B, int64_t T, int64_t H, int64_t dh, int64_t Tq,
                    float *out, float *lse, const float *xcol,
                    const float *xq, const float *quad, int64_t threads) {
    (void)threads, (void)lse, (void)xq, (void)quad, (void)xcol, (void)q, (void)Bq, (void)k, (void)v, (void)ks, (void)vs, (void)kind, (void)mask, (void)B, (void)T, (void)H;
    (void)dh, (void)Tq, (void)out;
    return -1;
}
int tk_stored_sums(const float *q, const void *d, const float *ds, int64_t kind, const uint8_t *mask, int64_t B,
                   int64_t Td, int64_t n, int64_t Tq, int64_t K, int64_t anchor, float mu_a, float c, float mlim,
                   int64_t R, const float *rdelta, const int64_t *rop, const int64_t *rsrc, int64_t S,
                   const int64_t *kern, const int64_t *prev, const int64_t *ridx, const float *lo,
                   const float *gain, float *out, int64_t threads) {
    (void)q, (void)d, (void)ds, (void)kind, (void)mask, (void)B, (void)Td, (void)n, (void)Tq, (void)K, (void)anchor;
    (void)mu_a, (void)c, (void)mlim, (void)R, (void)rdelta, (void)rop, (void)rsrc, (void)S, (void)kern, (void)prev;
    (void)ridx, (void)lo, (void)gain, (void)out, (void)threads;
    return -1;
}
int encoder_layer(const float *x, int64_t B, int64_t T, int64_t n, const uint8_t *mask, int64_t H, const float *wq,
                  const float *bq, const float *wk, const float *bk, const float *wv, const float *bv,
                  const float *wo, const float *bo, const float *ln1_w, const float *ln1_b, float eps1,
                  const float *w1, const float *b1, int64_t inner, const float *w2, const float *b2,
                  const float *ln2_w, const float *ln2_b, float eps2, float *out, int64_t threads) {
    (void)x, (void)B, (void)T, (void)n, (void)mask, (void)H, (void)wq, (void)bq, (void)wk, (void)bk, (void)wv;
    (void)bv, (void)wo, (void)bo, (void)ln1_w, (void)ln1_b, (void)eps1, (void)w1, (void)b1, (void)inner, (void)w2;
    (void)b2, (void)ln2_w, (void)ln2_b, (void)eps2, (void)out, (void)threads;
    return -1;
}
int encoder_stack(const float *x, int64_t B, int64_t T, int64_t n, const uint8_t *mask, int64_t L,
                  const int64_t *ptrs, const int64_t *dims, const float *eps, float *out, float *tmp,
                  int64_t threads) {
    (void)x, (void)B, (void)T, (void)n, (void)mask, (void)L, (void)ptrs, (void)dims, (void)eps, (void)out, (void)tmp;
    (void)threads;
    return -1;
}
#endif
