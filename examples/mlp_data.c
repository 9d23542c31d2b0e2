/*
 * The synthetic task and the initial parameters of train_mlp, both counter-based:
 * sample k and element e of a tensor are pure functions of the seed and their index,
 * so any layout, any rank and any resize sees the same data and the same model.
 */
#include <math.h>
#include <string.h>

#include "examples/mlp_int.h"

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static uint64_t mix3(uint64_t a, uint64_t b, uint64_t c)
{
    return splitmix64(splitmix64(splitmix64(a) ^ b) ^ c);
}

/* Uniform in [0, 1) from the top 24 bits: exactly representable in f32. */
static float unit(uint64_t r)
{
    return (float)(r >> 40) * (1.0f / 16777216.0f);
}

int32_t tide__mlp_rule(const tide_mlp_config *cfg, int32_t token)
{
    return (int32_t)(mix3(cfg->seed, 0x52554C45ull /* "RULE" */, (uint64_t)token) %
                     (uint64_t)cfg->vocab);
}

void tide__mlp_sample(const tide_mlp_config *cfg, int64_t k, int32_t *inputs, int32_t *targets)
{
    uint64_t base = mix3(cfg->seed, 0x44415441ull /* "DATA" */, (uint64_t)k);
    int32_t cur = (int32_t)(splitmix64(base) % (uint64_t)cfg->vocab);
    for (int64_t j = 0; j < cfg->seq; j++) {
        uint64_t r = splitmix64(base ^ (uint64_t)(j + 1) * 0xD1B54A32D192ED03ull);
        int32_t next;
        if ((r & 3u) != 0) /* probability 3/4: the rule */
            next = tide__mlp_rule(cfg, cur);
        else
            next = (int32_t)((r >> 2) % (uint64_t)cfg->vocab);
        inputs[j] = cur;
        targets[j] = next;
        cur = next;
    }
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 0xCBF29CE484222325ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 0x100000001B3ull;
    return h;
}

float tide__mlp_init_value(const tide_mlp_config *cfg, const char *name, int64_t e)
{
    if (ends_with(name, ".exp_avg") || ends_with(name, ".exp_avg_sq") || ends_with(name, ".bias"))
        return 0.0f;
    if (ends_with(name, "ln2.weight") || ends_with(name, "final_ln.weight"))
        return 1.0f;
    float std = 1.0f; /* embedding: unit variance, layernorm follows */
    if (ends_with(name, "fc1.weight") || strcmp(name, "head.weight") == 0)
        std = 1.0f / sqrtf((float)cfg->hidden);
    else if (ends_with(name, "fc2.weight"))
        std = 1.0f / sqrtf((float)cfg->ffn);
    float u = unit(mix3(cfg->seed, fnv1a(name), (uint64_t)e));
    return (2.0f * u - 1.0f) * 1.7320508f * std; /* uniform with variance std^2 */
}
