/* sampler.h - draws the next token from logits: softmax over the first V entries (the real
 * vocabulary; padded entries never win) at temperature 1, inverse-CDF with coin in [0, 1). */
#ifndef LLMC_SAMPLER_H
#define LLMC_SAMPLER_H
#ifdef __cplusplus
extern "C" {
#endif
int sample_softmax(const float *logits, int V, float coin);
#ifdef __cplusplus
}
#endif
#endif
