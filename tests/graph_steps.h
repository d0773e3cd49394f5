/*
 * graph_steps.h: the steps test_cuda_graphs.c and test_graphs_paged.c run
 * a placed model through (khub__forward, as a batch scheduler would), and
 * what the fake driver saw during each. Step 0 prefills 3 and 2 tokens
 * into sequences 0 and 1; each later step decodes one token of each of
 * its step_seqs[s] sequences (2, 2, 2, 1, 1, 2), so the batch shape
 * changes at steps 4 and 6. The tokens are a fixed function of the step,
 * so two runs of the same weights can be compared bit for bit.
 *
 * Include after device_fixture.h (stat_of, VOCAB) and executor.h.
 */
#ifndef KHUB_TESTS_GRAPH_STEPS_H
#define KHUB_TESTS_GRAPH_STEPS_H

enum { N_STEPS = 7 };
static const int step_seqs[N_STEPS] = {2, 2, 2, 2, 1, 1, 2};

/* What the fake driver saw during one step. */
typedef struct seen {
    long captures, instantiations, updates, graph_launches, launches, syncs, first_launch;
    long nodes, htod;   /* graph nodes recorded, bytes copied host->device */
    long legacy_copies; /* copies on the legacy default stream */
} seen;

static inline seen snapshot(void)
{
    return (seen){stat_of("graph_captures"),
                  stat_of("graph_instantiations"),
                  stat_of("graph_updates"),
                  stat_of("graph_launches"),
                  stat_of("launches"),
                  stat_of("stream_syncs"),
                  0,
                  stat_of("graph_nodes_recorded"),
                  stat_of("htod_bytes"),
                  stat_of("copies_legacy")};
}

typedef struct run {
    float logits[N_STEPS][2][VOCAB];
    seen step[N_STEPS];
    int32_t rows[N_STEPS][2][3]; /* what an after_step hook records (block table rows) */
} run;

/* Runs steps 0 .. n_steps - 1 on m: each step's logits rows and what the
 * driver saw (first_launch: the index of its first launch), with
 * after_step (NULL: none) called after each step. */
static inline void run_steps(khub_model *m, run *out, int n_steps,
                             void (*after_step)(khub_model *m, run *out, int step))
{
    int64_t len[2] = {0, 0};
    for (int s = 0; s < n_steps; s++) {
        khub__seg segs[2];
        int32_t toks[8];
        int n = 0;
        for (int q = 0; q < step_seqs[s]; q++) {
            segs[q] = (khub__seg){.seq = q, .pos0 = len[q], .n = s == 0 ? 3 - q : 1};
            for (int64_t i = 0; i < segs[q].n; i++)
                toks[n++] = (s * 7 + q * 3 + (int)i + 1) % VOCAB;
        }
        seen a = snapshot();
        ASSERT_OK(khub__forward(m, toks, segs, step_seqs[s]));
        seen b = snapshot();
        out->step[s] = (seen){b.captures - a.captures,
                              b.instantiations - a.instantiations,
                              b.updates - a.updates,
                              b.graph_launches - a.graph_launches,
                              b.launches - a.launches,
                              b.syncs - a.syncs,
                              a.launches,
                              b.nodes - a.nodes,
                              b.htod - a.htod,
                              b.legacy_copies - a.legacy_copies};
        memcpy(out->logits[s], m->logits, (size_t)step_seqs[s] * VOCAB * sizeof(float));
        if (after_step) after_step(m, out, s);
        for (int q = 0; q < step_seqs[s]; q++) len[q] += segs[q].n;
    }
}

#endif /* KHUB_TESTS_GRAPH_STEPS_H */
