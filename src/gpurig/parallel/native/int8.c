/* gpurig's int8 codec on CPU: one pass over memory where the torch version makes seven.
 *
 * Blockwise absmax, 8-bit linear levels, with error feedback: the same codes and
 * scales as gpurig.parallel.codecs' torch functions (tested equal), built by
 * gpurig.parallel.native with the machine's C compiler. Loops are written so the
 * compiler vectorizes them without -ffast-math: a NaN or an infinity in a block
 * still makes its scale NaN or infinite, as torch.amax does, so the numerical
 * guard sees it after the average.
 */
#include <stdint.h>
#include <string.h>
#include <math.h>

/* Adds the residual to a block if asked, then returns the block's largest magnitude (at least ``smallest``).
 * |x| is compared as bits: for non-negative floats integer order is float order, and NaN sorts above inf, so
 * the loop vectorizes without -ffast-math and a NaN or infinity still becomes the block's scale. */
static float corrected_absmax(float *restrict xb, const float *restrict rb, int add_residual, long block,
                              float smallest) {
    if (add_residual)
        for (long i = 0; i < block; i++) xb[i] += rb[i];
    uint32_t most = 0;
    for (long i = 0; i < block; i++) {
        uint32_t bits;
        memcpy(&bits, &xb[i], 4);
        bits &= 0x7fffffffu;
        most = bits > most ? bits : most;
    }
    float m;
    memcpy(&m, &most, 4);
    return m < smallest ? smallest : m;
}

/* x += residual (if add_residual); codes, scale = encode(x); residual = x - decode(codes, scale). */
void int8_encode_feedback(float *restrict x, float *restrict residual, int add_residual,
                          int8_t *restrict codes, float *restrict scale, long n, long block, float smallest) {
    for (long b = 0; b < n / block; b++) {
        float *restrict xb = x + b * block;
        float *restrict rb = residual + b * block;
        int8_t *restrict cb = codes + b * block;
        float m = scale[b] = corrected_absmax(xb, rb, add_residual, block, smallest);
        float inv = 127.0f / m, step = m / 127.0f;
        for (long i = 0; i < block; i++) {
            float level = nearbyintf(xb[i] * inv);
            cb[i] = (int8_t)level;
            rb[i] = xb[i] - level * step;
        }
    }
}

/* out = codes * scale / 127, block by block. */
void int8_decode(const int8_t *restrict codes, const float *restrict scale, float *restrict out, long n, long block) {
    for (long b = 0; b < n / block; b++) {
        float step = scale[b] / 127.0f;
        for (long i = b * block; i < (b + 1) * block; i++) out[i] = (float)codes[i] * step;
    }
}

/* The 8-bit dynamic type: x += residual (if add_residual); per block, the nearest of the 256 codes to x / absmax,
 * found by the top 20 bits of the normalised magnitude (``nearest``: 2^20 entries, the code's position among
 * the positive values, -1 for zero), as gpurig.parallel.codecs._encode_dynamic; residual = x - map[code] * absmax. */
void dynamic_encode_feedback(float *restrict x, float *restrict residual, int add_residual,
                             uint8_t *restrict codes, float *restrict scale, long n, long block, float smallest,
                             const int16_t *restrict nearest, const float *restrict map) {
    for (long b = 0; b < n / block; b++) {
        float *restrict xb = x + b * block;
        float *restrict rb = residual + b * block;
        uint8_t *restrict cb = codes + b * block;
        float m = scale[b] = corrected_absmax(xb, rb, add_residual, block, smallest);
        float inv = 1.0f / m;
        uint32_t prefix[block];  /* first the table indices, in a loop the compiler vectorizes; then the lookups */
        for (long i = 0; i < block; i++) {
            float a = fabsf(xb[i]) * inv;
            a = a > 1.0f ? 1.0f : a;
            uint32_t bits;
            memcpy(&bits, &a, 4);
            prefix[i] = bits >> 11;
        }
        for (long i = 0; i < block; i++) {
            int position = nearest[prefix[i]];
            int code = xb[i] >= 0.0f ? 128 + position : 126 - position;
            code = code < 0 ? 0 : code > 255 ? 255 : code;
            cb[i] = (uint8_t)code;
            rb[i] = xb[i] - map[code] * m;
        }
    }
}

/* out = map[codes] * scale, block by block. */
void dynamic_decode(const uint8_t *restrict codes, const float *restrict scale, float *restrict out, long n, long block,
                    const float *restrict map) {
    for (long b = 0; b < n / block; b++)
        for (long i = b * block; i < (b + 1) * block; i++) out[i] = map[codes[i]] * scale[b];
}

/* The 16-bit casts with error feedback, in one pass where torch makes four: x += residual (if add_residual);
 * out = x rounded to 16 bits (to nearest, ties to even: torch's casts); residual = x - out. */
#ifdef __FLT16_MAX__
#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#endif
void fp16_encode_feedback(float *restrict x, float *restrict residual, int add_residual, _Float16 *restrict out,
                          long n) {
    long i = 0;
#if defined(__F16C__) && defined(__AVX__)  /* compilers do not vectorize the _Float16 cast: 8 at a time by hand */
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        if (add_residual) v = _mm256_add_ps(v, _mm256_loadu_ps(residual + i));
        __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(out + i), h);
        _mm256_storeu_ps(x + i, v);
        _mm256_storeu_ps(residual + i, _mm256_sub_ps(v, _mm256_cvtph_ps(h)));
    }
#endif
    for (; i < n; i++) {
        float v = add_residual ? x[i] + residual[i] : x[i];
        _Float16 h = (_Float16)v;
        out[i] = h;
        x[i] = v;
        residual[i] = v - (float)h;
    }
}
#endif

/* bfloat16 is float32's top half: rounded to nearest even on the bits, NaN kept quiet (as c10::BFloat16). */
void bf16_encode_feedback(float *restrict x, float *restrict residual, int add_residual, uint16_t *restrict out,
                          long n) {
    for (long i = 0; i < n; i++) {
        float v = add_residual ? x[i] + residual[i] : x[i];
        uint32_t bits;
        memcpy(&bits, &v, 4);
        uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
        rounded = (bits & 0x7fffffffu) > 0x7f800000u ? 0x7fc00000u : rounded;
        float back;
        memcpy(&back, &rounded, 4);
        out[i] = (uint16_t)(rounded >> 16);
        x[i] = v;
        residual[i] = v - back;
    }
}

/* out = x * scale, and whether any |x| reaches 2^119 or is not finite (the numerical guard's look at the
 * gradients, made while copying them into their bucket). Exponent fields are compared as integers, so the loop
 * vectorizes without -ffast-math. Averaged over any number of ranks up to 2^8, values below 2^119 cannot
 * overflow, so where no rank flags its input the average is finite. */
int scale_copy_flag(const float *restrict x, float *restrict out, long n, float scale) {
    uint32_t worst = 0;
    for (long i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &x[i], 4);
        bits &= 0x7f800000u;
        worst = bits > worst ? bits : worst;
        out[i] = x[i] * scale;
    }
    return worst >= (246u << 23);
}
