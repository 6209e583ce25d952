/*
 * test_gpt2_cpu.c - the CPU model against the PyTorch reference (dev/reference/train_gpt2.py).
 *
 * usage: test_gpt2_cpu MODEL.bin DEBUG_STATE.bin [recompute]
 * Loads the llm.c checkpoint the reference wrote and its debug state (version 3: inputs,
 * targets, logits, loss, all 16 gradients, an N-step loss/grad-norm trajectory under the
 * AdamW settings stored in the header, and the parameters after N steps), then checks:
 * logits, loss, every gradient tensor, every step's loss and grad norm, the final parameters.
 *
 * Tolerances (both sides compute in fp32, with different summation orders):
 *  - logits atol 1e-4 + rtol 1e-4: sums of C products of O(1) terms, ~1e-6 relative noise,
 *    amplified through L layers of LayerNorm; 1e-4 is ~10x what a correct run shows.
 *  - loss atol 1e-5: a mean of B*T logsumexps, each accurate to ~1e-6.
 *  - gradients atol 1e-3 * max|ref| of the tensor + rtol 1e-3: gradient entries span many
 *    orders of magnitude; errors scale with the tensor's largest entries, not each entry.
 *  - trajectory losses rtol 1e-4, grad norms rtol 1e-3: Adam normalises each update, so the
 *    tiny differences above become O(lr * 1e-3) parameter differences that compound per step.
 *  - final parameters atol 1e-5 + rtol 1e-4: lr is 1e-4 and steps are sign-like, so even an
 *    entry whose gradient rounds differently moves by at most ~lr per step.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/core/check.h"
#include "llmc/cpu/gpt2.h"
#include "test/debug_state.h"
#include "test/testing.h"
#include "llmc/formats/arch.h"

/* The CPU GPT-2 of a model file or HF directory (formats/arch.h's GPT-2 entry loads it). */
static void build_from_file(GPT2 *model, const char *path) {
    ArchConfig ac;
    model_arch_for_init(path, &ac);
    gpt2_build(model, arch_config_base(&ac));
    ac.arch->load_init(path, &ac, model->params_memory, model->num_parameters, 0);
}


int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.bin DEBUG_STATE.bin [recompute]\n", argv[0]);
        return 2;
    }
    int recompute = argc > 3 ? atoi(argv[3]) : 0;
    GPT2 model;
    build_from_file(&model, argv[1]);
    DebugState d;
    read_debug_state(argv[2], &d, model.num_parameters);
    const ModelConfig *cfg = &model.cfg;
    test_report(d.V == cfg->vocab_size && d.Vp == cfg->padded_vocab_size && d.L == cfg->num_layers &&
                    d.C == cfg->channels && d.NH == cfg->num_heads,
                "debug state matches the checkpoint's config", "V %d/%d Vp %d/%d L %d/%d C %d/%d", d.V,
                cfg->vocab_size, d.Vp, cfg->padded_vocab_size, d.L, cfg->num_layers, d.C, cfg->channels);
    printf("config: L %d NH %d C %d V %d Vp %d, batch B %d T %d, %d steps, recompute %d\n", d.L, d.NH, d.C, d.V, d.Vp,
           d.B, d.T, d.nsteps, recompute);
    const int B = d.B, T = d.T;
    gpt2_allocate(&model, B, T, recompute, 1);

    /* forward: logits before the classifier overwrites them, then the loss */
    gpt2_forward(&model, d.x, NULL, B, T, 0.0f);
    check_debug_logits(&d, model.acts.logits);
    gpt2_zero_grad(&model);
    float loss = gpt2_forward(&model, d.x, d.y, B, T, 1.0f / (B * T));
    test_report(fabsf(loss - d.loss) <= 1e-5f, "forward loss", "got %.7f, reference %.7f", loss, d.loss);
    gpt2_backward(&model, d.x, B, T);
    check_debug_gradients(&d, model.param_specs, NUM_PARAMETER_TENSORS, model.grads_memory);

    /* the N-step trajectory on the same batch, with the reference's AdamW settings */
    build_from_file(&model, argv[1]);
    gpt2_allocate(&model, B, T, recompute, 1);
    int traj_ok = 1;
    for (int step = 0; step < d.nsteps; step++) {
        gpt2_zero_grad(&model);
        float l = gpt2_forward(&model, d.x, d.y, B, T, 1.0f / (B * T));
        gpt2_backward(&model, d.x, B, T);
        float norm = gpt2_grad_norm(&model);
        float scale = d.grad_clip > 0 && norm > d.grad_clip ? d.grad_clip / norm : 1.0f;
        gpt2_update(&model, d.lr, d.beta1, d.beta2, d.eps, d.weight_decay, scale, step + 1);
        traj_ok &= check_debug_step(&d, step, l, norm);
    }
    test_report(traj_ok, "10-step loss and grad-norm trajectory", "see the steps above");
    test_close("parameters after the trajectory", model.params_memory, d.params_after, model.num_parameters, 1e-5, 1e-4);
    gpt2_free(&model);
    return test_exit_code();
}
