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

/* The 8-bit dynamic type's nearest code, by arithmetic on eight-entry tables (gpurig.parallel.codecs._dynamic_tables
 * builds them and says why the arithmetic finds the nearest code; its torch encoder takes the same steps, tested
 * equal). A value's slot s (0: the block's absmax, 1.0; 1-6: the decades from [0.1, 1) down; 7: the smallest
 * decade's one code and zero) is the count of the slots' lower midpoints ``TH`` at or above it; in its slot the
 * codes are equally spaced, so its position among the 129 magnitudes is floor(a * INVW + C), at most PLAST, and
 * the code's magnitude is position * W + G. */
enum { TH = 0, INVW = 8, C = 16, PLAST = 24, W = 32, G = 40, SLOTS = 8 };

/* a: |x| / absmax, at most 1 (at most TH[0] for a negative x: the type has no -1.0; a NaN becomes that bound). */
static inline uint8_t dynamic_code(float x, float a, const float *restrict t, float *restrict value) {
    int s = 0;
    for (int k = 0; k < SLOTS - 1; k++) s += a <= t[TH + k];
    float position = floorf(fmaf(a, t[INVW + s], t[C + s]));
    position = position < t[PLAST + s] ? position : t[PLAST + s];
    float magnitude = fmaf(position, t[W + s], t[G + s]);
    int negative = signbit(x) != 0;
    *value = negative ? -magnitude : magnitude;
    return (uint8_t)(negative ? 127 - (int)position : 127 + (int)position);
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LANES 4  /* vectors in flight: the steps are one long dependent chain, so four chains run side by side */
#define EACH for (int u = 0; u < LANES; u++)
/* The same steps, 32 values at a time. The tables are one register each (vpermps looks a slot up). The slot comes
 * from an estimate, -log10(a) read off a's float bits (exponent + mantissa, within 0.026), which lands on s or s - 1
 * for every a; one comparison with TH[estimate] settles it. */
static long dynamic_blocks_avx2(const float *restrict xb, float *restrict rb, uint8_t *restrict cb, long block,
                                float m, float inv, const float *restrict t) {
    const __m256 th = _mm256_loadu_ps(t + TH), invw = _mm256_loadu_ps(t + INVW), c = _mm256_loadu_ps(t + C);
    const __m256 plast = _mm256_loadu_ps(t + PLAST), w = _mm256_loadu_ps(t + W), g = _mm256_loadu_ps(t + G);
    const __m256 one = _mm256_set1_ps(1.0f), below_one = _mm256_set1_ps(t[TH]);
    const __m256 scale = _mm256_set1_ps(m), invscale = _mm256_set1_ps(inv), sign_bit = _mm256_set1_ps(-0.0f);
    /* -log10(a) + 0.4 from the bits, (127 * 2^23 + 0.4 * 2^23 / log10(2) - bits) * log10(2) / 2^23, plus 2^23: the
     * sum's low mantissa bits are then that rounded to an integer (at most 7), and vpermps reads an index's low three
     * bits. Rounding -log10(a) + 0.4 lands on floor(-log10(a) + 0.9), give or take the estimate's 0.026. */
    const __m256i origin = _mm256_set1_epi32(1076499757);
    const __m256 per_bit = _mm256_set1_ps(-0.30103f / 8388608.0f), magic = _mm256_set1_ps(8388608.0f);
    const __m256 last_slot = _mm256_set1_ps(8388608.0f + SLOTS - 1);
    const __m256 code_bits = _mm256_set1_ps(8388608.0f + 127), low_byte = _mm256_castsi256_ps(_mm256_set1_epi32(0xff));
    const __m256i byte_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    long i = 0;
    for (; i + 8 * LANES <= block; i += 8 * LANES) {
        __m256 x[LANES], sign[LANES], a[LANES], position[LANES], magnitude[LANES];
        __m256i s[LANES], code[LANES];
        EACH x[u] = _mm256_loadu_ps(xb + i + 8 * u);
        EACH sign[u] = _mm256_and_ps(x[u], sign_bit);
        EACH a[u] = _mm256_min_ps(_mm256_mul_ps(_mm256_andnot_ps(sign_bit, x[u]), invscale),
                                  _mm256_blendv_ps(one, below_one, x[u]));  /* min: a NaN gives the bound */
        EACH s[u] = _mm256_castps_si256(_mm256_min_ps(_mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_castps_si256(a[u]), origin)), per_bit, magic),
                        last_slot));
        EACH s[u] = _mm256_sub_epi32(s[u], _mm256_castps_si256(
                        _mm256_cmp_ps(a[u], _mm256_permutevar8x32_ps(th, s[u]), _CMP_LE_OQ)));
        EACH position[u] = _mm256_floor_ps(_mm256_fmadd_ps(a[u], _mm256_permutevar8x32_ps(invw, s[u]),
                                                           _mm256_permutevar8x32_ps(c, s[u])));
        EACH position[u] = _mm256_min_ps(position[u], _mm256_permutevar8x32_ps(plast, s[u]));
        EACH magnitude[u] = _mm256_fmadd_ps(position[u], _mm256_permutevar8x32_ps(w, s[u]),
                                            _mm256_permutevar8x32_ps(g, s[u]));
        EACH code[u] = _mm256_castps_si256(_mm256_and_ps(_mm256_add_ps(code_bits, _mm256_or_ps(position[u], sign[u])),
                                                         low_byte));  /* 2^23 + 127 ± position: its low byte */
        __m256i bytes = _mm256_packus_epi16(_mm256_packus_epi32(code[0], code[1]), _mm256_packus_epi32(code[2], code[3]));
        _mm256_storeu_si256((__m256i *)(cb + i), _mm256_permutevar8x32_epi32(bytes, byte_order));
        EACH _mm256_storeu_ps(rb + i + 8 * u, _mm256_sub_ps(x[u], _mm256_mul_ps(_mm256_or_ps(magnitude[u], sign[u]),
                                                                               scale)));
    }
    return i;
}
#endif

/* x += residual (if add_residual); per block, each value's nearest code of the 8-bit dynamic type;
 * residual = x - value(code) * absmax. */
void dynamic_encode_feedback(float *restrict x, float *restrict residual, int add_residual,
                             uint8_t *restrict codes, float *restrict scale, long n, long block, float smallest,
                             const float *restrict tables) {
    for (long b = 0; b < n / block; b++) {
        float *restrict xb = x + b * block;
        float *restrict rb = residual + b * block;
        uint8_t *restrict cb = codes + b * block;
        float m = scale[b] = corrected_absmax(xb, rb, add_residual, block, smallest);
        float inv = 1.0f / m;
        long i = 0;
#if defined(__AVX2__) && defined(__FMA__)
        i = dynamic_blocks_avx2(xb, rb, cb, block, m, inv, tables);
#endif
        for (; i < block; i++) {
            float a = fabsf(xb[i]) * inv, value, bound = signbit(xb[i]) ? tables[TH] : 1.0f;
            a = a < bound ? a : bound;
            cb[i] = dynamic_code(xb[i], a, tables, &value);
            rb[i] = xb[i] - value * m;
        }
    }
}

/* out = map[codes] * scale, block by block; with AVX2, each code's magnitude is computed as the encoder computed it
 * (position * W + G in its slot, the slot read off the position's float exponent) rather than looked up. */
void dynamic_decode(const uint8_t *restrict codes, const float *restrict scale, float *restrict out, long n, long block,
                    const float *restrict map, const float *restrict t) {
    for (long b = 0; b < n / block; b++) {
        long i = b * block, end = (b + 1) * block;
#if defined(__AVX2__) && defined(__FMA__)
        const __m256 w = _mm256_loadu_ps(t + W), g = _mm256_loadu_ps(t + G), m = _mm256_set1_ps(scale[b]);
        const __m256i middle = _mm256_set1_epi32(127), last_slot = _mm256_set1_epi32(SLOTS - 1);
        const __m256i exponent_of_128 = _mm256_set1_epi32(127 + SLOTS - 1);
        for (; i + 8 <= end; i += 8) {
            __m256i code = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(codes + i)));
            __m256i offset = _mm256_sub_epi32(code, middle);
            __m256 position = _mm256_cvtepi32_ps(_mm256_abs_epi32(offset));
            /* 128 -> slot 0, [64, 128) -> 1, ..., [2, 4) -> 6, 1 -> 7; zero's exponent field is 0: clipped to 7 */
            __m256i slot = _mm256_min_epu32(_mm256_sub_epi32(exponent_of_128,
                                            _mm256_srli_epi32(_mm256_castps_si256(position), 23)), last_slot);
            __m256 magnitude = _mm256_fmadd_ps(position, _mm256_permutevar8x32_ps(w, slot),
                                               _mm256_permutevar8x32_ps(g, slot));
            __m256 sign = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(offset, 31), 31));
            _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_or_ps(magnitude, sign), m));
        }
#endif
        for (; i < end; i++) out[i] = map[codes[i]] * scale[b];
    }
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
