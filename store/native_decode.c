/* The codebook stores' decode (store/native.py): out[r, p] = table[p][packed[r, p]], one table word per packed
 * byte (store.quant.byte_table: the 8/bits float16 values a byte holds, read as one 32-bit word for book4 and one
 * 64-bit word for book2). One thread: the reader is called from many. */
#include <stdint.h>

#define DECODE(NAME, WORD)                                                                                    \
    int NAME(const uint8_t *packed, const WORD *table, WORD *out, int64_t rows, int64_t positions) {          \
        for (int64_t r = 0; r < rows; r++) {                                                                  \
            const uint8_t *src = packed + r * positions;                                                      \
            WORD *dst = out + r * positions;                                                                  \
            for (int64_t p = 0; p < positions; p++) dst[p] = table[(p << 8) | src[p]];                        \
        }                                                                                                     \
        return 0;                                                                                             \
    }

DECODE(decode_bytes16, uint16_t)
DECODE(decode_bytes32, uint32_t)
DECODE(decode_bytes64, uint64_t)
