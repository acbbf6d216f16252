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
                    const int64_t *prev, const int64_t *ridx, const float *lo, const float *gain, float *out) {
    const struct chain ch = {K, anchor, R, S, mu_a, c, mlim, rdelta, lo, gain, rop, rsrc, kern, prev, ridx};
    if (Tq < 1 || Tq > MAXQ || K > MAXK || R > MAXR) return -1; /* the caller checks; never divide by 0 */
    for (int64_t b = 0; b < B; b++) doc_kernel_sums(&ch, m + b * Td * Tq, mask + b * Td, Td, Tq, out + b * K * Tq);
    return 0;
}
