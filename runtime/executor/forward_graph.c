/*
 * forward_graph.c: the decode step of a placed model as a CUDA graph
 * (issue 19 item 3; placement.h, docs/gpu.md), what Transformers' static
 * cache + torch.compile("reduce-overhead") and llama.cpp's CUDA backend do:
 * the step's few hundred launches go to the GPU as one graph launch.
 *
 * Each decode step (one token per sequence) is captured on the model's
 * stream: forward_device.c's body (every op call of the step, the inputs
 * already uploaded and the logits read after) runs with the stream in
 * capture mode, so the launches are recorded, not run. The first capture
 * of a batch shape (the number of sequences) is instantiated; the next
 * steps of that shape differ only in kernel parameters (the cache slot
 * each K/V row goes to, the number of cached positions attention reads),
 * so their captures update the executable graph in place
 * (cuGraphExecUpdate), which costs far less than instantiating. A new
 * shape, or an update the driver refuses because the graphs differ in
 * more than parameters (a kernel that picks another function at some
 * length), instantiates again. Prefill steps, whose shapes rarely repeat,
 * run plain launches.
 *
 * The step's inputs (token ids or embedding rows, positions, a paged
 * call's arrays) go up before the capture begins, into fixed device
 * buffers: a copy captured from the host would keep that step's host
 * address. With the embedding role on the device its launch is the body's
 * first, so the graph holds it and it reads the ids just uploaded.
 *
 * Capturing every step (rather than replaying one graph with parameters
 * read from device memory) keeps the ops unaware of graphs: any CUDA
 * plugin that launches on the stream it is given is captured as it is.
 * The host still pays for each launch call at capture time; the device
 * saves the per-launch gaps. How much that is waits for a GPU
 * (tools/gpu-check.sh step 7 prints the on/off timing).
 *
 * A paged device cache (device_kv.c) takes a step's blocks before the
 * capture: reserve copies the block-table entries it changes on the
 * model's stream (ABI 1.5: the config's ctx), so they reach the device
 * table before the graph's kernels read it, outside the graph; the step's
 * int32 arrays (sequence lengths, positions) go up on that stream before
 * it too. The captured kernels read both from device memory, so a block
 * allocated mid-run is seen by the step that first writes it, whether it
 * runs as a graph or not. kv-cache-cuda's paged attention sizes its
 * split-K scratch once at the largest its plan uses, so no step grows it
 * (which would synchronise the capturing stream).
 *
 * Graphs are off (and --explain says why) when a role runs on the CPU (its
 * copies synchronise the stream mid-step, which a capture cannot hold),
 * when the device KV cache's plugin predates ABI 1.5 (it appends, and a
 * paged one reserves and releases, on the legacy default stream), when the
 * driver has no graphs, or with KHUB_CUDA_GRAPHS=0. A capture, update or
 * instantiation that fails turns them off for the model with one warning;
 * the step then runs with plain launches, so it computes the same.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda.h"
#include "executor.h"
#include "placement.h"
#include "runtime_impl.h"

/* ======================================================================== */
/* Whether graphs are used                                                  */
/* ======================================================================== */

/* The host's embedding lookup is not counted (placement.c's n_cpu): its
 * rows go up with the step's inputs, before a capture begins. */
static const char *first_cpu_role(const khub_model *m)
{
    for (int r = 0; r < KHUB__ROLE__COUNT; r++)
        if (m->place->used[r] && !m->place->cuda[r] && r != KHUB__ROLE_EMBEDDING)
            return khub__model_role_name(m, (khub__role)r);
    return "?";
}

void khub__graph_plan(khub_model *m)
{
    khub__place *pl = m->place;
    khub__graph *g = &pl->graph;
    const char *env = getenv("KHUB_CUDA_GRAPHS");
    g->on = false;
    if (env && strcmp(env, "0") == 0) {
        snprintf(g->why, sizeof g->why, "KHUB_CUDA_GRAPHS=0");
        return;
    }
    if (pl->n_cpu > 0) {
        snprintf(g->why, sizeof g->why,
                 "%d role%s on the CPU (first: %s), whose copies synchronise the stream "
                 "mid-step",
                 (int)pl->n_cpu, pl->n_cpu == 1 ? "" : "s", first_cpu_role(m));
        return;
    }
    if (pl->dheld && pl->dkv_minor < 5) {
        snprintf(g->why, sizeof g->why,
                 "the paged device KV cache %s targets ABI 1.%d: it appends, reserves and "
                 "releases blocks on the legacy default stream, which a capture cannot hold (1.5 "
                 "gives the cache the model's stream)",
                 khub_binding_name(pl->cuda[KHUB__ROLE_KV_CACHE]), (int)pl->dkv_minor);
        return;
    }
    if (pl->dcache && pl->dkv_minor < 5) {
        snprintf(g->why, sizeof g->why,
                 "the device KV cache %s targets ABI 1.%d: it appends on the legacy default "
                 "stream, which a capture cannot hold (1.5 passes the stream)",
                 khub_binding_name(pl->cuda[KHUB__ROLE_KV_CACHE]), (int)pl->dkv_minor);
        return;
    }
    khub__plugin_msg_clear();
    if (khub__cuda_graphs_check() != KHUB_STATUS_OK) {
        snprintf(g->why, sizeof g->why, "%s", khub__plugin_msg());
        return;
    }
    g->on = true;
}

void khub__graph_explain(const khub_model *m, char *buf, size_t n)
{
    const khub__graph *g = &m->place->graph;
    if (g->on)
        snprintf(buf, n,
                 "yes (decode steps: captured each step, instantiated once per batch shape, "
                 "then updated in place with cuGraphExecUpdate; prefill runs plain launches%s)",
                 m->place->dheld ? "; the paged KV cache's blocks are reserved and its block "
                                   "table copied on the model's stream before each step, "
                                   "outside the graph"
                                 : "");
    else
        snprintf(buf, n, "no (%s)", g->why);
}

/* ======================================================================== */
/* One decode step                                                          */
/* ======================================================================== */

void khub__graph_free(khub_model *m)
{
    khub__graph *g = &m->place->graph;
    khub__cuda_graph_exec_free(g->exec);
    g->exec = NULL;
    g->n_segs = 0;
}

/* A failure of the graph machinery: graphs off for this model, one
 * warning naming what failed; the caller runs the step plainly. The
 * failure's message is in khub__plugin_msg(). */
static khub_status turn_off(khub_model *m, const char *what)
{
    khub__place *pl = m->place;
    khub__graph *g = &pl->graph;
    char why[KHUB_ERROR_SIZE];
    snprintf(why, sizeof why, "%s", khub__plugin_msg());
    khub__graph_free(m);
    g->on = false;
    g->fallbacks++;
    snprintf(g->why, sizeof g->why, "turned off: %s failed: %s", what, why);
    KHUB_LOG_W(m->rt,
               "%s: cuda:%d: CUDA graphs turned off: %s failed: %s; decode steps run plain "
               "stream launches from now on",
               m->file, (int)pl->device, what, why);
    return KHUB_STATUS_OK;
}

static bool decode_step(const khub__seg *segs, int n_segs)
{
    for (int s = 0; s < n_segs; s++)
        if (segs[s].n != 1) return false;
    return true;
}

/* Captures the step's body into *graph. KHUB_STATUS_OK with a graph; a
 * CUDA status (message in khub__plugin_msg()) when the capture broke; any
 * other status when the body itself failed for a reason of its own
 * (cache full, ...): the plain pass that follows reports it. */
static khub_status capture(khub_model *m, const khub__seg *segs, int n_segs, int64_t n,
                           void **graph)
{
    khub__place *pl = m->place;
    *graph = NULL;
    khub__plugin_msg_clear();
    KHUB_FORWARD_IF_ERROR(NULL, khub__cuda_capture_begin(pl->stream));
    khub_status body = khub__forward_device_body(m, segs, n_segs, n);
    char why[KHUB_ERROR_SIZE] = "";
    if (body != KHUB_STATUS_OK) khub__copy_error(m->rt, why, sizeof why);
    khub__clear(m->rt);
    khub__plugin_msg_clear();
    khub_status st = khub__cuda_capture_end(pl->stream, graph); /* ends it in any case */
    if (body == KHUB_STATUS_OK && st == KHUB_STATUS_OK) {
        pl->graph.captures++;
        return KHUB_STATUS_OK;
    }
    khub__cuda_graph_free(*graph);
    *graph = NULL;
    if (body == KHUB_STATUS_OK) return st;
    /* The body's own error is the cause (a launch the capture refused). */
    return khub__plugin_fail(body, "%s", why);
}

/* The executable graph for this capture: the last one updated in place,
 * or a new one. */
static khub_status make_exec(khub_model *m, void *graph, int n_segs, const char **what)
{
    khub__graph *g = &m->place->graph;
    if (g->exec && g->n_segs != n_segs) khub__graph_free(m); /* another batch shape */
    if (g->exec) {
        bool reshaped = false;
        *what = "updating the decode step's graph";
        khub_status st = khub__cuda_graph_update(g->exec, graph, &reshaped);
        if (st == KHUB_STATUS_OK) {
            g->updates++;
            return st;
        }
        if (!reshaped) return st;
        khub__graph_free(m); /* more than parameters changed: instantiate anew */
    }
    *what = "instantiating the decode step's graph";
    khub__plugin_msg_clear();
    KHUB_FORWARD_IF_ERROR(NULL, khub__cuda_graph_instantiate(graph, &g->exec));
    g->instantiations++;
    g->n_segs = n_segs;
    return KHUB_STATUS_OK;
}

khub_status khub__graph_step(khub_model *m, const khub__seg *segs, int n_segs, int64_t n, bool *ran)
{
    khub__place *pl = m->place;
    khub__graph *g = &pl->graph;
    *ran = false;
    if (!g->on || !decode_step(segs, n_segs)) return KHUB_STATUS_OK;
    void *graph = NULL;
    khub_status st = capture(m, segs, n_segs, n, &graph);
    if (st != KHUB_STATUS_OK && st != KHUB_STATUS_CUDA) return KHUB_STATUS_OK; /* plain reports */
    if (st != KHUB_STATUS_OK) return turn_off(m, "capturing the decode step");
    const char *what = "";
    st = make_exec(m, graph, n_segs, &what);
    khub__cuda_graph_free(graph);
    if (st != KHUB_STATUS_OK) return turn_off(m, what);
    khub__plugin_msg_clear();
    st = khub__cuda_graph_launch(g->exec, pl->stream);
    KHUB_RETURN_IF(m->rt, st != KHUB_STATUS_OK, st,
                   "%s: cuda:%d: launching the decode step's graph (%d sequences): %s", m->file,
                   (int)pl->device, n_segs, khub__plugin_msg());
    g->launches++;
    *ran = true;
    return KHUB_STATUS_OK;
}
