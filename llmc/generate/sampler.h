/* sampler.h - draws the next token from logits: softmax over the first V entries (the real
 * vocabulary; padded entries never win) at temperature 1, inverse-CDF with coin in [0, 1). */
#ifndef LLMC_SAMPLER_H
#define LLMC_SAMPLER_H
#ifdef __cplusplus
extern "C" {
#endif
int sample_softmax(const float *logits, int V, float coin);
/* The next token under the usual decoding controls. temperature 0: the argmax (the first
 * maximum), coin unused. Otherwise softmax(logits / temperature) restricted to the top_k most
 * likely tokens (0 = no limit), then to the smallest most-likely set whose probability reaches
 * top_p (1 = no limit; always at least one token), renormalised, inverse-CDF with coin. */
int sample_filtered(const float *logits, int V, float temperature, int top_k, float top_p, float coin);
#ifdef __cplusplus
}
#endif
#endif
